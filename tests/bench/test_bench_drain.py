"""``make bench-drain`` in small: one drain of the active broker's node on three real nodes.

Needs what tests/e2e needs (root, ``make tools``, ``make images``); without them it fails saying
so, never skips.
"""

from __future__ import annotations

import pytest

from tests.bench.support import assert_succeeded, counts, headline, run_bench

# Its own cluster of three nodes, beside the other tests in make test (tests/conftest.py).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.needs("cluster"),
    pytest.mark.second_stream,
]


def test_bench_drain_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("bench-drain")
    run = run_bench("bench_drain.py", "--drains", "1", "--workdir", str(work / "run"), timeout=600)
    assert_succeeded(run)
    assert headline(run, "drain_switchover_gap_p99_ms") > 0
    # The drain moved the active by a planned switchover (reason NodeDrain), not a failover.
    moved = r"^\[1/1\] drain of node-\d: orders-(?P<old>\d) -> orders-(?P<new>\d) \(NodeDrain\), drain \d"
    assert len(set(counts(run, moved).values())) == 2, run.explain()
    # Where the gap went: the slice seen and the first accepted bundle, after the old's last.
    hops = r"switchover gap \d+ ms \(slice (?P<slice>[+-]\d+), kube-proxy ([+-]\d+|\?), accepted \+\d+ ms\)$"
    assert counts(run, hops), run.explain()
    # The same switchover in the brokers' own message logs: the traffic gap holds the time with no
    # active broker (last accepted <= deactivated, activated <= first accepted).
    logged = r"^  drain 1 in the message logs: traffic (?P<traffic>\d+) ms, no active broker (?P<idle>\d+) ms"
    found = counts(run, logged)
    assert 0 < found["idle"] <= found["traffic"], run.explain()
    assert counts(run, r"^drain_traffic_gap_p99_ms=(?P<traffic>\d+)$") == {"traffic": found["traffic"]}
    assert headline(run, "drain_switchover_gap_p99_ms") == found["idle"]  # the time with no active broker
    records = r"^lost (?P<lost>\d+), twice (?P<twice>\d+), out of order (?P<misordered>\d+)$"
    assert counts(run, records) == {"lost": 0, "twice": 0, "misordered": 0}, run.explain()
