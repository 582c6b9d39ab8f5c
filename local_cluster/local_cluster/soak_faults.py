"""The chaos soak's faults (``local_cluster.soak``): how each is made, and when it is recovered from.

``inject`` breaks one thing under traffic, waits for what the fault must cause (a failover away
from a killed, stopped or partitioned active; the API server ready again), and undoes what needs
undoing; ``wait_recovered`` then waits until all is as before: Healthy with an active, every pod
Ready, the backend's confirmed count moving, and an operator heartbeating brokers again.

The operator's two faults (issue 40), each a way its process goes while the brokers stay healthy:

- ``kill-operator``: kill -9 of an operator container (an OOM kill, a crashed node's process);
  the kubelet restarts it, or the other replica takes over (kopf peering);
- ``upgrade-operator``: ``helm upgrade`` of the release that replaces the operator's pod (its CPU
  request changed, the rest of the values reused: ``operator_upgrade``), so the Deployment rolls
  a new ReplicaSet the way the chart's defaults say. The old process gets SIGTERM.

Neither should pause traffic: the brokers relay without the operator, and only a lease that ran
out before a renewal (a fenced active, a new epoch) would stop them. The soak reports each kind's
pause (``soak_summary``) next to the normal gap between confirmations.

Node faults (issue 22) go to ``inject_node_fault``. Nothing here judges the outcome: the soak counts
what was not recovered, and its checkers judge the records.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from local_cluster.broker_pod_calls import BrokerPodCallError, pod_call
from local_cluster.node_faults import drain, unready_nodes
from local_cluster.operator_upgrade import operator_heartbeats, operator_pods, upgrade_operator
from local_cluster.relay import CLUSTER_NAME, Relay, RelayError, wait_until

BROKERS = (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
FAULTS = (
    "kill-active",
    "partition-active",
    "kill-standby",
    "stop-active",
    "partition-standby",
    "kill-operator",
    "upgrade-operator",
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
# The faults of the operator's own process: the brokers are healthy throughout, so the goal is no
# pause in traffic and no new epoch (issue 40).
OPERATOR_FAULTS = ("kill-operator", "upgrade-operator")


def _operator_pods(relay: Relay) -> list[str]:
    names = sorted(operator_pods(relay))
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
    elif fault == "upgrade-operator":
        roll = upgrade_operator(relay)
        return (
            f"helm upgrade replaced {', '.join(sorted(roll.before))} by {', '.join(sorted(roll.after))} "
            f"in {roll.seconds:.1f}s; "
        )
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


TERM_METRICS = ("broker_active", "broker_epoch")


def broker_metrics(relay: Relay, name: str, samples: tuple[str, ...] = TERM_METRICS) -> dict[str, float]:
    """Samples of the broker's own /metrics by their full name (labels included), by default
    whether it is Active and its stored epoch; {} when it cannot be reached."""
    pod = relay.get("pod", name)
    if not ((pod or {}).get("status") or {}).get("podIP"):
        return {}
    try:
        # Over TLS when the pod serves it, verified as the operator verifies it (broker_pod_calls).
        scrape = pod_call(relay.cluster, pod, 8080, "/metrics", timeout=2)
        text = relay.cluster.call_in_network(scrape)
    except (OSError, BrokerPodCallError):
        return {}
    found = (line.rsplit(" ", 1) for line in text.splitlines() if " " in line and line[0] != "#")
    return {sample: float(value) for sample, value in found if sample in samples}


def wait_recovered(relay: Relay) -> str:
    """Healthy, every pod Ready, traffic confirmed again, an operator heartbeating brokers, and the
    active broker Active at the status's epoch by its own metrics; returns what was still missing
    at the last look before all of it held (what took longest).

    The last two matter after an operator's kill or upgrade: status stays Healthy and the brokers
    keep relaying while no operator runs, so only heartbeats made since show one is back at work;
    and a heartbeat may have found the active fenced (its lease ran out meanwhile), so the fault is
    over only once it is Active again, at the epoch the status records. Without that, the pause and
    the new epoch of such a fault fell into the next fault's window.
    """
    confirmed = int(relay.backend("/sim/status")["confirmed"])
    baseline = operator_heartbeats(relay)

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
        now = operator_heartbeats(relay)
        if not any(count > baseline.get(key, 0.0) for key, count in now.items()):
            waiting.append("an operator heartbeat")
        if status.get("active"):
            own = broker_metrics(relay, str(status["active"]))
            if own.get("broker_active") != 1 or own.get("broker_epoch") != status.get("epoch"):
                waiting.append(
                    f"{status['active']} Active at epoch {status.get('epoch')} (its metrics: {own})"
                )
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
