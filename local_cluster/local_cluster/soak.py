"""The chaos soak: faults under traffic on the sealed cluster, checked by two independent checkers.

``make soak`` (``python -m local_cluster.soak --faults 200``) and, with 32 faults, a test in
``make test``. How each fault is made and recovered from is ``soak_faults``; this module deploys,
runs the turn, measures and checks. Setup is the user's path (``local_cluster.relay``): the
chart's operator pod, the example's two brokers (failback Automatic, so failbacks add planned
switchovers to the faults), the backend and cloud simulator pods, the backend sending to the
``-active`` Service by DNS.
A feeder adds 200 msg/s outbound (4 streams x 5 per 100 ms) for the whole run.

Faults, in turn: kill -9 of the active broker, of the standby, SIGSTOP of the active (SIGCONT
once another broker took over), a real network partition of the active (nftables drops both
ways, healed after the failover) and of the standby, kill -9 of an operator container
(``make soak`` runs two operator replicas with kopf peering, so about every other operator kill
hits the replica handling the cluster and the other must take over; the short form runs one),
a ``helm upgrade`` of the release that replaces the operator's pod (``upgrade-operator``, issue
40: its CPU request changed, the rest reused, so the Deployment rolls as the chart's defaults say),
and kill -9 of kube-apiserver (the supervisor restarts it with the same flags, data and
certificates, as a static pod's kubelet would; the fault waits until ``/readyz`` is ok again).
While the API server is down the operator's watches break and its writes (the ``-active``
EndpointSlice, labels, status) fail; brokers and heartbeats go on. The next fault in turn is a
kill of the active, which only an operator whose watches and writes came back recovers from. The
restarted API server answers some requests with 403 before its RBAC cache is filled, and
kube-proxy and the controller-manager (client-go reflectors) back off before they list again:
0.8 s, doubling while restarts come less than 2 min apart, up to 30-60 s. Before issue 23 the
``-active`` Service waited for the controller-manager's EndpointSlice controller, so the fault
after a restart could take that much longer to recover from (seen: 55 s after six restarts in
100 s with ``--faults-only``); now the operator writes the slice itself, and only kube-proxy's
own back-off remains. ``--faults-only`` picks kinds of fault.

On three nodes (``--nodes 3``, the default of ``make soak``; the short form in ``make test`` runs
one) the node faults of issue 22 join the turn, before the API server's kill: a drain of the
active's node (the budget holds the eviction until the operator has handed over), a crash of
every process of that node (it boots again once the active has moved), a partition of its link
(healed after the failover), and a rolling upgrade (every node drained and uncordoned in turn,
each waiting until all is recovered). The layout (``node_faults``) keeps the simulators and
CoreDNS on ``node-1`` and the two brokers on the other two, one each; the two operator replicas go
where the chart's spread puts them, so a node fault may take the handling operator with the
active, and the other replica takes over first (kopf peering).
After each fault the soak waits until it is recovered: the cluster Healthy with an active, both
broker pods and the operators Ready, the backend's confirmed count moving again, and an operator
heartbeating brokers again (its ``broker_failover_heartbeats_total`` grew since the fault).
Each fault's line and the summary per kind give two figures (``soak_summary``): the longest pause
in the backend's confirmations (the outage traffic saw; for a kill of the active, the failover
through the ``-active`` Service) and the full recovery (which also waits for the kubelet to
restart a killed container, with its back-off); ``recovery.png`` in the report directory shows
both for every fault. The operator's two faults have a goal of no pause (the brokers are healthy;
only a lease that ran out would stop them): the summary's last line gives the normal gap between
confirmations to read their pauses against, and a line after it how many of them activated a
broker again (from the brokers' message logs: a lease that ran out, a new epoch).

At the end traffic stops, everything is confirmed both ways, the brokers close their
message-log segments, and the checkers run:

- the simulators' records (what the targets took): each stream's sequence numbers complete,
  none twice, in order, in both directions;
- the ordering validator (``broker-validator``, PySpark ``local[2]``) over the brokers' message
  logs: lost, duplicate-delivery, out-of-order, gap and split-brain (overlapping active terms).

Prints ``soak_faults=N``, ``soak_recovered=N`` and last ``soak_violations=N`` (violations of both
checkers plus faults not recovered).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_validator.report_schema import VIOLATIONS
from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.node_faults import QUIET_NODE, brokers_off_node_and_apart, move_cluster_dns
from local_cluster.relay import (
    CLUSTER_NAME,
    MESSAGE_LOG_CLAIM,
    Feeder,
    Relay,
    RelayError,
    deploy_relay,
    wait_until,
)
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster
from local_cluster.soak_faults import (
    FAULTS,
    NODE_FAULTS,
    OPERATOR_FAULTS,
    SLOW_RECOVERY_SECONDS,
    THREE_NODE_FAULTS,
    inject,
    wait_recovered,
)
from local_cluster.soak_summary import (
    ConfirmationWatch,
    FaultCost,
    activations_by_kind,
    activations_line,
    logged_activations,
    plot,
    summary_lines,
)

STREAMS = 4
PER_STREAM_PER_TICK = 5
TICK = 0.1


def validator_violations(store: Path, report_dir: Path) -> dict[str, int]:
    """Run the ordering validator over the brokers' logs; its violation counts by class."""
    result = subprocess.run(
        [
            sys.executable, "-m", "broker_validator.cli", f"--store={store}", f"--report-dir={report_dir}",
            "--full", "--master=local[2]", "--settle-seconds=0",
        ],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    report_file = report_dir / "report.json"
    if result.returncode not in (0, 1) or not report_file.exists():
        raise RelayError(
            f"the validator could not validate (exit {result.returncode}): {result.stderr[-3000:]}"
        )
    report = json.loads(report_file.read_text())
    classes = {anomaly.value for anomaly in VIOLATIONS}
    violations = {
        kind: int(count)
        for kind, count in (report.get("anomalies") or {}).items()
        if kind in classes and int(count)
    }
    if result.returncode == 1 and not violations:
        violations["validator-failed"] = 1
    return violations


def default_kinds(nodes: int) -> tuple[str, ...]:
    return THREE_NODE_FAULTS if nodes >= 3 else FAULTS


def check_kinds(kinds: Sequence[str], nodes: int) -> None:
    """Refuse an empty turn, an unknown fault, or a node fault without nodes to spare for it."""
    unknown = sorted(set(kinds) - set(THREE_NODE_FAULTS))
    if unknown or not kinds:
        raise ValueError(f"unknown faults {unknown}; known: {', '.join(THREE_NODE_FAULTS)}")
    if nodes < 3 and (needs := sorted(set(kinds) & set(NODE_FAULTS))):
        raise ValueError(
            f"{', '.join(needs)} need three nodes (a quiet one for the traffic, one per broker); "
            f"this cluster has {nodes}"
        )


@dataclass
class SoakResult:
    faults: int
    recovered: int
    records: dict[str, int]
    validator: dict[str, int]
    costs: list[FaultCost]
    # Per kind of the operator's own faults, how many activated a broker (goal 0; issue 40).
    operator_activations: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        return sum(self.records.values()) + sum(self.validator.values()) + (self.faults - self.recovered)


def deploy_soak_relay(cluster: SealedCluster, operator_replicas: int) -> Relay:
    """The relay in a namespace of its own; on several nodes, laid out so that node faults break
    the brokers' nodes, never the traffic's source and sink (``node_faults``)."""
    namespace = f"soak-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    values = {"operator.replicas": str(operator_replicas), "operator.peering": "soak"}
    apart: dict[str, Any] = {}
    if cluster.settings.nodes >= 3:  # node faults break the brokers' nodes, never the traffic's
        move_cluster_dns(cluster)
        apart = {
            "spec": {"affinity": brokers_off_node_and_apart(CLUSTER_NAME)},
            "simulators_node": QUIET_NODE,
        }
    relay = deploy_relay(
        cluster,
        namespace,
        streams=STREAMS,
        messages_per_stream=10,
        request_timeout_seconds=2,
        helm_values=values if operator_replicas > 1 else None,
        **apart,
    )
    return relay


def run_soak(
    cluster: SealedCluster,
    faults: int,
    report_dir: Path,
    say: Callable[[str], None] = print,
    *,
    operator_replicas: int = 1,
    kinds: Sequence[str] = FAULTS,
) -> SoakResult:
    check_kinds(kinds, cluster.settings.nodes)
    relay = deploy_soak_relay(cluster, operator_replicas)
    namespace = relay.namespace
    feeder = Feeder(relay, PER_STREAM_PER_TICK, TICK).start()
    relay.backend("/sim/start", {})
    watch = ConfirmationWatch(lambda: int(relay.backend("/sim/status")["confirmed"]))
    watch.start()
    recovered = 0
    costs: list[FaultCost] = []
    began = time.monotonic()
    try:
        for index in range(1, faults + 1):
            fault = kinds[(index - 1) % len(kinds)]
            started, began_at = time.monotonic(), time.time()
            try:
                note = inject(relay, fault)
                last = wait_recovered(relay)
                recovered += 1
                ended = time.monotonic()
                took = ended - started
                paused = watch.longest_pause(started, ended)  # at most took: the window is the same
                costs.append(FaultCost(fault, paused, took, began_at, time.time()))
                outcome = f"{note}traffic paused {paused:.1f}s, recovered in {took:.1f}s"
                if took > SLOW_RECOVERY_SECONDS and last:
                    outcome += f" (the last wait: {last})"
            except RelayError as error:
                outcome = f"NOT RECOVERED: {error}"
            say(f"  [{index}/{faults}] {fault:18} {outcome} ({time.monotonic() - began:.0f}s)")
    finally:
        feeder.stop.set()
        watch.stop()
    for line in summary_lines(costs, watch.normal_gap()):
        say(f"  {line}")
    if costs:
        plot(costs, report_dir / "recovery.png")
        say(f"each fault's traffic pause and full recovery: {report_dir / 'recovery.png'}")
    relay.wait_all_confirmed()
    records = relay.record_violations()
    store = cluster.claim_volume_path(namespace, MESSAGE_LOG_CLAIM)
    say("traffic stopped, all confirmed; waiting for the brokers to close their log segments (bounded)")
    try:
        wait_until("every message-log segment closed", lambda: not list(store.glob("*/*/*.open")), 120, 1)
    except RelayError as error:
        say(f"  {error}; validating what is there")
    operator_activations = activations_by_kind(costs, logged_activations(store), OPERATOR_FAULTS)
    if operator_activations:
        say(f"  {activations_line(costs, operator_activations)}")
    say("running the ordering validator over the brokers' message logs")
    validator = validator_violations(store, report_dir)
    relay.uninstall()
    return SoakResult(
        faults=faults,
        recovered=recovered,
        records=records,
        validator=validator,
        costs=costs,
        operator_activations=operator_activations,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--report-dir", type=Path, default=Path(".cache/soak/report"))
    parser.add_argument(
        "--operator-replicas",
        type=int,
        default=2,
        help="2: kopf peering; operator kills then hit the handler too",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=3,
        help="3: the node faults join the turn (issue 22); 1: a faster run of the pod faults only",
    )
    parser.add_argument(
        "--faults-only",
        type=lambda text: [kind.strip() for kind in text.split(",") if kind.strip()],
        default=None,
        metavar="KIND,...",
        help=(
            "the kinds of fault to take turns, in this order (default: all that the nodes allow: "
            f"{','.join(THREE_NODE_FAULTS)})"
        ),
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the cluster's files (default: a new directory in /tmp)"
    )
    options = parser.parse_args(argv)
    kinds = options.faults_only or default_kinds(options.nodes)
    try:
        check_kinds(kinds, options.nodes)
    except ValueError as error:
        parser.error(str(error))
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the cluster below is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = options.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"starting the sealed local cluster of {options.nodes} node(s) in {work}", flush=True)
    cluster = start_sealed_cluster(
        LocalClusterSettings(
            tools_dir=built_tools_dir(),
            workdir=work / "cluster",
            nodes=options.nodes,
            ready_timeout_seconds=270 if options.nodes > 1 else 90,
        )
    )
    try:
        result = run_soak(
            cluster,
            options.faults,
            options.report_dir.resolve(),
            lambda line: print(line, flush=True),
            operator_replicas=options.operator_replicas,
            kinds=kinds,
        )
    finally:
        cluster.stop()
    print(f"simulators' records: {json.dumps(result.records)}; validator: {json.dumps(result.validator)}")
    print(f"validator report: {options.report_dir / 'report.html'}")
    if result.violations == 0 and options.workdir is None:
        shutil.rmtree(work, ignore_errors=True)  # hundreds of MB of etcd data and logs
    else:
        print(f"the cluster's logs are kept for a look: {work / 'cluster' / 'logs'}")
    print(f"soak_faults={result.faults}")
    print(f"soak_recovered={result.recovered}")
    print(f"soak_violations={result.violations}")
    return 0 if result.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
