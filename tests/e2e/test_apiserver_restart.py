"""kill -9 of kube-apiserver under traffic, on the sealed cluster: it comes back and so does the operator.

The supervisor restarts kube-apiserver with the same flags, etcd data and certificates, as a
static pod's kubelet would (``local_cluster.restarts``). The relay is the user's path
(``local_cluster.relay``: the chart's operator pod, the example's brokers, the simulator pods),
with the soak's feeder adding 200 msg/s outbound throughout. While the API server is down the
operator's watches break; the brokers and its heartbeat engine go on. Afterwards the cluster must
be Healthy with one active, traffic confirmed again, and the operator must still act: a kill -9
of the active after the restart fails over. The simulators' records prove nothing was lost,
delivered twice or reordered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from local_cluster.relay import Feeder, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from local_cluster.soak import STREAMS, wait_recovered
from tests.e2e.support import wait_for


@pytest.fixture
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"api-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(
        sealed_cluster, namespace, streams=STREAMS, messages_per_stream=10, request_timeout_seconds=2
    )
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _operator_restarts(relay: Relay) -> int:
    pods = relay.get("pods", "-l", "app.kubernetes.io/component=operator") or {}
    return sum(
        int(status.get("restartCount", 0))
        for item in pods.get("items") or []
        for status in (item.get("status") or {}).get("containerStatuses") or []
    )


@pytest.mark.timeout(900)
def test_a_kill_9_of_the_api_server_under_traffic_is_recovered_and_the_operator_still_fails_over(
    sealed_cluster: SealedCluster, relay: Relay
) -> None:
    operator_restarts = _operator_restarts(relay)
    restarts = sealed_cluster.apiserver_restarts
    feeder = Feeder(relay).start()
    try:
        relay.backend("/sim/start", {})
        wait_for(
            "traffic confirmed through the -active Service",
            lambda: int(relay.backend("/sim/status")["confirmed"]) >= 200,
            timeout=120,
        )

        killed = sealed_cluster.kill_apiserver()
        down = sealed_cluster.wait_apiserver_ready(killed, timeout=180)
        assert sealed_cluster.apiserver_pid != killed
        assert sealed_cluster.apiserver_restarts == restarts + 1
        print(f"API server ready again {down:.1f}s after kill -9 of pid {killed}", flush=True)

        started = time.monotonic()
        wait_recovered(relay)  # Healthy with an active, pods Ready, confirmed moving, heartbeats
        print(f"recovered {time.monotonic() - started:.1f}s after the API server was ready", flush=True)

        active = str(relay.status()["active"])
        killed_at = time.monotonic()
        relay.kill_9(active)
        after = wait_for(
            "a failover after kill -9 of the active, the API server restarted before",
            lambda: (s := relay.status()).get("phase") and s.get("active") not in (None, active) and s,
            timeout=90,
            interval=0.1,
        )
        print(f"failed over to {after['active']} in {time.monotonic() - killed_at:.1f}s", flush=True)
        wait_recovered(relay)
    finally:
        feeder.stop.set()
    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    assert relay.active_service_addresses() == [relay.pod(str(relay.status()["active"]))["status"]["podIP"]]
    # The operator rode out the outage: reconnected its watches, no crash and restart of its pod.
    assert _operator_restarts(relay) == operator_restarts
