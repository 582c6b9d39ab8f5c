"""What replacing the operator's processes does to the brokers' leases, read at the brokers.

``bench_operator_k8s.py`` runs these after its steady window, each from a steady state (every
cluster active, the stand-ins' counts started over), on every shard:

- ``upgrade``: a rolling replacement, as a Deployment's RollingUpdate with ``maxSurge: 1``,
  ``maxUnavailable: 0`` and peering does it: for each shard in turn, a new process (a new pod, so
  a new ``POD_ID``) starts as a peering standby of the shard's peering name; once its ``/healthz``
  answers (the chart's startup probe), the old one gets SIGTERM; the next shard once it exited;
- ``restart``: SIGTERM to every process, then new ones (``Recreate``, a plain restart);
- ``kill``: kill -9 of every process (an OOM kill), then new ones under the same ``POD_ID`` (the
  kubelet restarting the container in its pod).

A scenario ends when every cluster's active answered a heartbeat of the new processes (their
``/metrics``), plus ``after`` seconds for what follows a lapse (a failback, a cascade). Then the
stand-ins (``standin_records.py``) say, per cluster, what its brokers went through: activations at
a new epoch (goal 0), changes of the active broker (failovers to the priority-1 broker, failbacks
to the priority-0 one; goal 0), each active's longest time without a renewal (a handover renewal
counts; goal below half the lease), and each lease that ran out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.operator_processes import Operators, operator_metrics

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("upgrade", "restart", "kill")
GRACE_SECONDS = 30.0  # a pod's default terminationGracePeriodSeconds
HEALTHY_TIMEOUT_SECONDS = 120.0  # the chart's startup probe allows 90 s
ACTIVE_HEARTBEATS = re.compile(
    # prometheus_client writes label names sorted: brokercluster, brokercluster_namespace, outcome.
    r'^broker_failover_heartbeats_total\{brokercluster="([^"]+)",brokercluster_namespace="[^"]*",'
    r'outcome="active"\}',
    re.M,
)
HISTOGRAM_EDGES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0)


def start_standins(clusters: int, port: int, lease: float, max_lease: float) -> list[subprocess.Popen[bytes]]:
    """The two recording stand-ins (priority-0 brokers, priority-1 brokers), ready."""
    standins = []
    for group in (1, 2):
        argv = [sys.executable, str(ROOT / "bench" / "standin_records.py"), str(group), str(clusters)]
        argv += [
            "--port",
            str(port),
            "--lease-seconds",
            f"{lease:g}",
            "--max-lease-seconds",
            f"{max_lease:g}",
        ]
        standins.append(subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, cwd=ROOT))
    for standin in standins:
        assert standin.stdout is not None
        if standin.stdout.readline().strip() != b"ready":
            raise RuntimeError("a heartbeat stand-in did not start")
    return standins


def read_records(standins: Sequence[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    """Each stand-in's records since the last read (``LeaseRecords.report``); their counts start over."""
    records = []
    for standin in standins:
        assert standin.stdout is not None
        os.kill(standin.pid, signal.SIGUSR1)
        records.append(json.loads(standin.stdout.readline()))
    return records


@dataclass(frozen=True)
class Figures:
    """One scenario, from the stand-ins' records."""

    name: str
    clusters: int
    began: float  # wall clock: the first signal (or start)
    took: float  # seconds from the first signal until every cluster was renewed by a new process (or gave up)
    renewed: int  # clusters whose active answered a new process
    steps: list[str]  # what happened when, for the log
    reactivations: int
    failovers: int
    failbacks: int
    gaps: list[float]  # per active broker, its longest time without a renewal, sorted
    lapsed: int  # brokers whose lease ran out
    lapsed_clusters: list[int]
    not_handed_over: list[int]  # clusters active at the start whose active got no handover renewal
    leases: Counter[str]
    renewals: int
    handover_renewals: int
    lease_seconds: float
    max_lease_seconds: float


def figures(
    name: str,
    clusters: int,
    timing: tuple[float, float, int],
    steps: list[str],
    records: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> Figures:
    """A scenario's figures from the records read at its start (who was active) and at its end;
    ``timing``: when it began (wall clock), how long until every cluster was renewed, how many were."""
    start, end = records
    active = {index: 1 for index in range(clusters)}  # the priority-0 brokers, unless a record says otherwise
    for record in start:
        for index in record["held"]:
            active[index] = record["group"]
    moves = sorted(
        (at, index, record["group"]) for record in end for index, _, at, _ in record["activations"]
    )
    failovers = failbacks = 0
    for _, index, group in moves:
        if group != active.get(index):
            failovers += group != 1
            failbacks += group == 1
            active[index] = group
    leases: Counter[str] = Counter()
    for record in end:
        leases.update(record["leases"])
    began, took, renewed = timing
    return Figures(
        name=name,
        clusters=clusters,
        began=began,
        took=took,
        renewed=renewed,
        steps=steps,
        reactivations=sum(1 for record in end for *_, new in record["activations"] if new),
        failovers=failovers,
        failbacks=failbacks,
        gaps=sorted(gap for record in end for gap in record["longest_gaps"].values()),
        lapsed=sum(len(record["lapsed"]) for record in end),
        lapsed_clusters=sorted({int(index) for record in end for index in record["lapsed"]}),
        not_handed_over=sorted(
            set(range(clusters)) - {index for record in end for index in record["handed_over"]}
        ),
        leases=leases,
        renewals=sum(record["renewals"] for record in end),
        handover_renewals=sum(record["handover_renewals"] for record in end),
        lease_seconds=end[0]["lease_seconds"],
        max_lease_seconds=end[0]["max_lease_seconds"],
    )


def percentile(values: list[float], fraction: float) -> float:
    return values[int(fraction * (len(values) - 1))] if values else 0.0


def histogram(values: list[float], width: int = 40) -> list[str]:
    """A text histogram of ``values`` (seconds): one line per bin from the first bin holding any to
    the last, ``#`` scaled to the largest bin."""
    edges = [0.0, *HISTOGRAM_EDGES, float("inf")]
    rows = [(low, high, sum(1 for v in values if low <= v < high)) for low, high in itertools.pairwise(edges)]
    used = [i for i, (_, _, count) in enumerate(rows) if count]
    if not used:
        return ["    (none)"]
    top = max(count for _, _, count in rows)
    lines = []
    for low, high, count in rows[used[0] : used[-1] + 1]:
        label = f"{low:g}-{high:g} s" if high != float("inf") else f">= {low:g} s"
        bar = "#" * max(1 if count else 0, round(width * count / top))
        lines.append(f"    {label:>12} {count:6d} {bar}".rstrip())
    return lines


def names(indices: list[int], shown: int = 10) -> str:
    """Cluster names (``c<i>``), the first ``shown`` of them."""
    listed = ", ".join(f"c{index}" for index in indices[:shown])
    return f"({listed}{', ...' if len(indices) > shown else ''})" if indices else ""


def report(result: Figures) -> None:
    gaps, lease = result.gaps, result.lease_seconds
    done = (
        f"every cluster renewed by the new processes within {result.took:.1f} s"
        if result.renewed == result.clusters
        else f"did not settle: {result.renewed} of {result.clusters} clusters renewed by the new processes"
        f" within {result.took:.0f} s"
    )
    print(f"  operator {result.name}: {'; '.join(result.steps)}; {done}")
    print(
        f"    reactivations (an activation at a new epoch) {result.reactivations},"
        f" failovers {result.failovers}, failbacks {result.failbacks}"
    )
    print(
        f"    longest time without a renewal per active ({len(gaps)}): p50 {percentile(gaps, 0.5):.2f} s,"
        f" p99 {percentile(gaps, 0.99):.2f} s, max {max(gaps, default=0.0):.2f} s"
        f" (goal below {lease / 2:g} s, half the {lease:g} s lease)"
    )
    leases = ", ".join(f"{what} {n}" for what, n in sorted(result.leases.items())) or "none"
    print(
        f"    leases: {lease:g} s (leaseSeconds), handover at most {result.max_lease_seconds:g} s;"
        f" renewals {result.renewals}, of them handover renewals {result.handover_renewals};"
        f" requested (s): {leases}; leases that ran out: {result.lapsed}"
    )
    if result.lapsed_clusters:
        print(f"    clusters whose active's lease ran out: {names(result.lapsed_clusters)}")
    if result.handover_renewals:
        print(
            f"    clusters whose active got no handover renewal: {len(result.not_handed_over)}"
            f" {names(result.not_handed_over)}".rstrip()
        )
    print("    the longest time without a renewal, per active:")
    for line in histogram(gaps):
        print(line)


def wait_renewed(operators: Operators, clusters: int, since: float, timeout: float) -> int:
    """Until every cluster's active answered a heartbeat of the processes now running (their
    /metrics count from their start) or ``timeout`` seconds from ``since``; how many did."""
    renewed: set[str] = set()
    while len(renewed) < clusters and time.time() - since < timeout:
        time.sleep(1.0)  # each read renders every cluster's series: not free for the operator
        for operator in operators.running:
            with contextlib.suppress(OSError):  # not listening yet
                renewed.update(ACTIVE_HEARTBEATS.findall(operator_metrics(operator.metrics_port)))
    return len(renewed)


def upgrade(operators: Operators, generation: str) -> list[str]:
    """The rolling replacement (module docstring), shard after shard."""
    steps = []
    began = time.monotonic()
    for old in sorted(operators.running, key=lambda operator: operator.shard):
        new = operators.start_shard(old.shard, generation)
        operators.running.append(new)
        healthy = operators.wait_healthy(new, HEALTHY_TIMEOUT_SECONDS)
        exited = operators.terminate(old, GRACE_SECONDS)
        steps.append(
            f"shard {old.shard}: the new process healthy after {healthy:.1f} s,"
            f" the old one exited {exited:.1f} s after its SIGTERM"
        )
    steps.append(f"{time.monotonic() - began:.1f} s in all")
    return steps


def restart(operators: Operators, generation: str) -> list[str]:
    """SIGTERM to every process at once, then new ones."""
    began = time.monotonic()
    operators.stop(grace_seconds=GRACE_SECONDS)
    stopped = time.monotonic() - began
    operators.start(generation)
    return [f"SIGTERM to {operators.shards} process(es), {stopped:.1f} s until they exited, then new ones"]


def kill(operators: Operators, generation: str) -> list[str]:
    """kill -9 of every process, then new ones under the same POD_IDs (a restarted container)."""
    for operator in operators.kill():
        operators.running.append(operators.start_shard(operator.shard, generation, pod=operator.pod))
    return [f"kill -9 of {operators.shards} process(es), new ones at once under the same POD_ID"]


REPLACE: dict[str, Callable[[Operators, str], list[str]]] = {
    "upgrade": upgrade,
    "restart": restart,
    "kill": kill,
}


def run_scenario(
    name: str,
    operators: Operators,
    standins: Sequence[subprocess.Popen[bytes]],
    clusters: int,
    *,
    after: float,
    timeout: float,
) -> Figures:
    """One scenario from a steady state: its figures, printed."""
    start = read_records(standins)  # who holds a lease now; the counts start over
    since = time.time()
    steps = REPLACE[name](operators, f"-{name}")
    renewed = wait_renewed(operators, clusters, since, timeout)
    took = time.time() - since
    time.sleep(after)
    result = figures(name, clusters, (since, took, renewed), steps, (start, read_records(standins)))
    report(result)
    return result
