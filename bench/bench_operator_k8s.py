"""The real operator against a real API server holding N BrokerClusters: what it asks of Kubernetes
while nothing changes.

``bench/bench_operator.py`` runs the failover engines alone and counts what would be API writes.
This one runs the whole product path, on loopback only:

- a control plane (``local_cluster.control_plane``: etcd, kube-apiserver with an audit log,
  kube-controller-manager) and the BrokerCluster CRD;
- two heartbeat stand-in processes serving 2*N brokers (127.1.x.y, 127.2.x.y; benchmark
  scaffolding, see ``heartbeat_standin.py`` and ``standin_records.py``);
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

Then, each from a steady state, the scenarios of ``--scenarios`` (``operator_scenarios.py``): the
operator's upgrade (a rolling replacement of every process, a standby first, as the chart's
RollingUpdate with peering does it), its restart (SIGTERM, new processes) and kill -9 (new
processes). The operator peers as the chart's defaults have it (``--peering``), each shard under its
own name. The brokers' stand-ins keep each broker's lease as a broker does (``standin_records.py``:
a handover renewal extends it, a lease that ran out fences the broker) and say, per scenario, how
many brokers were activated at a new epoch, how many clusters failed over and back, each active's
longest time without a renewal (a histogram), and how many leases ran out.

Prints the figures, per scenario ``operator_<scenario>_reactivations``, ``_failovers``,
``_failbacks`` (goal 0 each) and ``_max_renewal_gap_s`` (goal below half of leaseSeconds), then
``operator_k8s_idle_watch_events_per_s`` and last the headline ``operator_k8s_idle_writes_per_s``
(goal 0; kopf's peering keep-alives, one per process every 5-10 s, are printed beside it and not
counted). A size or a scenario that does not settle is a result: it says so and the headline is
still printed. ``--plot`` (``.cache/bench/operator-k8s.png``)
draws the operator's requests per second over the whole run (creation, activation, steady).
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
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
from bench.bench_operator import stop  # noqa: E402  # the root is on the path now
from bench.heartbeat_standin import TOKEN, address  # noqa: E402
from bench.operator_processes import Operators, OperatorSample, operator_sample, samples  # noqa: E402
from bench.operator_scenarios import SCENARIOS, Figures, run_scenario, start_standins  # noqa: E402
from broker_operator.core import spec_fields  # noqa: E402
from local_cluster.cluster import ClusterAccess, KubectlError, LocalClusterSettings, built_tools_dir  # noqa: E402
from local_cluster.control_plane import ControlPlane, ControlPlaneSettings, start_control_plane  # noqa: E402
from local_cluster.pki import write_kubeconfig  # noqa: E402

NAMESPACE = "bench"
CRD = ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"
PEERING_CRDS = ROOT / "crds" / "kopf.dev_peerings.yaml"
KEEPALIVES = "patch kopfpeerings"  # the audit log's (verb, resource) of kopf's peering keep-alives
# The default heartbeat.leaseSeconds, which the clusters here keep (their specs leave it out).
LEASE_SECONDS = float(spec_fields.LEASE.default or 0.0)  # never None: the field has a default


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
            # The stand-ins speak plain HTTP, and this measures heartbeats and their API writes:
            # no certificates (in mode Operator, three Secrets and an RSA-3072 key per cluster).
            "tls": {"mode": "Disabled"},
        },
    }


def prepare(kube: Kube, plane: ControlPlane, workdir: Path, args: argparse.Namespace) -> Path:
    """CRDs, namespace, the peering objects (as the chart creates them), the operator's
    ServiceAccount and token, the shared Secret; its kubeconfig."""
    kube.run("apply", "-f", str(CRD), "-f", str(PEERING_CRDS))
    for crd in ("brokerclusters.broker.failover.dev", "kopfpeerings.kopf.dev"):
        for attempt in range(5):
            try:
                kube.run("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
                break
            except KubectlError:
                # kubectl wait fails at once ("<nil> is of the type <nil>") on a CRD whose status
                # has no conditions yet, a moment after its creation: look again.
                if attempt == 4:
                    raise
                time.sleep(0.5)
    kube.run("create", "namespace", NAMESPACE)
    if args.peering:
        names = (
            [args.peering] if args.shards == 1 else [f"{args.peering}-shard-{i}" for i in range(args.shards)]
        )
        items = [peering_object(name) for name in names]
        kube.run("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
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


def peering_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": name, "namespace": NAMESPACE},
    }


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


def measure(args: argparse.Namespace, kube: Kube, operators: Operators) -> Window:
    marks = {"operator started": time.time()}
    began = time.monotonic()
    logs = ", ".join(str(operator.process.log_path) for operator in operators.running)
    started = "operator started" if operators.shards == 1 else f"{operators.shards} operator shards started"
    print(f"{started} (log {logs}); waiting for every cluster's active", flush=True)
    try:
        took = bring_up(args, kube)
        print(
            f"all {args.clusters} clusters active after {took:.0f} s; settling {args.settle:g} s", flush=True
        )
    except RuntimeError as reason:  # a result: this size does not settle here (the figures go on)
        took = time.monotonic() - began
        print(f"N={args.clusters}: did not settle ({reason}); measuring the window anyway", flush=True)
    marks["all active"] = time.time()
    time.sleep(args.settle)
    events_before, before = watch_events(kube), operator_sample(operators)
    marks["window"] = time.time()
    time.sleep(args.window)
    events_after, after = watch_events(kube), operator_sample(operators)
    marks["window end"] = time.time()
    operators.check_alive()
    return Window(marks, took, events_after - events_before, before, after)


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
    # kopf's peering keep-alives (one patch per process every 5-10 s, with the chart's default
    # peering) are a process's, not a cluster's: printed, and left out of the headline.
    keepalives = writes.pop(KEEPALIVES, 0)
    print(f"  operator writes: {describe(writes, wall)}; peering keep-alives {keepalives / wall:.2f}/s")
    print(
        f"  operator reads and watches: {describe(steady - writes - Counter({KEEPALIVES: keepalives}), wall)}"
    )
    print(f"  watch events sent (all watchers): {describe(window.watch_events, wall)}")
    per_cluster = ramp_writes / args.clusters
    print(
        f"  to reach steady: {ramp_writes} operator writes ({per_cluster:.1f} per cluster)"
        f" in {window.took:.0f} s"
    )
    whole = in_window(requests, marks["operator started"], marks["window end"])
    print(f"  whole run, operator writes: {counts(whole, WRITES)}", flush=True)
    return Steady(sum(window.watch_events.values()) / wall, sum(writes.values()) / wall)


def scenarios(
    args: argparse.Namespace, kube: Kube, operators: Operators, standins: list[subprocess.Popen[bytes]]
) -> dict[str, Figures]:
    """Each of ``--scenarios`` from a steady state (``operator_scenarios``); stops at one that left
    the clusters unsettled (the figures so far stand)."""
    results: dict[str, Figures] = {}
    for name in args.scenarios:
        try:
            wait_all_active(kube, args.clusters, args.active_timeout)
        except RuntimeError as reason:
            print(f"  operator {name}: not run, the clusters did not settle ({reason})", flush=True)
            break
        time.sleep(args.between)
        results[name] = run_scenario(
            name, operators, standins, args.clusters, after=args.after, timeout=args.active_timeout
        )
        operators.check_alive()
    return results


def run(args: argparse.Namespace, workdir: Path) -> int:
    tools = built_tools_dir()
    print(f"control plane (etcd, kube-apiserver, kube-controller-manager) in {workdir}", flush=True)
    plane = start_control_plane(ControlPlaneSettings(tools_dir=tools, workdir=workdir / "plane"))
    operators: Operators | None = None
    standins: list[subprocess.Popen[bytes]] = []
    try:
        kube = Kube(plane, tools)
        kubeconfig = prepare(kube, plane, workdir, args)
        standins = start_standins(args.clusters, args.port, LEASE_SECONDS, args.max_lease_seconds)
        if not args.batch:
            create_clusters(kube, 0, args.clusters, args.port)
        operators = Operators(args.shards, workdir, kubeconfig, NAMESPACE, peering=args.peering or None)
        operators.start()
        window = measure(args, kube, operators)
        time.sleep(2)  # the audit log's buffered last lines
        requests = operator_requests(plane.audit_log)
        steady = report_steady(args, window, requests)
        results = scenarios(args, kube, operators, standins)
        if results:
            time.sleep(2)  # the audit log's buffered last lines
            requests = operator_requests(plane.audit_log)
        for name, result in results.items():
            writes = in_window(requests, result.began, result.began + result.took)
            print(
                f"  operator writes during the {name}, until every cluster was renewed:"
                f" {counts(writes, WRITES)}"
            )
        plot(requests, window.marks, args.plot)
        print(f"  plot: {args.plot}")
        for name, result in results.items():
            print(f"operator_{name}_reactivations={result.reactivations}")
            print(f"operator_{name}_failovers={result.failovers}")
            print(f"operator_{name}_failbacks={result.failbacks}")
            print(f"operator_{name}_max_renewal_gap_s={max(result.gaps, default=0.0):.2f}")
        print(f"operator_k8s_idle_watch_events_per_s={steady.watch_events_per_s:.1f}")
        print(f"operator_k8s_idle_writes_per_s={steady.writes_per_s:.1f}")
        return 0
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
        "--scenarios",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(SCENARIOS),
        help="after the window, in this order, each from a steady state: upgrade (a rolling"
        " replacement, maxSurge 1, peering), restart (SIGTERM, new processes), kill (kill -9, new"
        " processes); empty: none",
    )
    parser.add_argument(
        "--after",
        type=float,
        default=20.0,
        help="seconds a scenario goes on after every cluster was renewed (failbacks, cascades)",
    )
    parser.add_argument(
        "--between", type=float, default=10.0, help="seconds of steady state before each scenario"
    )
    parser.add_argument(
        "--peering",
        default="broker-operator",
        help="the chart's operator.peering (each shard peers as NAME-shard-i); empty: standalone"
        " (then no upgrade scenario: it needs a standby)",
    )
    parser.add_argument(
        "--max-lease-seconds",
        type=float,
        default=30.0,
        help="the longest lease a broker grants a handover renewal (spec.heartbeat.handoverLeaseSeconds)",
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
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown or ("upgrade" in args.scenarios and not args.peering):
        parser.error(f"--scenarios: {unknown or 'upgrade needs --peering'} (known: {', '.join(SCENARIOS)})")
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
