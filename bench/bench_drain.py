"""``kubectl drain`` of the active broker's node, over and over, under traffic, on three real nodes.

Setup (``local_cluster.relay``): the sealed cluster with three nodes (a kubelet, containerd and
kube-proxy each), the chart's operator and the simulators on ``node-1``, three brokers spread by
the operator's default anti-affinity, their journals on the ``shared-path`` class (one directory
every node reaches, as network storage would be, so an evicted broker starts again on another
node), failback Manual; the backend sends to ``https://orders-active.<ns>.svc:8080``, fed 200 msg/s
(4 streams x 1 message per 20 ms), with connects given up after 30 ms and fast failures
retried every 20 ms (``FAST_RETRYING_CLIENT``, as in bench-failover-k8s).

Each drain cordons the active's node and evicts its broker pods (``--pod-selector``: the operator
and the simulators stay). The ``<name>-active`` PodDisruptionBudget refuses the active's eviction
(429, kubectl retries) until the operator has switched over to a standby on another node (reason
``NodeDrain``), then the eviction goes through and the drain completes. The node is uncordoned
and the next drain waits for all three brokers Ready. Measured per drain:

- the drain command's own duration (``drain_seconds``);
- the switchover's gap: from the old active's last accepted bundle to the new active's first,
  read at the end from the brokers' own message logs (their ``accepted`` records' timestamps;
  the nodes share the machine's clock), and the time with no active broker in it (the old
  one's ``deactivated`` to the new one's ``activated``: the operator's part). A bundle arrives
  about every 20 ms at this rate, so the traffic gap carries up to that. Also, as before, the
  same traffic gap polled from outside (each broker's ``broker_messages_accepted_total`` every
  25 ms inside the cluster's network), which carries up to a poll at each end, and the hops of
  each drain on that time line;
- at the end, from the simulators' records: messages lost, delivered twice, out of order (any of
  them: exit status 1).

Prints one line per drain, p50 and p99 of each figure, ``drain_traffic_gap_p99_ms=N``, and last
``drain_switchover_gap_p99_ms=N``: the time with no active broker, as issue 22 defines the gap
(until 2026-11-27 this name carried the polled traffic gap, the only figure there was then, and
an upper bound of it).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from broker_contracts.message_log import Event, MessageLogError, decode, parse_ts
from local_cluster.broker_pod_calls import pod_context
from local_cluster.cluster import REPO_ROOT, LocalClusterSettings, built_tools_dir
from local_cluster.local_path_storage import SHARED_CLASS
from local_cluster.node_faults import QUIET_NODE, drain
from local_cluster.relay import (
    CLUSTER_NAME,
    FAST_RETRYING_CLIENT,
    MESSAGE_LOG_CLAIM,
    Feeder,
    Relay,
    deploy_relay,
    wait_until,
)
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster

sys.path.insert(0, str(REPO_ROOT))  # for the bench package, as bench_broker does
from bench.service_observations import (  # the root is on the path now
    Observations,
    kube_proxy_sync,
    now_ms,
    percentile,
    poll_broker,
    poll_kube_proxy,
    watch_cluster,
)

STREAMS = 4
# 200 msg/s as one message per stream every 20 ms, not five every 100 ms: the gap is measured
# between bundles, so it carries up to one tick of waiting for the next bundle to exist.
PER_STREAM_PER_TICK = 1
TICK = 0.02
BROKERS = tuple(f"{CLUSTER_NAME}-{index}" for index in range(3))
BROKER_PODS = "app.kubernetes.io/name=broker"
MOVABLE_JOURNALS = {"size": "1Gi", "storageClassName": SHARED_CLASS}


def last_growth(obs: Observations, name: str, since: float) -> float | None:
    """When the poll last saw ``name``'s accepted counter grow after ``since``."""
    with obs.lock:
        series = [(t, v) for t, v in obs.accepted.get(name, []) if t >= since]
    grew = [t for (t, v), (_, before) in zip(series[1:], series, strict=False) if v > before]
    return grew[-1] if grew else None


def switchover_gap_ms(obs: Observations, last_old: float | None, new: str) -> float | None:
    """From the old active's last growth (``last_growth``) to the new active's first growth after it."""
    if last_old is None:
        return None
    with obs.lock:
        new_series = list(obs.accepted.get(new, []))
    before = [v for t, v in new_series if t <= last_old]
    baseline = before[-1] if before else 0.0
    first_new = next((t for t, v in new_series if t > last_old and v > baseline), None)
    return None if first_new is None else first_new - last_old


@dataclass
class Switchover:
    old: str
    new: str
    since: float  # wall ms, just before the drain began


def _logged_events(store: Path) -> dict[tuple[str, str], list[float]]:
    """Every broker's ``accepted``, ``activated`` and ``deactivated`` record in the message-log
    store (closed and open segments: lines go out whole, one write per event-loop iteration), as
    wall ms by (broker, event), sorted."""
    wanted = {Event.ACCEPTED.value, Event.ACTIVATED.value, Event.DEACTIVATED.value}
    events: dict[tuple[str, str], list[float]] = {}
    for segment in sorted(store.glob("*/*/*.jsonl*")):
        for line in segment.read_text(encoding="utf-8").splitlines():
            try:
                record = decode(line)
            except MessageLogError:
                continue  # a torn last line of an open segment
            if record["event"] in wanted:
                at = parse_ts(record["ts"]).timestamp() * 1000.0
                events.setdefault((record["broker"], record["event"]), []).append(at)
    return {key: sorted(times) for key, times in events.items()}


def logged_gaps(events: dict[tuple[str, str], list[float]], move: Switchover) -> tuple[float, float] | None:
    """From the brokers' own message logs: the traffic gap (the old active's last accepted bundle
    to the new active's first) and the time with no active broker (the old one's ``deactivated``
    to the new one's ``activated``), in ms; None if a record is missing."""
    activated = next((t for t in events.get((move.new, Event.ACTIVATED.value), []) if t >= move.since), None)
    if activated is None:
        return None
    first_new = next((t for t in events.get((move.new, Event.ACCEPTED.value), []) if t >= activated), None)
    last_old = max(
        (t for t in events.get((move.old, Event.ACCEPTED.value), []) if t < activated), default=None
    )
    deactivated = max(
        (t for t in events.get((move.old, Event.DEACTIVATED.value), []) if move.since <= t <= activated),
        default=None,
    )
    if first_new is None or last_old is None or deactivated is None:
        return None
    return first_new - last_old, activated - deactivated


def _hops(
    relay: Relay, obs: Observations, new: str, since: float, *, last_old: float | None, gap: float | None
) -> str:
    """Where the gap went, in ms after the old active's last accepted bundle: the slice seen naming
    the new pod (this process's watch), kube-proxy's sync on the backend's node after it (its own
    timestamp), the new active's first accepted bundle."""
    new_ip = relay.pod(new)["status"].get("podIP")
    if last_old is None or not new_ip:
        return "hops n/a"
    slice_at = obs.first(obs.slices, since, lambda addresses: addresses == (new_ip,))
    synced = kube_proxy_sync(obs, slice_at) if slice_at is not None else None

    def shown(at: float | None) -> str:
        return "?" if at is None else f"{at - last_old:+.0f}"

    accepted = None if gap is None else last_old + gap
    return f"slice {shown(slice_at)}, kube-proxy {shown(synced)}, accepted {shown(accepted)} ms"


def _node_of(relay: Relay, pod: str) -> str:
    return str(relay.pod(pod)["spec"].get("nodeName", ""))


def _all_ready(relay: Relay) -> bool:
    return all(relay.pod_ready(name) for name in BROKERS) and relay.status().get("phase") == "Healthy"


def run_drain(
    relay: Relay, obs: Observations, index: int, total: int
) -> tuple[float, float | None, Switchover]:
    cluster = relay.cluster
    old = str(relay.status()["active"])
    node = _node_of(relay, old)
    stop = threading.Event()
    for name in BROKERS:  # the pods' addresses change as they are evicted and re-created
        pod = relay.pod(name)
        ip, context = pod["status"]["podIP"], pod_context(cluster, pod)
        threading.Thread(
            target=cluster.call_in_network,
            args=(functools.partial(poll_broker, obs, name, ip, stop, context), 3600),
            daemon=True,
        ).start()
    time.sleep(0.5)  # a few samples before the drain
    since = now_ms()
    try:
        drained, seconds = drain(cluster, node, BROKER_PODS)
        if drained.returncode != 0:
            raise RuntimeError(f"kubectl drain {node} failed:\n{drained.stdout}\n{drained.stderr}")
        wait_until(
            "the switchover recorded", lambda: relay.status().get("lastFailover", {}).get("from") == old, 30
        )
        new = str(relay.status()["active"])
        time.sleep(1.0)  # the new active's first bundles, for the poll to see
        last_old = last_growth(obs, old, since)
        gap = switchover_gap_ms(obs, last_old, new)
        hops = _hops(relay, obs, new, since, last_old=last_old, gap=gap)
    finally:
        stop.set()
        cluster.kubectl("uncordon", node, check=False)
    reason = relay.status().get("lastFailover", {}).get("reason")
    shown = "n/a" if gap is None else f"{gap:.0f} ms"
    print(
        f"[{index}/{total}] drain of {node}: {old} -> {new} ({reason}), drain {seconds:.1f} s, "
        f"switchover gap {shown} ({hops})",
        flush=True,
    )
    wait_until("every broker Ready again", lambda: _all_ready(relay), 240, 0.5)
    return seconds, gap, Switchover(old, new, since)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--drains", type=int, default=10)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the cluster's files (default: a new directory in /tmp)"
    )
    options = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = options.workdir or Path(tempfile.mkdtemp(prefix="bench-drain-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"starting the sealed local cluster of three nodes in {work}", flush=True)
    cluster: SealedCluster = start_sealed_cluster(
        LocalClusterSettings(
            tools_dir=built_tools_dir(), workdir=work / "cluster", nodes=3, ready_timeout_seconds=270
        )
    )
    obs = Observations()
    durations: list[float] = []
    gaps: list[float] = []
    moves: list[Switchover] = []
    try:
        namespace = f"bench-drain-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", namespace)
        relay = deploy_relay(
            cluster,
            namespace,
            streams=STREAMS,
            messages_per_stream=10,
            client=FAST_RETRYING_CLIENT,
            helm_values={"operator.nodeSelector.kubernetes\\.io/hostname": QUIET_NODE},
            spec={
                "replicas": 3,
                "failback": "Manual",
                "storage": {"size": "1Gi", "storageClassName": SHARED_CLASS},
            },
            simulators_node=QUIET_NODE,
        )
        # The slice through the API server; kube-proxy's syncs on the simulators' node (its
        # metrics listen on that node's loopback).
        watch_cluster(obs, cluster.api_client(), namespace)
        threading.Thread(
            target=cluster.node(QUIET_NODE).call_in_network,
            args=(functools.partial(poll_kube_proxy, obs), 24 * 3600),
            daemon=True,
        ).start()
        Feeder(relay, PER_STREAM_PER_TICK, TICK, stop=obs.stop).start()
        relay.backend("/sim/start", {})
        wait_until("every broker Ready", lambda: _all_ready(relay), 240, 0.5)
        for index in range(1, options.drains + 1):
            seconds, gap, move = run_drain(relay, obs, index, options.drains)
            durations.append(seconds)
            moves.append(move)
            if gap is not None:
                gaps.append(gap)
        obs.stop.set()
        relay.wait_all_confirmed()
        records = relay.record_violations()
        events = _logged_events(cluster.claim_volume_path(namespace, MESSAGE_LOG_CLAIM))
    finally:
        obs.stop.set()
        cluster.stop()
    gap_p99 = report(durations, gaps, [logged_gaps(events, move) for move in moves], records)
    passed = sum(records.values()) == 0 and gap_p99 >= 0
    if passed and options.workdir is None:
        shutil.rmtree(work, ignore_errors=True)  # etcd data and logs, a GB or more
    elif not passed:
        print(f"the cluster's logs are kept for a look: {work / 'cluster' / 'logs'}", file=sys.stderr)
    print(f"drain_switchover_gap_p99_ms={gap_p99}")
    return 0 if passed else 1


def report(
    durations: list[float],
    polled: list[float],
    logged: list[tuple[float, float] | None],
    records: dict[str, int],
) -> int:
    """Print the figures; the headline gap's p99 (-1 when a drain has none).

    Both from the brokers' message logs, their own timestamps (one clock: the nodes share the
    machine's): the headline, the time with no active broker (``deactivated`` to ``activated``,
    the operator's part), and the traffic gap around it, which adds the Service's path and the
    client's next try. The polled traffic gap carries up to a 25 ms poll at each end."""
    print(
        f"drain_seconds: p50 {statistics.median(durations):.1f} p99 {percentile(durations, 0.99):.1f} "
        f"over {len(durations)} drains"
    )
    for index, gap in enumerate(logged, start=1):
        shown = "n/a" if gap is None else f"traffic {gap[0]:.0f} ms, no active broker {gap[1]:.0f} ms"
        print(f"  drain {index} in the message logs: {shown}")
    found = [gap for gap in logged if gap is not None]
    for name, values in (
        ("traffic gap, message logs", [traffic for traffic, _ in found]),
        ("no active broker, message logs", [idle for _, idle in found]),
        ("traffic gap, polled every 25 ms", polled),
    ):
        if values:
            print(f"{name}, ms: p50 {statistics.median(values):.0f} p99 {percentile(values, 0.99):.0f}")
    print(f"lost {records['lost']}, twice {records['twice']}, out of order {records['out-of-order']}")
    print(f"drain_seconds_p99={percentile(durations, 0.99):.1f}")
    if len(found) != len(logged):
        return -1
    print(f"drain_traffic_gap_p99_ms={round(percentile([traffic for traffic, _ in found], 0.99))}")
    return round(percentile([idle for _, idle in found], 0.99))


if __name__ == "__main__":
    sys.exit(main())
