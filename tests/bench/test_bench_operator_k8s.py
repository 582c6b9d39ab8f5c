"""``make bench-operator-k8s`` in small: the real operator, as two shards, against a real API server
holding 20 endpoints-mode BrokerClusters, a short steady window, its requests read from the audit
log, then an operator restart; and its stop on SIGTERM.

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

from broker_simulators.local_processes import free_port
from local_cluster.cluster import built_tools_dir
from tests.bench.support import REPO_ROOT, assert_succeeded, counts, headline, run_bench
from tests.live_processes import processes_naming

BENCH_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}

pytestmark = [pytest.mark.e2e, pytest.mark.needs("tools")]

CLUSTERS = 20


def test_bench_operator_k8s_smoke(tmp_path_factory: pytest.TempPathFactory) -> None:
    built_tools_dir()  # fails with "run `make tools`" before a control plane is tried
    work = tmp_path_factory.mktemp("bench-operator-k8s")
    run = run_bench(
        "bench_operator_k8s.py",
        *("--clusters", str(CLUSTERS), "--shards", "2", "--settle", "3", "--window", "5"),
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
    # After the window the operator is restarted and every cluster's active renewed by the new
    # process: the stand-ins report one longest gap per active broker (how long is a timing, read
    # and not judged; the bench fails if any is never renewed).
    restart = r"^  operator restart \(SIGTERM, a new process\): .* (?P<late>\d+) of (?P<n>\d+) over the "
    assert counts(run, restart)["n"] == CLUSTERS, run.explain()
    assert headline(run, "operator_k8s_idle_writes_per_s") >= 0
    assert re.search(r"^operator_k8s_idle_watch_events_per_s=\d+\.\d$", run.stdout, re.MULTILINE), (
        run.explain()
    )
    assert (work / "requests.png").stat().st_size > 0


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
    needles = (str(work), f"--standin 1 2 --port {port}", f"--standin 2 2 --port {port}")
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
