"""What the Service failover benchmarks (``bench_failover_k8s``, ``bench_drain``) observe, each
with the wall-clock time it was seen: the API server's watches (pods, the BrokerCluster's status,
the ``-active`` EndpointSlice), and polls inside the cluster's network every 25 ms (each broker's
accepted counter, kube-proxy's last sync). Every figure carries that observation delay."""

from __future__ import annotations

import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from local_cluster.relay import CLUSTER_NAME
from local_cluster.sealed_cluster import SealedCluster

KUBE_PROXY_METRICS = "http://127.0.0.1:10249/metrics"


def now_ms() -> float:
    return time.time() * 1000.0


@dataclass
class Observations:
    """What the watches and the in-cluster poller saw, each with the wall-clock time it was seen."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    not_ready: list[tuple[float, str]] = field(default_factory=list)  # (ms, pod)
    labelled: list[tuple[float, str]] = field(default_factory=list)
    active: list[tuple[float, str]] = field(default_factory=list)
    slices: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    syncs: list[tuple[float, float]] = field(default_factory=list)  # (seen ms, kube-proxy sync ms)
    accepted: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def add(self, series: list[Any], item: Any) -> None:
        with self.lock:
            series.append(item)

    def first(self, series: list[tuple[float, Any]], since: float, test: Any) -> float | None:
        with self.lock:
            return next((t for t, value in series if t >= since and test(value)), None)


def watch_cluster(obs: Observations, api: client.ApiClient, namespace: str) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    discovery = client.DiscoveryV1Api(api)

    def pods() -> None:
        while not obs.stop.is_set():
            for event in watch.Watch().stream(core.list_namespaced_pod, namespace, timeout_seconds=5):
                pod, t = event["object"], now_ms()
                name = pod.metadata.name
                statuses = pod.status.container_statuses or []
                if statuses and not statuses[0].ready:
                    obs.add(obs.not_ready, (t, name))
                if (pod.metadata.labels or {}).get("role") == "active":
                    obs.add(obs.labelled, (t, name))

    def clusters() -> None:
        while not obs.stop.is_set():
            stream = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                "broker.failover.dev", "v1alpha1", namespace, "brokerclusters",
                timeout_seconds=5,
            )  # fmt: skip
            for event in stream:
                active = (event["object"].get("status") or {}).get("active")
                if active:
                    obs.add(obs.active, (now_ms(), str(active)))

    def slices() -> None:
        selector = f"kubernetes.io/service-name={CLUSTER_NAME}-active"
        while not obs.stop.is_set():
            stream = watch.Watch().stream(
                discovery.list_namespaced_endpoint_slice,
                namespace,
                label_selector=selector,
                timeout_seconds=5,
            )
            for event in stream:
                endpoints = event["object"].endpoints or []
                addresses = tuple(a for e in endpoints for a in (e.addresses or []))
                obs.add(obs.slices, (now_ms(), addresses))

    def resilient(loop: Any) -> Any:
        def run() -> None:
            while not obs.stop.is_set():
                try:
                    loop()
                except Exception:  # the API server restarting or going away at the end: watch again
                    time.sleep(0.2)

        return run

    for target in (pods, clusters, slices):
        threading.Thread(target=resilient(target), daemon=True, name=target.__name__).start()


def metric(url: str, name: str, context: ssl.SSLContext | None = None) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=0.5, context=context) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    # kube-proxy labels its series by IP family; the cluster's Services are IPv4.
    match = re.search(rf'^{name}(?:{{ip_family="IPv4"}})? (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else None


def poll_broker(
    obs: Observations,
    name: str,
    ip: str,
    stop: threading.Event | None = None,
    context: ssl.SSLContext | None = None,
) -> None:
    """One broker's accepted counter every 25 ms, until ``obs.stop`` (or ``stop``, for a pod whose
    address changes) is set. A thread per broker: a poll of a partitioned broker hangs until its
    timeout, and must not delay what the other broker's series shows. ``context``: the pod serves
    TLS (``local_cluster.broker_pod_calls.pod_context``, verified under the pod's DNS name)."""
    url = f"{'https' if context is not None else 'http'}://{ip}:8080/metrics"
    while not (obs.stop.is_set() or (stop is not None and stop.is_set())):
        value = metric(url, "broker_messages_accepted_total", context)
        if value is not None:
            obs.add(obs.accepted.setdefault(name, []), (now_ms(), value))
        time.sleep(0.025)


def poll_kube_proxy(obs: Observations) -> None:
    while not obs.stop.is_set():
        synced = metric(KUBE_PROXY_METRICS, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
        if synced is not None:
            obs.add(obs.syncs, (now_ms(), synced * 1000.0))
        time.sleep(0.025)


def start_in_cluster(cluster: SealedCluster, name: str, function: Callable[[], None]) -> None:
    """``function`` on a daemon thread inside the cluster's network (it ends when obs.stop is set)."""
    threading.Thread(
        target=cluster.call_in_network, args=(function, 24 * 3600), daemon=True, name=name
    ).start()


def kube_proxy_sync(obs: Observations, changed: float) -> float | None:
    """When kube-proxy's rules had the new endpoint: its own sync timestamp, not when we saw it.

    The sync that matters comes after the EndpointSlice changed. It may land before this process
    saw the change (its poll's delay), so: the first sync stamped after ``changed`` minus 50 ms,
    waiting up to 2 s for it.
    """
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        with obs.lock:
            stamps = sorted({at for _, at in obs.syncs if at >= changed - 50})
        if stamps:
            return stamps[0]
        time.sleep(0.05)
    return None


def first_accepted_after(obs: Observations, name: str, since: float) -> float | None:
    with obs.lock:
        series = list(obs.accepted.get(name, []))
    before = [value for t, value in series if t < since]
    baseline = before[-1] if before else 0.0
    return next((t for t, value in series if t >= since and value > baseline), None)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]
