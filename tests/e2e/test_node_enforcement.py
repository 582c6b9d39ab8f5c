"""What only a real node enforces, on the relay as users run it (chart, operator pod, example brokers).

A fake node runs no cgroups and no probes of its own, so these would fail there:

- **Memory limits.** The brokers get ``spec.resources`` with a memory limit; the kubelet writes it
  to the container's memory cgroup, the kernel's OOM killer kills the container when it is over,
  containerd reports ``OOMKilled`` and the kubelet restarts it. If it was the active broker, the
  operator fails over and the simulators' records show nothing lost, duplicated or reordered.
- **Probes.** The kubelet's readiness probe takes a hung broker out of the endpoints of a
  selector-based Service (one a user puts in front of a broker pod; kube-proxy then refuses
  connections to it) and puts it back when it answers again; a broker hung past its liveness
  budget is killed and restarted. The ``<cluster>-active`` Service's endpoints are the operator's
  (issue 23): readiness does not move them, the operator's failover does.

How the OOM kill is caused: this machine's cgroups are v1 (a hybrid layout, memory on the v1
hierarchy), where ``memory.oom.group`` does not exist: a memory hog ``kubectl exec``'d into the
container joins its memory cgroup, but the kernel kills only the hog (checked: exit 137 for the exec,
the broker keeps running, no restart). So the hog first raises the broker's own ``oom_score_adj``
to 1000 (an unprivileged process may raise it for a process of its user), then allocates past the
limit: the kernel's memcg OOM killer, not the test, picks the broker (PID 1 of the container), the
container ends with it and containerd records the OOM event. The brokers are Guaranteed (requests ==
limits) so the hog's own ``oom_score_adj`` stays at 0 (Burstable would ask for ~990, above the
broker's score, and the hog would be the victim again).

One relay for the module (deploying it is the slow part); each test starts from a settled cluster:
Healthy, the preferred broker active (failback done), both brokers ready, the operator running.
"""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from broker_operator.controller import names
from local_cluster.relay import CLUSTER_NAME, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import wait_for

pytestmark = pytest.mark.e2e

STREAMS, MESSAGES = 4, 150  # per stream, per direction
OPERATOR_PODS = "app.kubernetes.io/name=broker-failover,app.kubernetes.io/component=operator"  # the chart's
PREFERRED = f"{CLUSTER_NAME}-0"  # priority 0: the active once failback is done
MEMORY_LIMIT = "192Mi"  # an idle broker uses ~30 MiB, under this traffic well under 100 MiB
# requests == limits: Guaranteed QoS (see the module doc for why it matters to the OOM victim).
BROKER_RESOURCES = {
    "requests": {"cpu": "250m", "memory": MEMORY_LIMIT},
    "limits": {"cpu": "250m", "memory": MEMORY_LIMIT},
}
# Run in the broker container by `kubectl exec`: make the broker the OOM killer's choice, then go
# over the container's limit (1 GiB in 16 MiB steps; bytearray touches every page).
MEMORY_HOG = """
open("/proc/1/oom_score_adj", "w").write("1000")
chunks = []
for _ in range(64):
    chunks.append(bytearray(16 << 20))
print("not killed: the memory limit was not enforced", flush=True)
"""


@pytest.fixture(scope="module")
def relay(sealed_cluster: SealedCluster) -> Iterator[Relay]:
    namespace = f"node-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", namespace)
    relay = deploy_relay(
        sealed_cluster,
        namespace,
        streams=STREAMS,
        messages_per_stream=MESSAGES,
        spec={"resources": BROKER_RESOURCES},
    )
    yield relay
    relay.uninstall()
    sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def container_status(relay: Relay, pod: str) -> dict[str, Any]:
    statuses = (relay.pod(pod).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def operator_deployment(relay: Relay) -> str:
    """The chart's operator Deployment (``deployment.apps/<name>``), the only Deployment there."""
    listing = relay.cluster.kubectl("-n", relay.namespace, "get", "deployments", "-o", "name").stdout
    (deployment,) = listing.split()
    return deployment


def settled(relay: Relay) -> dict[str, Any]:
    """Wait until the operator runs, both brokers are ready and the preferred one is active."""
    relay.cluster.kubectl(
        "-n", relay.namespace, "rollout", "status", operator_deployment(relay), "--timeout=120s", timeout=130
    )

    def probe() -> Any:
        status = relay.status()
        healthy = status.get("phase") == "Healthy" and status.get("active") == PREFERRED
        brokers_ready = all(relay.pod_ready(f"{CLUSTER_NAME}-{ordinal}") for ordinal in (0, 1))
        return status if healthy and brokers_ready else None

    # Failback waits for failbackStableSeconds (30 s in the example) after a failover.
    return dict(wait_for(f"{PREFERRED} active, both brokers ready", probe, timeout=180, interval=1))


def service_endpoints(relay: Relay, service: str) -> dict[str, bool]:
    """The addresses in ``service``'s EndpointSlices and whether each is marked ready."""
    slices = relay.get("endpointslices", "-l", f"kubernetes.io/service-name={service}") or {}
    return {
        address: bool((endpoint.get("conditions") or {}).get("ready"))
        for item in slices.get("items") or []
        for endpoint in item.get("endpoints") or []
        for address in endpoint.get("addresses") or []
    }


def connects(relay: Relay, address: str, port: int) -> str:
    """``connected``, ``refused`` or ``timeout``: a TCP connect from inside the cluster's network."""

    def attempt() -> str:
        try:
            with socket.create_connection((address, port), timeout=3):
                return "connected"
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return "timeout"

    return relay.cluster.call_in_network(attempt)


@contextlib.contextmanager
def operator_stopped(relay: Relay) -> Iterator[None]:
    """The operator scaled to 0 for a while: only the kubelet acts on the brokers, so a change of
    the ``-active`` Service's endpoints is the kubelet's probe, not a failover moving the label."""
    deployment = operator_deployment(relay)
    kubectl = relay.cluster.kubectl
    kubectl("-n", relay.namespace, "scale", deployment, "--replicas=0")
    wait_for(
        "the operator's pod gone",
        lambda: not (relay.get("pods", "-l", OPERATOR_PODS) or {}).get("items"),
        timeout=90,
    )
    try:
        yield
    finally:
        kubectl("-n", relay.namespace, "scale", deployment, "--replicas=1")


def test_an_active_broker_over_its_memory_limit_is_oom_killed_restarted_and_failed_over(
    relay: Relay,
) -> None:
    before = settled(relay)
    active = str(before["active"])
    limits = relay.pod(active)["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == MEMORY_LIMIT and relay.pod(active)["status"]["qosClass"] == "Guaranteed"
    restarts_before = int(container_status(relay, active).get("restartCount", 0))
    epoch_before, failovers_before = int(before["epoch"]), int(before.get("failovers", 0))

    relay.backend("/sim/start", {})
    wait_for(
        "a third of the outbound messages confirmed through the Service",
        lambda: int(relay.backend("/sim/status")["confirmed"]) >= STREAMS * MESSAGES // 3,
        timeout=120,
        interval=0.1,
    )
    hog = relay.cluster.kubectl(
        "-n", relay.namespace, "exec", active, "-c", names.BROKER_CONTAINER, "--",
        "python3", "-c", MEMORY_HOG, check=False, timeout=120,
    )  # fmt: skip
    # The hog dies with the container (its PID namespace ends with the broker): 137, never its print.
    assert "not killed" not in hog.stdout, hog.stdout
    assert hog.returncode != 0, (hog.returncode, hog.stdout, hog.stderr)

    after = wait_for(
        "a failover away from the OOM-killed broker",
        lambda: (s := relay.status()).get("active") not in (None, active) and s,
        timeout=90,
    )
    new_active = str(after["active"])
    assert int(after["epoch"]) > epoch_before and int(after.get("failovers", 0)) > failovers_before, after
    labels = relay.pod(new_active)["metadata"]["labels"]
    assert labels[names.LABEL_ROLE] == names.ROLE_ACTIVE, labels

    def restarted_after_oom() -> Any:
        status = container_status(relay, active)
        return status if int(status.get("restartCount", 0)) > restarts_before else None

    status = wait_for("the kubelet restarting the OOM-killed broker", restarted_after_oom, timeout=120)
    terminated = status["lastState"]["terminated"]
    assert terminated["reason"] == "OOMKilled", terminated
    assert terminated["exitCode"] == 137, terminated
    print(
        f"OOM evidence: {active} lastState={json.dumps(terminated)} restartCount "
        f"{restarts_before}->{status['restartCount']}; active {active}->{new_active}, "
        f"epoch {epoch_before}->{after['epoch']}, failovers {failovers_before}->{after.get('failovers')}"
    )

    relay.wait_all_confirmed()
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}
    outbound, inbound = relay.cloud("/sim/received"), relay.backend("/sim/received")
    assert len(outbound) == STREAMS and len(inbound) == STREAMS
    for stream, seqs in [*outbound.items(), *inbound.items()]:
        assert seqs == list(range(1, MESSAGES + 1)), f"{stream}: lost, duplicated or out of order"
    # The Service follows whoever is active now (a failback to the restarted broker may have run).
    current = str(relay.status()["active"])
    wait_for(
        "the -active Service on the current active broker",
        lambda: relay.active_service_addresses() == [relay.pod(current)["status"]["podIP"]],
        timeout=30,
    )


def test_a_broker_failing_readiness_leaves_a_selector_service_and_comes_back(relay: Relay) -> None:
    active = str(settled(relay)["active"])
    pod = relay.pod(active)
    ip = pod["status"]["podIP"]
    # A user's own Service in front of this one broker pod, by the labels the operator gives it.
    selected, headless = f"{CLUSTER_NAME}-readiness", f"{CLUSTER_NAME}-brokers"
    selector = {
        names.LABEL_CLUSTER: CLUSTER_NAME,
        names.LABEL_ORDINAL: pod["metadata"]["labels"][names.LABEL_ORDINAL],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": selected},
        "spec": {
            "selector": selector,
            "ports": [{"port": names.BROKER_PORT, "targetPort": names.BROKER_PORT_NAME}],
        },
    }
    relay.cluster.kubectl("-n", relay.namespace, "apply", "-f", "-", input=json.dumps(service))
    try:
        cluster_ip = relay.get("service", selected)["spec"]["clusterIP"]
        wait_for(
            "the broker in the Service's endpoints", lambda: service_endpoints(relay, selected) == {ip: True}
        )
        with operator_stopped(relay):
            restarts = int(container_status(relay, active).get("restartCount", 0))
            assert connects(relay, cluster_ip, names.BROKER_PORT) == "connected"
            relay.cluster.signal_container(relay.pod(active), "SIGSTOP")
            try:
                wait_for(
                    "the kubelet's readiness probe marking the stopped broker not ready",
                    lambda: service_endpoints(relay, selected) == {ip: False},
                    timeout=60,
                )
                assert not relay.pod_ready(active)
                # kube-proxy refuses the Service's port now, while the stopped pod's own socket
                # still completes handshakes in the kernel: the Service, not the pod, turned it away.
                wait_for(
                    "kube-proxy refusing the Service without a ready endpoint",
                    lambda: connects(relay, cluster_ip, names.BROKER_PORT) == "refused",
                    timeout=30,
                )
                assert connects(relay, ip, names.BROKER_PORT) == "connected"
                # The headless Service publishes not-ready addresses: the stable DNS names stay.
                assert service_endpoints(relay, headless).get(ip) is True
                # The -active Service is the operator's (stopped here): readiness leaves it alone.
                assert service_endpoints(relay, f"{CLUSTER_NAME}-active") == {ip: True}
            finally:
                relay.cluster.signal_container(relay.pod(active), "SIGCONT")
            wait_for(
                "the resumed broker back in the Service's endpoints",
                lambda: service_endpoints(relay, selected) == {ip: True},
                timeout=60,
            )
            wait_for(
                "the Service routing again",
                lambda: connects(relay, cluster_ip, names.BROKER_PORT) == "connected",
                timeout=30,
            )
            # Stopped for less than the liveness budget (3 x 10 s): not restarted.
            assert int(container_status(relay, active).get("restartCount", 0)) == restarts
    finally:
        relay.cluster.kubectl("-n", relay.namespace, "delete", "service", selected, check=False)
    settled(relay)


def test_a_broker_hung_past_its_liveness_budget_is_restarted_by_the_kubelet(relay: Relay) -> None:
    standby = f"{CLUSTER_NAME}-1" if settled(relay)["active"] == PREFERRED else PREFERRED
    with operator_stopped(relay):
        pod = relay.pod(standby)
        restarts = int(container_status(relay, standby).get("restartCount", 0))
        relay.cluster.signal_container(pod, "SIGSTOP")  # hung, not dead: only the liveness probe notices

        def restarted() -> Any:
            status = container_status(relay, standby)
            running = "running" in (status.get("state") or {})
            return status if int(status.get("restartCount", 0)) > restarts and running else None

        status = wait_for("the liveness probe restarting the hung broker", restarted, timeout=120)
        assert status["lastState"]["terminated"]["exitCode"] == 137, status["lastState"]
        assert status["containerID"] != container_status_id(pod)
        wait_for("the restarted broker ready", lambda: relay.pod_ready(standby), timeout=60)
    settled(relay)


def container_status_id(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return str(statuses[0].get("containerID"))
