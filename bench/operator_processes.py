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


class Operators:
    """The operator processes: one, or one per shard (``--shards N``: ``--shard i/N`` each, as the
    chart's ``operator.shards`` runs them), each with its own log and metrics port on loopback."""

    def __init__(self, shards: int, workdir: Path, kubeconfig: Path, namespace: str) -> None:
        self.shards = shards
        self.namespace = namespace
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.running: list[RunningOperator] = []

    def log(self, shard: int, generation: str) -> Path:
        suffix = "" if self.shards == 1 else f"-{shard}"
        return self.workdir / f"operator{generation}{suffix}.log"

    def start(self, generation: str = "") -> None:
        """``python -m broker_operator`` as the chart runs it, one namespace, metrics on loopback."""
        for shard in range(self.shards):
            port = free_port("127.0.0.1")
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
            if self.shards > 1:
                argv += ["--shard", f"{shard}/{self.shards}"]
            process = ManagedProcess(
                f"broker-operator-{shard}",
                argv,
                log_path=self.log(shard, generation),
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"},
                cwd=ROOT,
            )
            self.running.append(RunningOperator(process, port))

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
