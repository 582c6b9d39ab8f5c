"""The chaos soak: faults under traffic on the sealed cluster, checked by two independent checkers.

``make soak`` (``python -m local_cluster.soak --faults 200``) and, with 30 faults, a test in
``make test``. Setup is the user's path (``local_cluster.relay``): the chart's operator pod, the
example's two brokers (failback Automatic, so failbacks add planned switchovers to the faults),
the backend and cloud simulator pods, the backend sending to the ``-active`` Service by DNS.
A feeder adds 200 msg/s outbound (4 streams x 5 per 100 ms) for the whole run.

Faults, in turn: kill -9 of the active broker, of the standby, SIGSTOP of the active (SIGCONT
once another broker took over), a real network partition of the active (nftables drops both
ways, healed after the failover) and of the standby, kill -9 of an operator container
(``make soak`` runs two operator replicas with kopf peering, so about every other operator kill
hits the replica handling the cluster and the other must take over; the short form runs one),
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
both for every fault.

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
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_validator.report_schema import VIOLATIONS
from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.node_faults import (
    QUIET_NODE,
    brokers_off_node_and_apart,
    drain,
    move_cluster_dns,
    unready_nodes,
)
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
from local_cluster.soak_summary import ConfirmationWatch, FaultCost, plot, summary_lines

STREAMS = 4
PER_STREAM_PER_TICK = 5
TICK = 0.1
BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
FAULTS = (
    "kill-active",
    "partition-active",
    "kill-standby",
    "stop-active",
    "partition-standby",
    "kill-operator",
    "restart-apiserver",  # last: the kill of the active that follows needs a working operator
)
# On three nodes (``--nodes 3``, what ``make soak`` runs), issue 22's node faults join the turn,
# each on the active's node: a ``kubectl drain`` (the planned hand-over, then the eviction), a
# crash of every process of the node (then it boots again), a partition of its link (healed after
# the failover); and a rolling upgrade: every node drained and uncordoned in turn.
NODE_FAULTS = ("drain-node", "crash-node", "partition-node", "rolling-upgrade")
THREE_NODE_FAULTS = (*FAULTS[:-1], *NODE_FAULTS, FAULTS[-1])
RECOVERY_SECONDS = 120.0
SLOW_RECOVERY_SECONDS = 20.0  # a recovery slower than this says what it waited for last


def _operator_pods(relay: Relay) -> list[str]:
    pods = relay.get("pods", "-l", "app.kubernetes.io/component=operator") or {}
    names = sorted(str(item["metadata"]["name"]) for item in pods.get("items") or [])
    if not names:
        raise RelayError("no operator pod")
    return names


def _failed_over(relay: Relay, away_from: str) -> Callable[[], bool]:
    return lambda: relay.status().get("active") not in (None, away_from)


def _active_broker(relay: Relay) -> str:
    """The active broker the status names. Two operator replicas that started at the same instant
    both run until kopf's peering pauses one (the epochs keep them from granting one epoch twice),
    and meanwhile the status can name no active for a moment: wait for one, bounded, and say so."""
    started = time.monotonic()
    named: list[str] = []  # the active of the read that named one: a second read may not

    def names_one() -> bool:
        active = relay.status().get("active")
        if active:
            named.append(str(active))
        return bool(active)

    wait_until("an active broker in the status", names_one, 60, 0.1)
    waited = time.monotonic() - started
    if waited > 1:
        print(f"  (the status named no active broker for {waited:.1f}s before this fault)", flush=True)
    return named[-1]


def _until_failed_over(relay: Relay, active: str, what: str, undo: Callable[[], object]) -> None:
    """Wait (bounded) for a failover away from ``active`` (the ``what``), then undo the fault,
    whether or not it came."""
    try:
        wait_until(f"a failover away from the {what}", _failed_over(relay, active), 60, 0.1)
    finally:
        undo()


def _drain_and_uncordon(relay: Relay, node: str) -> float:
    """``kubectl drain`` of ``node`` (the brokers' and operators' pods), then uncordon it; the
    drain's duration. A drain that fails is the fault not recovered from."""
    try:
        drained, seconds = drain(relay.cluster, node)
    finally:
        relay.cluster.kubectl("uncordon", node, check=False)
    if drained.returncode != 0:
        raise RelayError(f"kubectl drain {node} failed: {drained.stderr.strip()[-500:]}")
    return seconds


def inject_node_fault(relay: Relay, fault: str, active: str) -> str:
    """A node fault of issue 22, on the active broker's node (the rolling upgrade: every node)."""
    cluster = relay.cluster
    node = cluster.node(str(relay.pod(active)["spec"]["nodeName"]))
    if fault == "drain-node":
        seconds = _drain_and_uncordon(relay, node.name)
        # The budget lets the active go only once the operator has handed over.
        wait_until("the switchover off the drained node", _failed_over(relay, active), 60, 0.1)
        return f"drain of {node.name} took {seconds:.1f}s; "
    if fault == "rolling-upgrade":
        took = []
        for each in cluster.nodes:
            took.append(f"{each.name} {_drain_and_uncordon(relay, each.name):.1f}s")
            wait_recovered(relay)  # as an upgrade waits for the node's workloads before the next
        return f"drained in turn: {', '.join(took)}; "
    if fault == "crash-node":
        node.crash()
        _until_failed_over(relay, active, "crashed node", lambda: cluster.restart_node(node.name))
        return f"{node.name} crashed and booted again; "
    if fault == "partition-node":
        node.partition()
        _until_failed_over(relay, active, "partitioned node", node.heal)
        return f"{node.name} cut off until the failover; "
    raise ValueError(f"unknown fault {fault!r}")


def inject(relay: Relay, fault: str) -> str:
    """Break something, wait for what the fault must cause, and undo what needs undoing; a note."""
    active = _active_broker(relay)
    if fault in NODE_FAULTS:
        return inject_node_fault(relay, fault, active)
    standby = next(name for name in BROKERS if name != active)
    if fault == "restart-apiserver":
        killed = relay.cluster.kill_apiserver()
        # ControlPlaneStartError (not RelayError) when it does not come back: the soak cannot go on.
        down = relay.cluster.wait_apiserver_ready(killed, timeout=RECOVERY_SECONDS)
        return f"API server ready again {down:.1f}s after the kill; "
    if fault == "kill-active":
        relay.kill_9(active)
        wait_until("a failover after kill -9 of the active", _failed_over(relay, active), 60, 0.1)
    elif fault == "kill-standby":
        relay.kill_9(standby)
    elif fault == "kill-operator":
        # With two replicas, the one handling the cluster is the older one (kopf peering
        # priority); picking either at random kills the handler about every other time.
        victim = random.choice(_operator_pods(relay))
        relay.kill_9(victim)
    elif fault == "stop-active":
        frozen = relay.pod(active)
        relay.cluster.signal_container(frozen, "SIGSTOP")
        _until_failed_over(
            relay, active, "stopped active", lambda: relay.cluster.signal_container(frozen, "SIGCONT")
        )
    elif fault in ("partition-active", "partition-standby"):
        victim = active if fault == "partition-active" else standby
        cut_off = relay.pod(victim)
        relay.cluster.partition_pod(cut_off, "both")
        try:
            if victim == active:
                wait_until(
                    "a failover away from the partitioned active", _failed_over(relay, active), 60, 0.1
                )
            else:
                time.sleep(3)  # long enough for missed probes of the standby
        finally:
            relay.cluster.heal_pod(cut_off)
    else:
        raise ValueError(f"unknown fault {fault!r}")
    return ""


def _operator_heartbeats(relay: Relay) -> dict[str, float]:
    """Heartbeats each operator container made so far (its /metrics), by pod uid and restart count."""
    counts = {}
    for name in _operator_pods(relay):
        pod = relay.pod(name)
        ip = pod["status"].get("podIP")
        restarts = (pod["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0)
        key = f"{pod['metadata']['uid']}/{restarts}"

        def scrape(address: str = str(ip)) -> str:
            with urllib.request.urlopen(f"http://{address}:9090/metrics", timeout=2) as reply:
                return str(reply.read().decode())

        try:
            text = relay.cluster.call_in_network(scrape)
        except OSError:
            continue
        counts[key] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("broker_failover_heartbeats_total{")
        )
    return counts


def wait_recovered(relay: Relay) -> str:
    """Healthy, every pod Ready, traffic confirmed again, and an operator heartbeating brokers;
    returns what was still missing at the last look before all of it held (what took longest).

    The last one matters after an operator kill: status stays Healthy and the brokers keep
    relaying while no operator runs, so only heartbeats made since show one is back at work.
    """
    confirmed = int(relay.backend("/sim/status")["confirmed"])
    baseline = _operator_heartbeats(relay)

    def missing() -> list[str]:
        status = relay.status()
        waiting = []
        if status.get("phase") != "Healthy" or not status.get("active"):
            waiting.append(f"status {status.get('phase')}, active {status.get('active')}")
        unready = [pod for pod in (*BROKERS, *_operator_pods(relay)) if not relay.pod_ready(pod)]
        if unready:
            waiting.append(f"{', '.join(unready)} Ready")
        if int(relay.backend("/sim/status")["confirmed"]) <= confirmed:
            waiting.append("a new confirmation")
        now = _operator_heartbeats(relay)
        if not any(count > baseline.get(key, 0.0) for key, count in now.items()):
            waiting.append("an operator heartbeat")
        if relay.cluster.settings.nodes > 1 and (nodes := unready_nodes(relay.cluster)):
            waiting.append(f"{', '.join(nodes)} Ready and schedulable")
        return waiting

    seen: list[list[str]] = [[]]

    def recovered() -> bool:
        waiting = missing()
        if waiting:
            seen[0] = waiting
        return not waiting

    try:
        what = "recovery: Healthy, every pod Ready, traffic confirmed again"
        wait_until(what, recovered, RECOVERY_SECONDS, 0.25)
    except RelayError as error:
        raise RelayError(f"{error}; still waiting for {'; '.join(seen[0])}") from None
    return "; ".join(seen[0])


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
            started = time.monotonic()
            try:
                note = inject(relay, fault)
                last = wait_recovered(relay)
                recovered += 1
                ended = time.monotonic()
                took = ended - started
                paused = watch.longest_pause(started, ended)  # at most took: the window is the same
                costs.append(FaultCost(fault, paused, took))
                outcome = f"{note}traffic paused {paused:.1f}s, recovered in {took:.1f}s"
                if took > SLOW_RECOVERY_SECONDS and last:
                    outcome += f" (the last wait: {last})"
            except RelayError as error:
                outcome = f"NOT RECOVERED: {error}"
            say(f"  [{index}/{faults}] {fault:18} {outcome} ({time.monotonic() - began:.0f}s)")
    finally:
        feeder.stop.set()
        watch.stop()
    for line in summary_lines(costs):
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
    say("running the ordering validator over the brokers' message logs")
    validator = validator_violations(store, report_dir)
    relay.uninstall()
    return SoakResult(faults=faults, recovered=recovered, records=records, validator=validator, costs=costs)


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
