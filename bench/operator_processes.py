"""The operator processes a benchmark runs against a real API server, and what they report.

One process, or one per shard (``--shard i/N``, as the chart's ``operator.shards`` runs them), each
with its own log and its ``/metrics`` on loopback; their heartbeat counters and CPU are summed.
Used by ``bench_operator_k8s.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker_simulators.local_processes import free_port
from local_cluster.processes import ManagedProcess, kill_process_group

ROOT = Path(__file__).resolve().parent.parent
PEERING_LIFETIME_SECONDS = 15  # the chart's OPERATOR_PEERING_LIFETIME_SECONDS


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                yield sample.labels, sample.value


@dataclass(frozen=True)
class OperatorSample:
    at: float
    cpu_seconds: float
    heartbeats: Counter[str]  # by outcome, all clusters
    failures: float
    failovers: float


def operator_metrics(port: int) -> str:
    """The operator's own /metrics page, on loopback."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return str(response.read().decode())


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def operator_sample(operators: Operators) -> OperatorSample:
    """The sums over every operator process (each shard's own /metrics and CPU)."""
    heartbeats: Counter[str] = Counter()
    failures = failovers = cpu = 0.0
    for operator in operators.running:
        text = operator_metrics(operator.metrics_port)
        for labels, value in samples(text, "broker_failover_heartbeats_total"):
            heartbeats[labels["outcome"]] += int(value)
        failures += sum(v for _, v in samples(text, "broker_failover_heartbeat_failures_total"))
        failovers += sum(v for _, v in samples(text, "broker_failover_failovers_total"))
        cpu += cpu_seconds(operator.process.popen.pid)
    return OperatorSample(
        at=time.monotonic(), cpu_seconds=cpu, heartbeats=heartbeats, failures=failures, failovers=failovers
    )


@dataclass(frozen=True)
class RunningOperator:
    process: ManagedProcess
    metrics_port: int
    health_port: int
    shard: int
    pod: str  # its POD_ID with peering (kopf's identity), else ""


class Operators:
    """The operator processes: one, or one per shard (``--shards N``: ``--shard i/N`` each, as the
    chart's ``operator.shards`` runs them), each with its own log and metrics port on loopback;
    with ``peering``, each shard peers under the chart's name for it (the peering objects are the
    caller's to create), so that a second process of a shard can start as a standby."""

    def __init__(
        self, shards: int, workdir: Path, kubeconfig: Path, namespace: str, peering: str | None = None
    ) -> None:
        self.shards = shards
        self.peering = peering
        self.namespace = namespace
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.running: list[RunningOperator] = []

    def log(self, shard: int, generation: str) -> Path:
        suffix = "" if self.shards == 1 else f"-{shard}"
        return self.workdir / f"operator{generation}{suffix}.log"

    def peering_name(self, shard: int) -> str | None:
        """Shard i's kopf peering name, as the chart names it (``<peering>-shard-<i>`` when sharded)."""
        if self.peering is None:
            return None
        return self.peering if self.shards == 1 else f"{self.peering}-shard-{shard}"

    def start(self, generation: str = "") -> None:
        """Every shard's process, as the chart runs them."""
        for shard in range(self.shards):
            self.running.append(self.start_shard(shard, generation))

    def start_shard(self, shard: int, generation: str, pod: str | None = None) -> RunningOperator:
        """``python -m broker_operator`` as the chart runs it, one namespace, metrics and ``/healthz``
        on loopback; with peering, the chart's peering name, lifetime and ``POD_ID`` (``pod``: the
        pod's name, by default one of this generation's; the same name is a restarted container)."""
        port, health = free_port("127.0.0.1"), free_port("127.0.0.1")
        argv = [
            sys.executable,
            "-m",
            "broker_operator",
            "--namespace",
            self.namespace,
            "--operator-id",
            "bench",
        ]
        argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(port)]
        argv += ["--liveness", f"http://127.0.0.1:{health}/healthz"]
        if self.shards > 1:
            argv += ["--shard", f"{shard}/{self.shards}"]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        name = self.peering_name(shard)
        if name is not None:
            argv += ["--peering", name, "--peering-lifetime-seconds", str(PEERING_LIFETIME_SECONDS)]
            env["POD_ID"] = pod or f"broker-operator-{shard}{generation}"
        process = ManagedProcess(
            f"broker-operator-{shard}", argv, log_path=self.log(shard, generation), env=env, cwd=ROOT
        )
        return RunningOperator(process, port, health, shard, env.get("POD_ID", ""))

    def wait_healthy(self, operator: RunningOperator, timeout: float) -> float:
        """Seconds until its ``/healthz`` answers (kopf serves it once its startup handlers are done:
        what a Deployment's startup probe waits for before it stops an old pod); raises past
        ``timeout`` or if the process exits."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if operator.process.popen.poll() is not None:
                raise RuntimeError(f"an operator exited; see {operator.process.log_path}")
            url = f"http://127.0.0.1:{operator.health_port}/healthz"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5):
                return time.monotonic() - began
            time.sleep(0.2)
        raise RuntimeError(f"no /healthz within {timeout:g} s; see {operator.process.log_path}")

    def terminate(self, operator: RunningOperator, grace_seconds: float) -> float:
        """SIGTERM to one process (its pod deleted); the seconds until it exited (SIGKILL after
        ``grace_seconds``, as the kubelet does). It leaves ``running``."""
        began = time.monotonic()
        kill_process_group(operator.process.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            operator.process.popen.wait(timeout=grace_seconds)
        took = time.monotonic() - began
        operator.process.stop(grace_seconds=0)
        self.running = [other for other in self.running if other is not operator]
        return took

    def kill(self) -> list[RunningOperator]:
        """kill -9 of every process (an OOM kill, a node crash); the ones killed."""
        killed = list(self.running)
        for operator in killed:
            kill_process_group(operator.process.popen.pid, signal.SIGKILL)
        for operator in killed:
            operator.process.stop(grace_seconds=0)
        self.running = []
        return killed

    def stop(self, grace_seconds: float = 10) -> None:
        """SIGTERM to every process at once (a rollout stops them together), SIGKILL to any still
        running after ``grace_seconds``."""
        deadline = time.monotonic() + grace_seconds
        for operator in self.running:
            kill_process_group(operator.process.popen.pid, signal.SIGTERM)
        for operator in self.running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            operator.process.stop(grace_seconds=0)  # reaps it, and kills what it left in its group
        self.running = []

    def check_alive(self) -> None:
        for operator in self.running:
            code = operator.process.popen.poll()
            if code is not None:
                raise RuntimeError(f"an operator exited ({code}); see {operator.process.log_path}")
