"""The real operator against a real API server holding N BrokerClusters: what it asks of Kubernetes
while nothing changes.

``bench/bench_operator.py`` runs the failover engines alone and counts what would be API writes.
This one runs the whole product path, on loopback only:

- a control plane (``local_cluster.control_plane``: etcd, kube-apiserver with an audit log,
  kube-controller-manager) and the BrokerCluster CRD;
- the two heartbeat stand-in processes of ``bench_operator.py`` serving 2*N brokers (127.1.x.y,
  127.2.x.y; benchmark scaffolding, see ``heartbeat_standin.py``);
- the operator as users run it (``python -m broker_operator``: kopf, every handler, the reconcile
  timer every 10 s, metrics), logged in as a ServiceAccount so that the audit log tells its
  requests from everyone else's (bound to ``cluster-admin`` here: RBAC is not what is measured);
  with ``--shards N``, N such processes, each driving its shard (``--shard i/N``, as the chart's
  ``operator.shards`` runs them), their figures summed;
- N endpoints-mode BrokerClusters (two endpoints each, the design's heartbeat defaults), one
  Secret with the stand-ins' token shared by all, the backend's token generated per cluster as
  a user's cluster gets it.

The clusters are created ``--batch`` at a time (250) once the operator runs, each batch when the
ones before it are active (``--batch 0``: all before the operator starts). Once every cluster has
``status.active``, it lets the operator settle (``--settle``), then counts over ``--window`` seconds:
- the operator's requests in the API server's audit log, by verb (writes: create, update,
  patch, delete), and over the whole run, to show what reaching steady cost;
- watch events the API server sent, by resource (``apiserver_watch_events_total``; every
  watcher's, the controller-manager's too);
- from the operator's ``/metrics``: heartbeats to actives per cluster per second, failed
  heartbeats and failovers in the window (0 when steady), and its CPU from ``/proc``.

Then (unless ``--no-restart``) it restarts the operator as a rollout does (SIGTERM, a new process)
and reads the new process's ``/metrics`` every second: for each cluster, how long from the
SIGTERM until its active answered a heartbeat of the new process, against the 5 s lease the
clusters keep (a real broker not renewed within its lease fences itself; the stand-ins do not).

Prints the figures, ``operator_k8s_idle_watch_events_per_s`` and last the headline
``operator_k8s_idle_writes_per_s`` (goal 0). ``--plot`` (``.cache/bench/operator-k8s.png``)
draws the operator's requests per second over the whole run (creation, activation, steady).
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.api_audit import WRITES, Request, counts, describe, in_window, operator_requests, plot  # noqa: E402
from bench.bench_operator import start, stop  # noqa: E402  # the root is on the path now
from bench.heartbeat_standin import TOKEN, address  # noqa: E402
from bench.operator_processes import Operators, OperatorSample, operator_metrics, operator_sample, samples  # noqa: E402
from local_cluster.cluster import ClusterAccess, KubectlError, LocalClusterSettings, built_tools_dir  # noqa: E402
from local_cluster.control_plane import ControlPlane, ControlPlaneSettings, start_control_plane  # noqa: E402
from local_cluster.pki import write_kubeconfig  # noqa: E402

NAMESPACE = "bench"
CRD = ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"
LEASE_SECONDS = 5.0  # the design's default heartbeat.leaseSeconds, which the clusters here keep


class Kube(ClusterAccess):
    """kubectl as the admin of the control plane this benchmark started (``ClusterAccess``'s)."""

    def __init__(self, plane: ControlPlane, tools_dir: Path) -> None:
        self.settings = LocalClusterSettings(tools_dir=tools_dir, workdir=plane.settings.workdir)
        self._kubeconfig = plane.admin_kubeconfig

    @property
    def kubeconfig(self) -> Path:
        return self._kubeconfig

    def run(self, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
        """kubectl's stdout; ``KubectlError`` if it failed."""
        return self.kubectl(*args, input=stdin, timeout=timeout).stdout


def cluster_manifest(index: int, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": f"c{index}", "namespace": NAMESPACE},
        "spec": {
            "account": "bench",
            "company": str(index),
            "endpoints": [
                {"name": "a", "url": f"http://{address(1, index)}:{port}/soap", "priority": 0},
                {"name": "b", "url": f"http://{address(2, index)}:{port}/soap", "priority": 1},
            ],
            "auth": {"tokenSecretRef": {"name": "standin-token"}},
        },
    }


def prepare(kube: Kube, plane: ControlPlane, workdir: Path) -> Path:
    """CRD, namespace, the operator's ServiceAccount and token, the shared Secret; its kubeconfig."""
    kube.run("apply", "-f", str(CRD))
    kube.run("wait", "--for=condition=Established", "crd/brokerclusters.broker.failover.dev", "--timeout=60s")
    kube.run("create", "namespace", NAMESPACE)
    kube.run("create", "serviceaccount", "broker-operator", "-n", NAMESPACE)
    kube.run(
        "create",
        "clusterrolebinding",
        "bench-broker-operator",
        "--clusterrole=cluster-admin",
        f"--serviceaccount={NAMESPACE}:broker-operator",
    )
    kube.run("create", "secret", "generic", "standin-token", "-n", NAMESPACE, f"--from-literal=token={TOKEN}")
    kube.run("label", "secret", "standin-token", "-n", NAMESPACE, "broker.failover.dev/credential=true")
    token = kube.run("create", "token", "broker-operator", "-n", NAMESPACE, "--duration=24h").strip()
    return write_kubeconfig(
        workdir / "operator.kubeconfig",
        server=plane.server,
        ca_cert=plane.pki.ca_cert,
        user="broker-operator",
        token=token,
    )


def create_clusters(kube: Kube, first: int, end: int, port: int) -> None:
    items = [cluster_manifest(i, port) for i in range(first, end)]
    kube.run("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    print(f"  created BrokerClusters c{first}..c{end - 1}", flush=True)


def bring_up(args: argparse.Namespace, kube: Kube) -> float:
    """Create the clusters the operator does not have yet, ``--batch`` at a time, each batch once
    the ones before it are active; the seconds until every cluster is active."""
    began = time.monotonic()
    created = 0 if args.batch else args.clusters  # --batch 0: all were created before the operator
    while True:
        if created < args.clusters:
            end = min(args.clusters, created + args.batch)
            create_clusters(kube, created, end, args.port)
            created = end
        wait_all_active(kube, created, args.active_timeout)
        if created == args.clusters:
            return time.monotonic() - began


def count_active(kube: Kube) -> int:
    # The API server's Table (the CRD's printer columns), not the objects: a JSON list of every
    # cluster every few seconds cost the API server more than the operator's own requests.
    rows = kube.run("get", "brokerclusters", "-n", NAMESPACE, "--no-headers").splitlines()
    return sum(1 for row in rows if len(row.split()) > 4 and row.split()[4] != "<none>")  # Active


def wait_all_active(kube: Kube, count: int, timeout: float) -> float:
    began = time.monotonic()
    reported = -1
    while True:
        try:
            active = count_active(kube)
        except KubectlError as error:  # a LIST timed out while the API server was swamped
            print(f"  ({error}; trying again)", flush=True)
            active = reported
        waited = time.monotonic() - began
        if active != reported:
            print(f"  {active}/{count} clusters active after {waited:.0f} s", flush=True)
            reported = active
        if active == count:
            return waited
        if waited > timeout:
            raise RuntimeError(f"only {active} of {count} clusters became active within {timeout:.0f} s")
        time.sleep(min(10.0, 1.0 + waited / 5))  # a list of N clusters is not free for the API server


def watch_events(kube: Kube) -> Counter[str]:
    totals: Counter[str] = Counter()
    for labels, value in samples(kube.run("get", "--raw", "/metrics"), "apiserver_watch_events_total"):
        totals[labels.get("resource") or labels.get("kind") or "?"] += int(value)
    return totals


@dataclass(frozen=True)
class Window:
    """What was sampled around the steady window; ``marks`` are wall-clock times for the audit log."""

    marks: dict[str, float]
    took: float  # seconds from the operator's start until every cluster was active
    watch_events: Counter[str]
    before: OperatorSample
    after: OperatorSample


def start_standins(clusters: int, port: int) -> list[subprocess.Popen[bytes]]:
    standins = [start(["--standin", str(group), str(clusters), "--port", str(port)]) for group in (1, 2)]
    for standin in standins:
        assert standin.stdout is not None
        if standin.stdout.readline().strip() != b"ready":
            raise RuntimeError("a heartbeat stand-in did not start")
    return standins


def measure(args: argparse.Namespace, kube: Kube, operators: Operators) -> Window:
    marks = {"operator started": time.time()}
    logs = ", ".join(str(operator.process.log_path) for operator in operators.running)
    started = "operator started" if operators.shards == 1 else f"{operators.shards} operator shards started"
    print(f"{started} (log {logs}); waiting for every cluster's active", flush=True)
    took = bring_up(args, kube)
    marks["all active"] = time.time()
    print(f"all {args.clusters} clusters active after {took:.0f} s; settling {args.settle:g} s", flush=True)
    time.sleep(args.settle)
    events_before, before = watch_events(kube), operator_sample(operators)
    marks["window"] = time.time()
    time.sleep(args.window)
    events_after, after = watch_events(kube), operator_sample(operators)
    marks["window end"] = time.time()
    operators.check_alive()
    return Window(marks, took, events_after - events_before, before, after)


@dataclass(frozen=True)
class Restart:
    seen: list[float]  # per cluster: SIGTERM to the new process's first renewal, in its /metrics
    gaps: list[float]  # per active broker: its longest time without a renewal, as the stand-ins saw it


def report_restart(
    args: argparse.Namespace, restart: Restart, requests: list[Request], marks: dict[str, float]
) -> None:
    gaps = restart.gaps
    late = sum(1 for seconds in gaps if seconds > LEASE_SECONDS)
    print(
        f"  operator restart (SIGTERM, a new process): the longest time each active went without a"
        f" renewal: p50 {gaps[len(gaps) // 2]:.1f} s, p99 {gaps[int(0.99 * (len(gaps) - 1))]:.1f} s,"
        f" max {gaps[-1]:.1f} s; {late} of {len(gaps)} over the {LEASE_SECONDS:g} s lease"
        " (a real broker would have fenced itself and been activated again)"
    )
    if len(restart.seen) == args.clusters:
        print(f"  the new process's /metrics showed every cluster renewed within {restart.seen[-1]:.1f} s")
    else:
        print(
            f"  the new process's /metrics showed only {len(restart.seen)} of {args.clusters} clusters"
            f" renewed within {args.active_timeout:g} s"
        )
    writes = in_window(requests, marks["restart"], marks["all renewed"])
    print(f"  operator writes until then: {counts(writes, WRITES)}")


@dataclass(frozen=True)
class Steady:
    """The steady window's two headlines, printed last."""

    watch_events_per_s: float
    writes_per_s: float


def report_steady(args: argparse.Namespace, window: Window, requests: list[Request]) -> Steady:
    """The steady window and what reaching it cost, printed before the restart (which may not end
    well with many clusters, and must not take these figures with it)."""
    marks, before, after = window.marks, window.before, window.after
    wall = after.at - before.at
    steady = in_window(requests, marks["window"], marks["window end"])
    writes = Counter({what: n for what, n in steady.items() if what.split()[0] in WRITES})
    ramp = in_window(requests, marks["operator started"], marks["all active"])
    ramp_writes = sum(n for what, n in ramp.items() if what.split()[0] in WRITES)
    active_beats = after.heartbeats["active"] - before.heartbeats["active"]
    shards = f", {args.shards} operator shards (figures summed)" if args.shards > 1 else ""
    print(
        f"N={args.clusters} clusters{shards}, steady window {wall:.0f} s after {args.settle:g} s of settling:"
    )
    print(
        f"  heartbeats to actives {active_beats / wall / args.clusters:.2f}/s per cluster,"
        f" failed {after.failures - before.failures:.0f},"
        f" failovers {after.failovers - before.failovers:.0f},"
        f" operator cpu {(after.cpu_seconds - before.cpu_seconds) / wall:.2f} cores"
    )
    print(f"  operator writes: {describe(writes, wall)}")
    print(f"  operator reads and watches: {describe(steady - writes, wall)}")
    print(f"  watch events sent (all watchers): {describe(window.watch_events, wall)}")
    per_cluster = ramp_writes / args.clusters
    print(
        f"  to reach steady: {ramp_writes} operator writes ({per_cluster:.1f} per cluster)"
        f" in {window.took:.0f} s"
    )
    whole = in_window(requests, marks["operator started"], marks["window end"])
    print(f"  whole run, operator writes: {counts(whole, WRITES)}", flush=True)
    return Steady(sum(window.watch_events.values()) / wall, sum(writes.values()) / wall)


ACTIVE_HEARTBEATS = re.compile(
    r'^broker_failover_heartbeats_total\{cluster="([^"]+)",outcome="active"\}', re.M
)


def restart(operators: Operators, marks: dict[str, float]) -> None:
    """Stop the operator (every shard) with SIGTERM, as a rollout does, and start new ones."""
    marks["restart"] = time.time()
    operators.stop(grace_seconds=30)
    operators.start(generation="-restarted")
    print(
        f"operator restarted ({time.time() - marks['restart']:.1f} s to stop the old one);"
        " waiting for renewals"
    )


def longest_gaps(standins: list[subprocess.Popen[bytes]]) -> list[float]:
    """Per active broker, the longest time without an accepted renewal since the last call, as the
    stand-ins saw it (``heartbeat_standin.Renewals``), sorted."""
    gaps: list[float] = []
    for standin in standins:
        assert standin.stdout is not None
        os.kill(standin.pid, signal.SIGUSR1)
        gaps += json.loads(standin.stdout.readline())["longest_gaps"]
    return sorted(gaps)


def wait_renewed(args: argparse.Namespace, operators: Operators, marks: dict[str, float]) -> list[float]:
    """For each cluster, the seconds from the restart's SIGTERM until the new process's first heartbeat
    that its active answered, read from the new process's /metrics."""
    renewed: dict[str, float] = {}
    while len(renewed) < args.clusters and time.time() - marks["restart"] < args.active_timeout:
        time.sleep(1.0)  # each read renders every cluster's series: not free for the operator
        for operator in operators.running:
            with contextlib.suppress(OSError):  # not listening yet
                for cluster in ACTIVE_HEARTBEATS.findall(operator_metrics(operator.metrics_port)):
                    renewed.setdefault(cluster, time.time() - marks["restart"])
    marks["all renewed"] = time.time()
    return sorted(renewed.values())


def run(args: argparse.Namespace, workdir: Path) -> int:
    tools = built_tools_dir()
    print(f"control plane (etcd, kube-apiserver, kube-controller-manager) in {workdir}", flush=True)
    plane = start_control_plane(ControlPlaneSettings(tools_dir=tools, workdir=workdir / "plane"))
    operators: Operators | None = None
    standins: list[subprocess.Popen[bytes]] = []
    try:
        kube = Kube(plane, tools)
        kubeconfig = prepare(kube, plane, workdir)
        standins = start_standins(args.clusters, args.port)
        if not args.batch:
            create_clusters(kube, 0, args.clusters, args.port)
        operators = Operators(args.shards, workdir, kubeconfig, NAMESPACE)
        operators.start()
        window = measure(args, kube, operators)
        time.sleep(2)  # the audit log's buffered last lines
        requests = operator_requests(plane.audit_log)
        steady = report_steady(args, window, requests)
        all_renewed = True
        if args.restart:
            longest_gaps(standins)  # starts the stand-ins' count over
            restart(operators, window.marks)
            seen = wait_renewed(args, operators, window.marks)
            time.sleep(2)  # every renewal the new process made is in the stand-ins' count
            restarted = Restart(seen, longest_gaps(standins))
            time.sleep(2)  # the audit log's buffered last lines
            requests = operator_requests(plane.audit_log)
            report_restart(args, restarted, requests, window.marks)
            all_renewed = len(seen) == args.clusters
        plot(requests, window.marks, args.plot)
        print(f"  plot: {args.plot}")
        print(f"operator_k8s_idle_watch_events_per_s={steady.watch_events_per_s:.1f}")
        print(f"operator_k8s_idle_writes_per_s={steady.writes_per_s:.1f}")
        return 0 if all_renewed else 1
    finally:
        if operators is not None:
            operators.stop()
        for standin in standins:
            stop(standin)
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument(
        "--batch",
        type=int,
        default=250,
        help="clusters created at a time once the operator runs, each batch once the ones before it"
        " are active (0: all of them before the operator starts, so that it starts with N at once)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="operator processes, each driving its shard of the clusters (--shard i/N), as the"
        " chart's operator.shards runs them",
    )
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after every cluster is active")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--active-timeout", type=float, default=900.0)
    parser.add_argument(
        "--no-restart",
        dest="restart",
        action="store_false",
        help="skip the operator restart after the window (how long until every active is renewed)",
    )
    parser.add_argument(
        "--port", type=int, default=18090, help="the stand-ins' port on each 127.1/127.2 address"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=ROOT / ".cache" / "bench" / "operator-k8s.png",
        help="PNG of the operator's requests per second over the run",
    )
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary directory)")
    args = parser.parse_args()
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the control plane, the operator and
    # the stand-ins are stopped (without it they outlived the benchmark).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="bench-operator-k8s-") as workdir:
        return run(args, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
