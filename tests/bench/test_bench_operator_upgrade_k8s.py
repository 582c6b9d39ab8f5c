"""``make bench-operator-upgrade-k8s`` in small: one round of each kind (a ``helm upgrade`` of the
operator, a kill -9 of it, a standby started and stopped, a helm upgrade changing nothing) under
traffic on the sealed local cluster, the chart's defaults and the example's heartbeat, through the
real ``orders-active`` Service; then the simulators' records.

Needs what tests/e2e needs (root, ``make tools``, ``make images``); without them it fails saying
so, never skips. The figures are read, never judged; what is judged is that the upgrade replaced
the operator's pod and the controls ran, all three moving nothing (no activation, no
deactivation, no new epoch: issue 40), that the kill -9 round ran (whether its lease held is a
figure of the machine's speed), and that nothing was lost.
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
        *("--upgrades", "1", "--kills", "1", "--standbys", "1", "--noops", "1"),
        *("--steady", "3", "--settle", "2", "--workdir", str(work / "run")),
        timeout=600,
    )
    assert_succeeded(run)
    assert headline(run, "operator_upgrade_max_pause_s") > 0
    moved_nothing = (
        r"activations (?P<activations>\d+), deactivations (?P<deactivations>\d+); "
        r"(?P<epoch>epoch \d+ kept|NEW EPOCH \d+ -> \d+)$"
    )
    seconds = r"[\d.]+ s; "
    pause = r"longest pause in confirmed traffic \d+ ms \(steady window before it: \d+ ms\); "
    # The rounds' lines, in turn: a new operator pod for the old one, the killed one back, the standby.
    upgrade = re.search(
        rf"^\[1/4\] helm upgrade (?P<old>\S+) -> (?P<new>\S+): old pod gone after {seconds}"
        rf"{pause}{moved_nothing}",
        run.stdout,
        re.MULTILINE,
    )
    assert upgrade, run.explain()
    assert upgrade["old"] != upgrade["new"], run.explain()
    kill = rf"^\[2/4\] kill -9 (?P<pod>\S+): heartbeating again after {seconds}{pause}"
    assert re.search(kill, run.stdout, re.MULTILINE), run.explain()
    standby = re.search(
        rf"^\[3/4\] standby (?P<pod>\S+): gone after {seconds}{pause}{moved_nothing}",
        run.stdout,
        re.MULTILINE,
    )
    assert standby, run.explain()
    noop = re.search(
        rf"^\[4/4\] helm upgrade with no value changed: done after {seconds}{pause}{moved_nothing}",
        run.stdout,
        re.MULTILINE,
    )
    assert noop, run.explain()
    for found in (upgrade, standby, noop):
        moved = (found["activations"], found["deactivations"], found["epoch"].startswith("epoch"))
        assert moved == ("0", "0", True), run.explain()
    # Their timelines: confirmations drawn, each act and its end marked.
    rows = re.findall(r"^    confirmed \[([ |]{100})\]\n +\[([-hksonxAD]{100})\]", run.stdout, re.MULTILINE)
    assert len(rows) == 4 and all("|" in traffic for traffic, _ in rows), run.explain()
    acts = [sorted({"h", "k", "s", "o"} & set(marks)) for _, marks in rows]
    assert acts == [["h"], ["k"], ["s"], ["o"]], run.explain()
    assert all("x" in marks for _, marks in rows), run.explain()
    for kind in ("upgrade", "standby", "noop"):
        assert counts(run, rf"^operator_{kind}_reactivations=(?P<n>\d+)$") == {"n": 0}, run.explain()
        assert counts(run, rf"^operator_{kind}_new_epochs=(?P<n>\d+)$") == {"n": 0}, run.explain()
    for kind in ("upgrade", "kill", "standby", "noop"):
        assert re.search(rf"^operator_{kind}_pause_ratio=\d+\.\d\d$", run.stdout, re.MULTILINE), run.explain()
    assert re.search(r"^operator_upgrade_vs_controls_pause=\d+\.\d\d$", run.stdout, re.MULTILINE), (
        run.explain()
    )
    records = r"^lost (?P<lost>\d+), twice (?P<twice>\d+), out of order (?P<misordered>\d+)$"
    assert counts(run, records) == {"lost": 0, "twice": 0, "misordered": 0}, run.explain()
