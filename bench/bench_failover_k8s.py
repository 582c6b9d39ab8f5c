"""Failover through the real ``-active`` Service on the sealed local cluster: kill -9 and partitions.

Setup (``local_cluster.relay``): the sealed cluster (real API server, controller-manager,
kube-proxy in nftables mode, CoreDNS; a network namespace per pod), the chart's operator as a
pod, the example's two broker pods (failback switched to Manual, so each round ends where its
failover put the active; the heartbeat settings from the options, by default sub-second: interval
0.2 s, timeout 0.1 s, 2 misses, lease 2 s), and the backend and cloud simulators as pods (the
backend's request timeout 0.25 s by default: a request hung on a partitioned pod waits that long;
its connects given up after 30 ms and fast failures retried every 20 ms, ``FAST_RETRYING_CLIENT``,
so that the client's own backoff is not counted as the failover's).
The backend sends to ``https://orders-active.<ns>.svc:8080`` by DNS; this benchmark feeds it
200 msg/s (4 streams x 5 messages per 100 ms through ``/sim/produce``). The brokers call both
simulators over TLS, verified against the run's CA (``deploy_relay``'s default); ``--plain-http``
runs every leg over plain HTTP (the chart's ``operator.brokerTls=false``, the backend calling
``http://``), for a comparison in the same setup.

Each round breaks the active broker, either with ``kill -9`` of its container (SIGKILL to the
container's PID 1 from this process, so that the fault's time is the kill's) or with a real
partition (nftables drops on its eth0, both directions, timed from when the rules are in;
healed after the round), then waits
until the cluster is Healthy with both brokers Ready again. Hops, each the first time this
process observed it after the fault (watches through the API server, a poll inside the
cluster's network for the rest, every 25 ms; each figure carries that observation delay):

- noticed: the kubelet reported the container not ready (crash only: its PLEG relist, about once
  a second, sees the dead container; in a partition the process lives on and only the missed
  heartbeats tell). Since issue 23 the operator does not wait for it: its watch connection to
  the broker proves a crash (docs/failover-engine.md, "Proofs of death"), so this hop may come
  after the others;
- endpointslice: the ``-active`` Service's EndpointSlice lists only the new pod's IP (the
  operator writes it first, in the step after the new active answered its activation);
- labelled: the new active pod carries ``role=active`` (moved after the EndpointSlice);
- decided: ``status.active`` names the other broker (written after both);
- kube-proxy: kube-proxy's last sync (its ``sync_proxy_rules_last_timestamp`` metric) is after
  the EndpointSlice change;
- accepted: the new active's ``broker_messages_accepted_total`` grew: the first bundle the
  backend got through the ClusterIP after the fault.

After every round all messages are confirmed both ways and the simulators' records are checked:
per round, messages lost, delivered twice, and out of order; any of them makes the exit status 1.
Prints per-hop medians, p99s, a PNG timeline (``--plot``), the pods' start on the node as the
kubelet logged it (``kubelet_log``: p50 and p99 over the benchmark's pods), and last
``k8s_crash_failover_p99_ms=N``.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_cluster.broker_pod_calls import pod_context
from local_cluster.cluster import REPO_ROOT, LocalClusterSettings, built_tools_dir
from local_cluster.kubelet_log import pod_starts
from local_cluster.relay import CLUSTER_NAME, FAST_RETRYING_CLIENT, Feeder, Relay, deploy_relay, wait_until
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster

sys.path.insert(0, str(REPO_ROOT))  # for the bench package, as bench_broker does
from bench.service_observations import (  # the root is on the path now
    Observations,
    first_accepted_after,
    kube_proxy_sync,
    now_ms,
    percentile,
    poll_broker,
    poll_kube_proxy,
    start_in_cluster,
    watch_cluster,
)

STREAMS = 4
PER_STREAM_PER_TICK = 5
TICK = 0.1
HOPS = ("noticed", "endpointslice", "labelled", "decided", "kube-proxy", "accepted")


@dataclass
class Round:
    kind: str
    victim: str
    hops: dict[str, float | None]
    lost: int
    twice: int
    misordered: int


def run_round(relay: Relay, obs: Observations, kind: str, index: int, total: int) -> Round:
    status = relay.status()
    victim = str(status["active"])
    other = next(name for name in (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1") if name != victim)
    other_ip = relay.pod(other)["status"]["podIP"]
    victim_pod = relay.pod(victim)
    before = relay.backend("/sim/status")
    # The fault's instant, not when a tool to make it was started: ctr or nsenter take 0.1-0.3 s
    # to start on this machine (before issue 23 that was counted in every figure). A crash is a
    # kill(2) of the container's process from here; a partition's time is when its rules are in.
    if kind == "crash":
        pid = relay.cluster.host_pid(relay.cluster.container_pid(victim_pod))
        t0 = now_ms()
        os.kill(pid, signal.SIGKILL)  # PID 1 of the container: its PID namespace dies with it
    else:
        relay.cluster.partition_pod(victim_pod, "both")
        t0 = now_ms()
    wait_until("a failover", lambda: relay.status().get("active") == other, 60, 0.05)
    accepted = wait_until(
        "a bundle accepted by the new active", lambda: first_accepted_after(obs, other, t0), 60, 0.05
    )
    after = relay.backend("/sim/status")
    slice_at = wait_until(
        "the -active EndpointSlice on the new pod",
        lambda: obs.first(obs.slices, t0, lambda a: a == (other_ip,)),
        30,
        0.05,
    )
    synced = kube_proxy_sync(obs, slice_at)
    hops = {
        "noticed": obs.first(obs.not_ready, t0, lambda name: name == victim) if kind == "crash" else None,
        "decided": obs.first(obs.active, t0, lambda name: name == other),
        "labelled": obs.first(obs.labelled, t0, lambda name: name == other),
        "endpointslice": slice_at,
        "kube-proxy": synced,
        "accepted": accepted,
    }
    if kind == "partition":
        relay.cluster.heal_pod(victim_pod)

    def recovered() -> bool:
        return relay.pod_ready(victim) and relay.status().get("phase") == "Healthy"

    wait_until("the broken broker Ready again and the cluster Healthy", recovered, 120, 0.2)
    wait_until(
        "every inbound message confirmed", lambda: relay.cloud("/sim/status")["inboundAllConfirmed"], 120, 0.2
    )
    records = relay.record_violations()
    lost, twice, misordered = records["lost"], records["twice"], records["out-of-order"]
    result = Round(
        kind,
        victim,
        {k: (v - t0 if v is not None else None) for k, v in hops.items()},
        lost,
        twice,
        misordered,
    )
    end = result.hops["accepted"]
    print(
        f"  [{index}/{total}] {kind:9} {victim}: first accepted after {end:.0f} ms; "
        f"lost {lost}, twice {twice}, out of order {misordered}; backend until then: "
        f"{_backend_retries(before, after)}",
        flush=True,
    )
    return result


def _backend_retries(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What the backend simulator's lanes went through between the fault and the first acceptance:
    the failures it saw by kind, its backoff waits and its retries after a timeout."""
    faults = {
        name: count - int(before["faults"].get(name, 0))
        for name, count in after["faults"].items()
        if count > int(before["faults"].get(name, 0))
    }
    waited = float(after["backoffSeconds"]) - float(before["backoffSeconds"])
    retries = int(after["timeoutRetries"]) - int(before["timeoutRetries"])
    return f"faults {faults or 'none'}, backoff {waited * 1000:.0f} ms, timeout retries {retries}"


def plot(rounds: list[Round], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [kind for kind in ("crash", "partition") if any(r.kind == kind for r in rounds)]
    figure, axes = plt.subplots(len(kinds), 1, figsize=(10, 3.2 * len(kinds)), squeeze=False)
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        chosen = [r for r in rounds if r.kind == kind]
        for hop_index, hop in enumerate(HOPS):
            xs = [r.hops[hop] for r in chosen]
            points = [(x, y) for y, x in enumerate(xs) if x is not None]
            if points:
                axis.scatter(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    s=14,
                    label=hop,
                    color=f"C{hop_index}",  # one colour per hop in both panels
                    zorder=3 + hop_index,
                )
        axis.set_title(f"{kind}: when each hop was observed after the fault (one row per round)")
        axis.set_xlabel("ms after the fault")
        axis.set_ylabel("round")
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def report(rounds: list[Round]) -> int:
    crash_p99 = 0
    for kind in ("crash", "partition"):
        chosen = [r for r in rounds if r.kind == kind]
        if not chosen:
            continue
        print(f"{kind} ({len(chosen)} rounds), median per hop, ms after the fault:")
        for hop in HOPS:
            values = [value for r in chosen if (value := r.hops[hop]) is not None]
            if values:
                print(
                    f"  {hop:14} median {statistics.median(values):7.0f}  p99 {percentile(values, 0.99):7.0f}"
                )
            else:
                print(f"  {hop:14} n/a")
        ends = [r.hops["accepted"] or 0.0 for r in chosen]
        p99 = round(percentile(ends, 0.99))
        print(
            f"  end to end (fault -> first accepted through the ClusterIP): p50 {percentile(ends, 0.5):.0f} "
            f"p99 {p99} max {max(ends):.0f}; lost {sum(r.lost for r in chosen)}, "
            f"twice {sum(r.twice for r in chosen)}, out of order {sum(r.misordered for r in chosen)}"
        )
        print(f"k8s_{kind}_failover_p99_ms={p99}")
        if kind == "crash":
            crash_p99 = p99
    return crash_p99


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--crash-rounds", type=int, default=20)
    parser.add_argument("--partition-rounds", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.2, help="spec.heartbeat.intervalSeconds")
    parser.add_argument("--timeout", type=float, default=0.1, help="spec.heartbeat.timeoutSeconds")
    parser.add_argument("--threshold", type=int, default=2, help="spec.heartbeat.failureThreshold")
    parser.add_argument("--lease", type=float, default=2.0, help="spec.heartbeat.leaseSeconds")
    parser.add_argument("--backend-timeout", type=float, default=0.25, help="the backend's request timeout")
    parser.add_argument("--plot", type=Path, default=REPO_ROOT / ".cache" / "bench" / "failover-k8s.png")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="the cluster's files (default: a new directory in /tmp)"
    )
    parser.add_argument(
        "--plain-http",
        action="store_true",
        help="plain HTTP on every leg: the backend to the brokers and the brokers to the simulators "
        "(default: https://, verified, as by default)",
    )
    options = parser.parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the cluster below is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = options.workdir or Path(tempfile.mkdtemp(prefix="bench-failover-k8s-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"starting the sealed local cluster in {work}", flush=True)
    cluster: SealedCluster = start_sealed_cluster(
        LocalClusterSettings(tools_dir=built_tools_dir(), workdir=work / "cluster")
    )
    obs = Observations()
    rounds: list[Round] = []
    try:
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", namespace)
        heartbeat = {
            "intervalSeconds": options.interval,
            "timeoutSeconds": options.timeout,
            "failureThreshold": options.threshold,
            "leaseSeconds": options.lease,
        }
        relay = deploy_relay(
            cluster,
            namespace,
            streams=STREAMS,
            messages_per_stream=10,
            request_timeout_seconds=options.backend_timeout,
            client=FAST_RETRYING_CLIENT,
            spec={"heartbeat": heartbeat, "failback": "Manual"},
            upstream_tls=not options.plain_http,
            broker_tls=not options.plain_http,
        )
        brokers = {
            name: relay.pod(name)["status"]["podIP"] for name in (f"{CLUSTER_NAME}-0", f"{CLUSTER_NAME}-1")
        }
        watch_cluster(obs, cluster.api_client(), namespace)
        for name, ip in brokers.items():
            context = pod_context(cluster, relay.pod(name))  # TLS by default, verified as the operator does
            start_in_cluster(
                cluster, f"poll-{name}", functools.partial(poll_broker, obs, name, ip, context=context)
            )
        start_in_cluster(cluster, "poll-kube-proxy", functools.partial(poll_kube_proxy, obs))
        Feeder(relay, PER_STREAM_PER_TICK, TICK, stop=obs.stop).start()  # stops with the pollers
        relay.backend("/sim/start", {})
        wait_until("traffic flowing", lambda: int(relay.backend("/sim/status")["confirmed"]) > 0, 60)
        scheme = "http" if options.plain_http else "https"
        plan = ["crash"] * options.crash_rounds + ["partition"] * options.partition_rounds
        print(
            f"{len(plan)} rounds under {STREAMS * PER_STREAM_PER_TICK / TICK:.0f} msg/s through "
            f"{scheme}://{CLUSTER_NAME}-active.{namespace}.svc:8080 (heartbeat {options.interval:g} s, "
            f"timeout {options.timeout:g} s, {options.threshold} misses, lease {options.lease:g} s; "
            f"backend request timeout {options.backend_timeout:g} s, connect timeout "
            f"{FAST_RETRYING_CLIENT.connect_timeout_seconds:g} s, fast failures retried every "
            f"{FAST_RETRYING_CLIENT.backoff_max_seconds:g} s; brokers to the simulators over "
            f"{'plain HTTP' if options.plain_http else 'TLS'})",
            flush=True,
        )
        for index, kind in enumerate(plan, start=1):
            rounds.append(run_round(relay, obs, kind, index, len(plan)))
    finally:
        obs.stop.set()
        starts = list(pod_starts(cluster.settings.workdir / "logs" / "kubelet.log").values())
        cluster.stop()
    plot(rounds, options.plot)
    print(f"timeline: {options.plot}")
    if starts:
        print(
            f"pod start on the node (the kubelet's first volume check to containers observed running, "
            f"{len(starts)} pods): p50 {percentile(starts, 0.5) * 1000:.0f} ms, "
            f"p99 {percentile(starts, 0.99) * 1000:.0f} ms"
        )
    crash_p99 = report(rounds)
    print(f"k8s_crash_failover_p99_ms={crash_p99}")
    # A message lost, twice or out of order in any round makes the run a failure, not a figure.
    return 1 if any(r.lost or r.twice or r.misordered for r in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
