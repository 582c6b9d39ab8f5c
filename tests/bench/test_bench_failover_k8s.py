"""``make bench-failover-k8s`` in small: one kill -9 of the active broker on the sealed local
cluster, through the real ``orders-active`` Service, then the simulators' records per round.

Needs what tests/e2e needs: root (the cluster's own network and mount namespaces) and the Go
tools (``make tools``); without them it fails saying so, never skips.
"""

from __future__ import annotations

import pytest

from local_cluster.cluster import built_tools_dir
from tests.bench.support import assert_succeeded, counts, headline, run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.needs("cluster"), pytest.mark.second_stream]  # its own cluster


def test_bench_failover_k8s_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    built_tools_dir()  # fails with "run `make tools`" before a cluster is tried
    work = tmp_path_factory.mktemp("bench-k8s")
    run = run_bench(
        "bench_failover_k8s.py",
        *("--crash-rounds", "1", "--partition-rounds", "0"),
        *("--plot", str(work / "failover-k8s.png"), "--workdir", str(work / "run")),
        timeout=480,
    )
    assert_succeeded(run)
    assert headline(run, "k8s_crash_failover_p99_ms") > 0
    assert (work / "failover-k8s.png").stat().st_size > 0
    # The summary line of the crash rounds (each round's own line goes on after a ';').
    records = r"lost (?P<lost>\d+), twice (?P<twice>\d+), out of order (?P<misordered>\d+)$"
    assert counts(run, records) == {"lost": 0, "twice": 0, "misordered": 0}, run.explain()
    # The pods' start on the node, as the kubelet logged it: the operator, simulators and brokers.
    starts = counts(
        run, r"pod start on the node .*, (?P<pods>\d+) pods\): p50 (?P<p50>\d+) ms, p99 (?P<p99>\d+) ms"
    )
    assert starts["pods"] >= 5 and 0 < starts["p50"] <= starts["p99"], run.explain()
