"""``make bench-operator-k8s`` in small: the real operator, as two shards, against a real API server
holding 20 endpoints-mode BrokerClusters, a short steady window, its requests read from the audit
log, then an operator restart; its scenarios (upgrade, restart, kill -9) at 3 clusters and one
shard; and its stop on SIGTERM.

Needs the Go tools (``make tools``) for etcd and the API server; without them it fails saying
so, never skips. No root, no cluster network: everything listens on loopback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import pytest

from broker_operator.core import spec_fields
from broker_simulators.local_processes import free_port
from local_cluster.cluster import built_tools_dir
from tests.bench.support import REPO_ROOT, assert_succeeded, counts, headline, run_bench
from tests.live_processes import processes_naming

BENCH_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
LEASE = float(spec_fields.LEASE.default)  # the clusters here keep the default heartbeat.leaseSeconds

pytestmark = [pytest.mark.e2e, pytest.mark.needs("tools")]

CLUSTERS = 20


def test_bench_operator_k8s_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    built_tools_dir()  # fails with "run `make tools`" before a control plane is tried
    work = tmp_path_factory.mktemp("bench-operator-k8s")
    run = run_bench(
        "bench_operator_k8s.py",
        *("--clusters", str(CLUSTERS), "--shards", "2", "--settle", "3", "--window", "5"),
        *("--scenarios", "restart", "--between", "2", "--after", "2"),
        *("--plot", str(work / "requests.png"), "--workdir", str(work / "run")),
        *("--port", str(free_port("127.1.1.1"))),
        timeout=300,
    )
    assert_succeeded(run)
    assert re.search(rf"^  {CLUSTERS}/{CLUSTERS} clusters active after \d+ s$", run.stdout, re.MULTILINE), (
        run.explain()
    )
    assert re.search(rf"^N={CLUSTERS} clusters, 2 operator shards ", run.stdout, re.MULTILINE), run.explain()
    # Read from the audit log, so attributed to the operator's ServiceAccount: each cluster's
    # generated backend token and its brokers' verifier Secret, each created once (the operator
    # remembers what it created per generation), by the one shard that drives it (a second shard
    # driving it too would try a second create).
    created = counts(run, r"^  whole run, operator writes: .*\bcreate secrets (?P<secrets>\d+)")
    assert created == {"secrets": 2 * CLUSTERS}, run.explain()
    # After the window the operator is restarted: the stand-ins report one longest gap per active
    # broker (how long is a timing, read and not judged).
    restart = r"^    longest time without a renewal per active \((?P<n>\d+)\): p50 "
    assert counts(run, restart)["n"] == CLUSTERS, run.explain()
    assert re.search(r"^operator_restart_max_renewal_gap_s=\d+\.\d\d$", run.stdout, re.MULTILINE), (
        run.explain()
    )
    assert headline(run, "operator_k8s_idle_writes_per_s") >= 0
    assert re.search(r"^operator_k8s_idle_watch_events_per_s=\d+\.\d$", run.stdout, re.MULTILINE), (
        run.explain()
    )
    assert (work / "requests.png").stat().st_size > 0


SCENARIO_CLUSTERS = 3


def test_bench_operator_k8s_scenarios_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The upgrade (a rolling replacement: a standby first, then SIGTERM to the old process), the
    restart and the kill -9, one shard, each printing its figures from the stand-ins' records. The
    figures must be there, whatever their values (timings are read, not judged)."""
    built_tools_dir()
    work = tmp_path_factory.mktemp("bench-operator-k8s-scenarios")
    run = run_bench(
        "bench_operator_k8s.py",
        *("--clusters", str(SCENARIO_CLUSTERS), "--shards", "1", "--settle", "2", "--window", "2"),
        *("--scenarios", "upgrade,restart,kill", "--between", "2", "--after", "2"),
        *("--plot", str(work / "requests.png"), "--workdir", str(work / "run")),
        *("--port", str(free_port("127.1.1.1"))),
        timeout=300,
    )
    assert_succeeded(run)
    # Each scenario in order: what was done, then what the stand-ins saw, its active brokers all
    # counted in the gaps (each has a longest time without a renewal), its leases and a histogram.
    for name in ("upgrade", "restart", "kill"):
        block = re.search(
            rf"^  operator {name}: (?P<steps>.*)\n(?P<rest>(?:    .*\n)+)", run.stdout, re.MULTILINE
        )
        assert block, run.explain()
        rest = block["rest"]
        assert re.search(
            r"^    reactivations \(.*\) \d+, failovers \d+, failbacks \d+$", rest, re.MULTILINE
        ), run.explain()
        gaps = counts(run, r"^    longest time without a renewal per active \((?P<n>\d+)\): p50 ", rest)
        assert gaps["n"] >= SCENARIO_CLUSTERS, run.explain()
        assert re.search(
            rf"^    leases: {LEASE:g} s \(leaseSeconds\), .* leases that ran out: \d+$", rest, re.MULTILINE
        ), run.explain()
        assert re.search(r"^ +\S+ s +\d+ #+$", rest, re.MULTILINE), run.explain()  # a histogram's bar
        for figure in ("reactivations", "failovers", "failbacks"):
            assert re.search(rf"^operator_{name}_{figure}=\d+$", run.stdout, re.MULTILINE), run.explain()
        assert re.search(rf"^operator_{name}_max_renewal_gap_s=\d+\.\d\d$", run.stdout, re.MULTILINE), (
            run.explain()
        )
    upgrade = re.search(r"^  operator upgrade: (.*)$", run.stdout, re.MULTILINE)
    assert upgrade and "shard 0: the new process healthy after" in upgrade[1], run.explain()
    assert headline(run, "operator_k8s_idle_writes_per_s") >= 0


def test_bench_operator_k8s_stops_everything_it_started_on_sigterm(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A CI timeout or `kill` must not leave the control plane, the operator or the stand-ins
    running: they outlived the benchmark before it unwound SIGTERM like Ctrl-C."""
    built_tools_dir()
    work = tmp_path_factory.mktemp("bench-operator-k8s-term") / "run"
    port = str(free_port("127.1.1.1"))
    argv = [sys.executable, str(REPO_ROOT / "bench" / "bench_operator_k8s.py"), "--clusters", "2"]
    argv += ["--workdir", str(work), "--port", port, "--plot", str(work / "requests.png")]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=BENCH_ENV)
    needles = (str(work), f"standin_records.py 1 2 --port {port}", f"standin_records.py 2 2 --port {port}")
    try:
        assert process.stdout is not None
        for line in process.stdout:  # bounded by the bench: it exits on any failure to start
            if line.startswith("operator started"):
                break
        assert processes_naming(*needles, environment=True), "nothing of the bench was running to be stopped"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    left = processes_naming(*needles, environment=True)
    for pid, _ in left:  # not left behind for the next test, whatever this one says
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "left running after SIGTERM:\n" + "\n".join(
        f"{pid}: {command[:160]}" for pid, command in left
    )
    assert process.returncode == 128 + signal.SIGTERM
