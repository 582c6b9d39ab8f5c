"""``make bench-operator-upgrade-k8s`` in small: one ``helm upgrade`` of the operator under traffic
on the sealed local cluster, the chart's defaults and the example's heartbeat, through the real
``orders-active`` Service; then the simulators' records.

Needs what tests/e2e needs (root, ``make tools``, ``make images``); without them it fails saying
so, never skips. The figures are read, never judged; what is judged is that the upgrade replaced
the operator's pod, moved nothing (no activation, no deactivation, no new epoch: issue 40) and lost
nothing.
"""

from __future__ import annotations

import re

import pytest

from local_cluster.cluster import built_tools_dir
from tests.bench.support import assert_succeeded, counts, headline, run_bench

pytestmark = [pytest.mark.e2e, pytest.mark.needs("cluster"), pytest.mark.second_stream]  # its own cluster


def test_bench_operator_upgrade_k8s_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    built_tools_dir()  # fails with "run `make tools`" before a cluster is tried
    work = tmp_path_factory.mktemp("bench-upgrade-k8s")
    run = run_bench(
        "bench_operator_upgrade_k8s.py",
        *("--upgrades", "1", "--steady", "3", "--settle", "2", "--workdir", str(work / "run")),
        timeout=480,
    )
    assert_succeeded(run)
    assert headline(run, "operator_upgrade_max_pause_s") > 0
    # The round's line: a new operator pod for the old one, and the upgrade moved nothing.
    line = (
        r"^\[1/1\] helm upgrade (?P<old>\S+) -> (?P<new>\S+): old pod gone after [\d.]+ s; longest pause "
        r"in confirmed traffic \d+ ms \(steady window before it: \d+ ms\); activations (?P<activations>\d+), "
        r"deactivations (?P<deactivations>\d+); (?P<epoch>epoch \d+ kept|NEW EPOCH \d+ -> \d+)$"
    )
    found = re.search(line, run.stdout, re.MULTILINE)
    assert found, run.explain()
    assert found["old"] != found["new"], run.explain()
    moved = (found["activations"], found["deactivations"], found["epoch"].startswith("epoch"))
    assert moved == ("0", "0", True), run.explain()
    # Its timeline: confirmations drawn, the upgrade and the old pod's end marked.
    rows = re.findall(r"^    confirmed \[([ |]{100})\]\n +\[([-hnxAD]{100})\]", run.stdout, re.MULTILINE)
    assert len(rows) == 1 and "|" in rows[0][0] and {"h", "x"} <= set(rows[0][1]), run.explain()
    assert counts(run, r"^operator_upgrade_reactivations=(?P<n>\d+)$") == {"n": 0}, run.explain()
    assert counts(run, r"^operator_upgrade_new_epochs=(?P<n>\d+)$") == {"n": 0}, run.explain()
    assert re.search(r"^operator_upgrade_pause_ratio=\d+\.\d\d$", run.stdout, re.MULTILINE), run.explain()
    records = r"^lost (?P<lost>\d+), twice (?P<twice>\d+), out of order (?P<misordered>\d+)$"
    assert counts(run, records) == {"lost": 0, "twice": 0, "misordered": 0}, run.explain()
