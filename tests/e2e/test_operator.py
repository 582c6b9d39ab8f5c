"""The operator against a real kube-apiserver: CRD, admission, children, labels, status, events, failover.

On the sealed cluster (``sealed_cluster``): the CRD is installed with ``kubectl``, CEL rules are
evaluated by the API server, broker pods run the broker image on the real kubelet, containerd and
runc, with their journal on a claim bound by the cluster's provisioner (kind's local-path). The
operator (``broker-operator``) and the backend and cloud simulators are processes of this test, started
inside the cluster's network, mount and PID namespaces (``SealedCluster.node_command``): the
operator reaches the brokers at their pod IPs as it would in a pod, and the brokers reach the
simulators at the node address (``netns.NODE_ADDRESS``, the bridge). Whatever this process says
over HTTP to a pod or to the operator goes through ``SealedCluster.call_in_network``; faults go
through the runtime (``signal_container``: kill -9, SIGSTOP/SIGCONT of a container).
The test starts and stops every process itself, in its own process group.
One test runs the engine and its Kubernetes shell in this process instead, with
stand-in brokers, to hold the engine at a chosen instant (``InProcessBrokers``).

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from broker_contracts import soap
from broker_contracts.soap import BrokerState
from broker_operator.controller import network_policy, pod_spec
from broker_operator.controller.epochs import allocate_epoch
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.shell import KubernetesClusterShell
from broker_operator.controller.spec import SpecError, parse_spec
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import (
    BrokerTarget,
    ClusterLoop,
    EpochConflict,
    HeartbeatError,
    HeartbeatReply,
    HeartbeatSettings,
)
from local_cluster.broker_pod_calls import BrokerPodCallError, pod_call
from local_cluster.cluster import REPO_ROOT, ClusterAccess
from local_cluster.netns import NODE_ADDRESS
from local_cluster.sealed_cluster import SealedCluster, SealedClusterError
from tests.e2e.support import (
    WAIT_SECONDS,
    LocalProcess,
    installed_crd,
    listening,
    wait_for,
)

pytestmark = pytest.mark.e2e

VENV_BIN = REPO_ROOT / ".venv" / "bin"


# ---- processes of this test inside the cluster's namespaces -------------------------------------


def node_env(cluster: SealedCluster) -> dict[str, str]:
    """``cluster.env`` for a process inside the cluster's namespaces: its KUBECONFIG names the API
    server on the bridge address (the loopback forward exists only in the machine's namespace)."""
    return {**cluster.env, "KUBECONFIG": str(cluster.node_kubeconfig)}


def node_port(cluster: SealedCluster) -> int:
    """A TCP port free on every address of the cluster's network namespace right now."""

    def pick() -> int:
        with socket.socket() as probe:
            probe.bind(("0.0.0.0", 0))
            return int(probe.getsockname()[1])

    return cluster.call_in_network(pick)


def node_listening(cluster: SealedCluster, port: int) -> bool:
    """Something accepts on 127.0.0.1:``port`` of the cluster's network namespace."""
    return cluster.call_in_network(lambda: listening(port))


def http_in_network(
    cluster: SealedCluster, request: urllib.request.Request | str, timeout: float = 10
) -> str:
    """The body of an HTTP request made from the cluster's network (pod IPs, the node address);
    ``urllib.error.HTTPError`` and ``OSError`` reach the caller as urllib raises them."""

    def call() -> str:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(response.read().decode())

    return cluster.call_in_network(call, timeout=timeout + 20)


def start_simulator(cluster: SealedCluster, role: str, log: Path, *args: str) -> tuple[LocalProcess, str]:
    """``ROLE-simulator`` inside the cluster's namespaces, on every address; returns it and its URL
    at the node address, which pods reach over the bridge."""
    port = node_port(cluster)
    argv = [str(VENV_BIN / f"{role}-simulator"), "--host", "0.0.0.0", "--port", str(port), *args]
    process = LocalProcess(cluster.node_command(argv), log)
    wait_for(f"{role} simulator", lambda: node_listening(cluster, port) or process.process.poll() is not None)
    assert process.process.poll() is None, process.tail()
    return process, f"http://{NODE_ADDRESS}:{port}"


def apply(
    cluster: SealedCluster, namespace: str, manifest: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)


def broker_cluster(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": name},
        "spec": {"account": "acme", "company": "1000", **spec},
    }


@pytest.fixture(scope="module")
def crd_installed(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):
        yield


def new_namespace(cluster: ClusterAccess, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: cluster.get_json(name, "serviceaccount", "default"))
    return name


@pytest.fixture(scope="module")
def namespace(sealed_cluster: SealedCluster, crd_installed: None) -> Iterator[str]:
    name = new_namespace(sealed_cluster, "operator")
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def simulators(sealed_cluster: SealedCluster, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A backend and a cloud simulator in the cluster's network for one test's BrokerCluster.

    One pair per cluster: targets remember the highest epoch they have seen for an account, and
    epochs are per cluster, so two clusters sharing simulators would fence each other.
    """
    started: list[LocalProcess] = []
    try:
        urls = {}
        for role in ("backend", "cloud"):
            process, urls[role] = start_simulator(sealed_cluster, role, tmp_path / f"{role}.log")
            started.append(process)
        yield urls
    finally:
        for process in started:
            process.stop()


OPERATOR_POD_NAMESPACE = "broker-system"
OPERATOR_POD_LABELS = "app.kubernetes.io/component=operator,app.kubernetes.io/name=broker-failover"


def start_operator(cluster: SealedCluster, namespace: str, log: Path, *extra: str) -> LocalProcess:
    """``broker-operator`` as its own process, watching ``namespace`` only; returns once it serves.

    It runs inside the cluster's namespaces, where the brokers' pod IPs route, with the admin
    kubeconfig (not in a pod: a test can kill it, restart it and read its log directly). Its
    metrics endpoint listens on the namespace's loopback: read it with ``http_in_network``.
    """
    metrics_port = node_port(cluster)
    argv = [str(VENV_BIN / "broker-operator"), "--namespace", namespace, "--operator-id", "e2e-operator"]
    argv += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port), "--reconcile-seconds", "2"]
    # Who the operator's pods would be, for NetworkPolicies (the chart sets these from the Deployment;
    # this operator runs outside any pod, and the local cluster enforces no policy).
    argv += ["--pod-namespace", OPERATOR_POD_NAMESPACE, "--pod-labels", OPERATOR_POD_LABELS, *extra]
    process = LocalProcess(cluster.node_command(argv), log, env=node_env(cluster))
    wait_for(
        "operator metrics endpoint",
        lambda: node_listening(cluster, metrics_port) or process.process.poll() is not None,
    )
    assert process.process.poll() is None, process.tail()
    process.metrics_port = metrics_port  # type: ignore[attr-defined]
    return process


@pytest.fixture(scope="module")
def operator(
    sealed_cluster: SealedCluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalProcess]:
    process = start_operator(sealed_cluster, namespace, tmp_path_factory.mktemp("operator") / "operator.log")
    try:
        yield process
    finally:
        process.stop()
        print(process.tail())  # shown by pytest on failure


# ---- the CRD on its own ---------------------------------------------------------------


def test_kubectl_knows_the_short_name_and_columns(sealed_cluster: SealedCluster, namespace: str) -> None:
    created = apply(sealed_cluster, namespace, broker_cluster("columns", replicas=1, company="3000"))
    assert created.returncode == 0, created.stderr
    table = sealed_cluster.kubectl("-n", namespace, "get", "bc", "columns").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "ACCOUNT", "COMPANY", "PHASE", "ACTIVE", "EPOCH", "ORDERING", "PAUSED", "AGE"]
    assert table.splitlines()[1].split()[:3] == ["columns", "acme", "3000"]
    defaulted = sealed_cluster.get_json(namespace, "bc", "columns")["spec"]
    assert defaulted["heartbeat"] == {
        "intervalSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
        "leaseSeconds": 10,
        "handoverLeaseSeconds": 30,
        "standbyProbeSeconds": 10,
    }
    assert (defaulted["failback"], defaulted["failbackStableSeconds"]) == ("Automatic", 30)
    assert defaulted["delivery"] == {"maxDeliveries": 5, "onPoison": "BlockStream"}
    assert defaulted["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Retain",
        "whenDeleted": "Retain",
    }
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "columns", "--wait=false")


INVALID = [
    (
        {"heartbeat": {"leaseSeconds": 2, "intervalSeconds": 1, "failureThreshold": 3}},
        "spec.heartbeat.leaseSeconds (2) must exceed intervalSeconds × failureThreshold (3)",  # noqa: RUF001
    ),
    (
        {"heartbeat": {"leaseSeconds": 0.4, "intervalSeconds": 0.2, "timeoutSeconds": 0.2}},
        "spec.heartbeat.leaseSeconds (0.4) must exceed intervalSeconds × failureThreshold (0.4)",  # noqa: RUF001
    ),
    (
        {"heartbeat": {"intervalSeconds": 0.2, "timeoutSeconds": 0.25, "leaseSeconds": 2}},
        "spec.heartbeat.timeoutSeconds (0.25) must not exceed intervalSeconds (0.2)",
    ),
    ({"heartbeat": {"intervalSeconds": 0.05}}, "spec.heartbeat.intervalSeconds"),
    ({"heartbeat": {"leaseSeconds": True}}, "spec.heartbeat.leaseSeconds"),
    ({"heartbeat": {"failureThreshold": 0}}, "spec.heartbeat.failureThreshold"),
    (
        {"replicas": 2, "endpoints": [{"name": "a", "url": "http://10.0.0.1:8080/soap", "priority": 0}]},
        "spec.replicas and spec.endpoints are exclusive",
    ),
    (
        {
            "endpoints": [
                {"name": "a", "url": "http://10.0.0.1:8080/soap", "priority": 0},
                {"name": "b", "url": "http://10.0.0.2:8080/soap", "priority": 0},
            ]
        },
        "spec.endpoints priorities must be unique",
    ),
    (
        {"preferredActive": "invalid-7"},
        "spec.preferredActive (invalid-7) must name one of this cluster's pods",
    ),
    ({"failback": "Sometimes"}, "spec.failback"),
    ({"delivery": {"onPoison": "Drop"}}, "spec.delivery.onPoison"),
    (
        {"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Drop"}},
        "spec.persistentVolumeClaimRetentionPolicy.whenScaled",
    ),
    ({"replicas": 0}, "spec.replicas"),
    (
        {"backend": {"url": "http://a", "urlSecretRef": {"name": "s"}}},
        "spec.backend.url and spec.backend.urlSecretRef",
    ),
    # Issue 42's pod knobs: the operator's own keys, and the bounds.
    ({"podMetadata": {"labels": {"role": "x"}}}, pod_spec.LABELS_RESERVED_MESSAGE),
    (
        {"podMetadata": {"annotations": {"broker.failover.dev/template-hash": "0"}}},
        pod_spec.ANNOTATIONS_RESERVED_MESSAGE,
    ),
    ({"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}, "spec.imagePullSecrets: Too many"),
    (
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone"}]},
        "spec.topologySpreadConstraints[0].whenUnsatisfiable: Required value",
    ),
    ({"serviceAccountName": "Broker_SA"}, "spec.serviceAccountName"),
]


@pytest.mark.parametrize(("spec", "message"), INVALID, ids=[m.split(" ")[0] for _, m in INVALID])
def test_invalid_manifests_are_refused_naming_the_field(
    sealed_cluster: SealedCluster, namespace: str, spec: dict[str, Any], message: str
) -> None:
    result = apply(sealed_cluster, namespace, broker_cluster("invalid", **spec))
    assert result.returncode != 0, f"accepted: {spec}"
    assert message in result.stderr, result.stderr
    assert sealed_cluster.get_json(namespace, "bc", "invalid") is None


def test_decimal_heartbeat_seconds_are_accepted_and_kept(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    # Sub-second heartbeats (the failover benchmark's settings) on a real API server.
    heartbeat = {"intervalSeconds": 0.2, "timeoutSeconds": 0.2, "failureThreshold": 2, "leaseSeconds": 2.5}
    created = apply(sealed_cluster, namespace, broker_cluster("decimal", replicas=1, heartbeat=heartbeat))
    assert created.returncode == 0, created.stderr
    stored = sealed_cluster.get_json(namespace, "bc", "decimal")["spec"]
    assert stored["heartbeat"] == {**heartbeat, "handoverLeaseSeconds": 30, "standbyProbeSeconds": 10}
    settings = parse_spec("decimal", stored).heartbeat
    assert (settings.interval_seconds, settings.timeout_seconds, settings.lease_seconds) == (0.2, 0.2, 2.5)
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "decimal", "--wait=false")


@pytest.mark.parametrize(
    "heartbeat",
    [
        # 0.1 * 3 is 0.30000000000000004 in doubles: CEL writes it so, and so must Python.
        {"intervalSeconds": 0.1, "timeoutSeconds": 0.1, "failureThreshold": 3, "leaseSeconds": 0.3},
        {"intervalSeconds": 0.5, "timeoutSeconds": 0.5, "failureThreshold": 3, "leaseSeconds": 1.5},
        {"intervalSeconds": 2, "timeoutSeconds": 2.5, "leaseSeconds": 9},
        {"intervalSeconds": 1, "failureThreshold": 3, "leaseSeconds": 2},
    ],
)
def test_the_api_server_refuses_decimals_with_the_python_parsers_words(
    sealed_cluster: SealedCluster, namespace: str, heartbeat: dict[str, Any]
) -> None:
    with pytest.raises(SpecError) as parsed:
        parse_spec("refused", {"account": "acme", "company": "1000", "heartbeat": heartbeat})
    (problem,) = parsed.value.problems
    result = apply(sealed_cluster, namespace, broker_cluster("refused", heartbeat=heartbeat))
    assert result.returncode != 0, f"accepted: {heartbeat}"
    assert problem in result.stderr, result.stderr
    assert sealed_cluster.get_json(namespace, "bc", "refused") is None


def test_account_is_immutable(sealed_cluster: SealedCluster, namespace: str) -> None:
    assert (
        apply(sealed_cluster, namespace, broker_cluster("frozen", replicas=1, company="4000")).returncode == 0
    )
    changed = broker_cluster("frozen", replicas=1, company="4000")
    changed["spec"]["account"] = "other"
    result = apply(sealed_cluster, namespace, changed)
    assert result.returncode != 0
    assert "spec.account is immutable" in result.stderr
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "frozen", "--wait=false")


def test_the_epoch_write_is_conditional_on_the_resource_version(
    sealed_cluster: SealedCluster, crd_installed: None
) -> None:
    # A namespace the operator does not watch: only this test writes the object.
    namespace = new_namespace(sealed_cluster, "epochs")
    try:
        assert apply(sealed_cluster, namespace, broker_cluster("fenced", replicas=1)).returncode == 0
        api = KubeApi(sealed_cluster.api_client())

        async def scenario() -> None:
            assert await allocate_epoch(api, namespace, "fenced", current=0) == 1
            stale = (await api.read_cluster(namespace, "fenced"))["metadata"]["resourceVersion"]
            assert await allocate_epoch(api, namespace, "fenced", current=1) == 2
            # A writer holding the older version is refused by the API server itself.
            with pytest.raises(ApiException) as refused:
                await api.patch_cluster_status(
                    namespace, "fenced", {"metadata": {"resourceVersion": stale}, "status": {"epoch": 2}}
                )
            assert refused.value.status == 409
            # And an operator that believes in an older epoch gets a conflict, not a duplicate epoch.
            with pytest.raises(EpochConflict) as conflict:
                await allocate_epoch(api, namespace, "fenced", current=1)
            assert conflict.value.current == 2
            # The daemon's live view, when it is behind the server: the write on its version is
            # refused, the allocation reads once and writes again; behind a rival's allocation,
            # that read shows the rival's epoch and it is a conflict, never a duplicate.
            behind = await api.read_cluster(namespace, "fenced")
            await api.patch_cluster_status(namespace, "fenced", {"status": {"phase": "Healthy"}})
            assert await allocate_epoch(api, namespace, "fenced", current=2, known=behind) == 3
            behind = await api.read_cluster(namespace, "fenced")
            assert await allocate_epoch(api, namespace, "fenced", current=3) == 4  # a rival
            with pytest.raises(EpochConflict) as conflict:
                await allocate_epoch(api, namespace, "fenced", current=3, known=behind)
            assert conflict.value.current == 4

        asyncio.run(scenario())
        assert sealed_cluster.get_json(namespace, "bc", "fenced")["status"]["epoch"] == 4
    finally:
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


class InProcessBrokers:
    """Brokers that follow the Heartbeat rules (stale epochs refused, epoch stored), in this process.

    What is under test here is the engine's writes to the API server, not the brokers, so the
    engine's heartbeat client is replaced by this stand-in, which sends nothing anywhere.
    """

    def __init__(self, names: list[str]) -> None:
        self.epochs = dict.fromkeys(names, 0)
        self.active = dict.fromkeys(names, False)
        self.reachable = dict.fromkeys(names, True)

    async def heartbeat(
        self,
        target: BrokerTarget,
        active: bool,
        epoch: int,
        *,
        renew: bool = True,
        limit_seconds: float | None = None,
        lease_seconds: float | None = None,  # a handover's; these stand-ins keep no lease
    ) -> HeartbeatReply:
        name = target.name
        if not self.reachable[name]:
            raise HeartbeatError(target, "cannot connect: connection refused", reached=False)
        stored = self.epochs[name]
        if not active:
            self.active[name] = False
            self.epochs[name] = max(stored, epoch)
            return HeartbeatReply(BrokerState.INACTIVE, None, None, self.epochs[name])
        if epoch < stored:
            return HeartbeatReply(BrokerState.UNAVAILABLE, "STALE_EPOCH", "stale epoch", stored)
        if renew:
            self.epochs[name], self.active[name] = epoch, True
        state = BrokerState.ACTIVE if self.active[name] else BrokerState.INACTIVE
        return HeartbeatReply(state, None, None, self.epochs[name])

    async def close(self) -> None:
        return None


class PausableShell(KubernetesClusterShell):
    """The operator's real Kubernetes shell, whose next status write can be held as if it stopped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold_next_status = False
        self.held = asyncio.Event()  # a status write is waiting to be sent
        self.resume = asyncio.Event()
        self.written = asyncio.Event()  # the held write has reached the API server, or was refused
        self.events: list[str] = []

    async def record_status(self, status: ClusterStatus) -> None:
        hold, self.hold_next_status = self.hold_next_status, False
        if hold:
            self.held.set()
            await self.resume.wait()
        try:
            await super().record_status(status)
        finally:
            if hold:
                self.written.set()

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append(reason)  # kopf's event poster works only inside a running kopf


async def stored_epoch(api: KubeApi, namespace: str, name: str) -> int:
    body = await api.read_cluster(namespace, name)
    return int((body.get("status") or {}).get("epoch") or 0)


async def engine_reaches(engine: asyncio.Task[None], description: str, check: Callable[[], bool]) -> None:
    """Wait (at most 60 s) until ``check()`` holds, failing early if the engine died."""
    deadline = time.monotonic() + 60
    while not check():
        assert not engine.done(), f"the engine stopped: {engine.exception()}"
        assert time.monotonic() < deadline, f"timed out waiting for {description}"
        await asyncio.sleep(0.05)


def test_a_paused_engine_resuming_never_writes_an_older_epoch_back(
    sealed_cluster: SealedCluster, crd_installed: None
) -> None:
    """Issue 13: status.epoch had two writers, the conditional allocation and the engine's status patch.

    An engine held just before a status write (a stopped process, a long GC, a slow API call)
    while another operator allocated the next epoch wrote its older epoch back on resuming, and
    its next allocation then granted that epoch a second time. The engine and its Kubernetes
    shell are the operator's own; only the brokers are stand-ins (see ``InProcessBrokers``).
    """
    namespace = new_namespace(sealed_cluster, "epochs")  # no operator watches it
    endpoints = [
        {"name": "b0", "url": "http://127.0.0.1:9/soap", "priority": 0},
        {"name": "b1", "url": "http://127.0.0.1:9/soap", "priority": 1},
    ]
    settings = HeartbeatSettings(
        interval_seconds=0.2, timeout_seconds=0.2, lease_seconds=2.0, standby_probe_seconds=0.2
    )
    targets = [BrokerTarget(e["name"], e["url"], e["priority"]) for e in endpoints]

    async def scenario() -> None:
        api = KubeApi(sealed_cluster.api_client())
        body = await api.read_cluster(namespace, "stalled")
        shell = PausableShell(api, body, ClusterObservations(), {}, manages_pods=False)
        brokers = InProcessBrokers(["b0", "b1"])
        initial = ClusterStatus.from_status(body.get("status"))
        loop = ClusterLoop("stalled", targets, settings, shell, brokers, initial)
        engine = asyncio.create_task(loop.run())
        try:
            await engine_reaches(engine, "b0 active", lambda: loop.status.active == "b0")
            assert await stored_epoch(api, namespace, "stalled") == brokers.epochs["b0"] == 1
            # The engine stops in its next status write (b1 stops answering: status changes)...
            shell.hold_next_status = True
            brokers.reachable["b1"] = False
            await asyncio.wait_for(shell.held.wait(), timeout=30)
            # ... while another operator allocates the next epoch, by the same compare-and-swap.
            assert await allocate_epoch(api, namespace, "stalled", current=1) == 2
            # The engine resumes: its status write must leave the other operator's epoch alone
            # (it is refused now, the stored epoch being above the engine's: status_fence.py).
            shell.resume.set()
            await asyncio.wait_for(shell.written.wait(), timeout=30)
            assert await stored_epoch(api, namespace, "stalled") == 2, "an older epoch was written back"
            # Its next allocation (a failover to b1) conflicts and goes above 2, never granting 2 again.
            brokers.reachable["b1"] = True
            brokers.reachable["b0"] = brokers.active["b0"] = False
            await engine_reaches(engine, "failover to b1", lambda: loop.status.active == "b1")
            assert brokers.epochs["b1"] == 3
            assert await stored_epoch(api, namespace, "stalled") == 3
            assert "EpochConflict" in shell.events
        finally:
            engine.cancel()
            await asyncio.gather(engine, return_exceptions=True)

    try:
        created = apply(sealed_cluster, namespace, broker_cluster("stalled", endpoints=endpoints))
        assert created.returncode == 0, created.stderr
        asyncio.run(scenario())
    finally:
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# ---- the operator running brokers -----------------------------------------------------------


# A kubectl is a process start and a TLS handshake, about 0.2 CPU-seconds here; the waits below
# poll twice a second.
KUBECTL_EVERY = 10


def bc_row(cluster: SealedCluster, namespace: str, name: str) -> dict[str, str]:
    """``kubectl get bc <name>`` as {column: value}, exactly what a person sees.

    Cut at the header's column positions, not at spaces: empty cells (no ORDERING yet) would
    otherwise shift every later value one column left.
    """
    header, row = cluster.kubectl("-n", namespace, "get", "bc", name).stdout.splitlines()[:2]
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[s:e].strip(): row[s:e].strip() for s, e in zip(starts, ends, strict=True)}


def wait_for_row(  # noqa: PLR0917  (reads as the sentence: cluster, namespace, name, what, until)
    cluster: SealedCluster,
    namespace: str,
    name: str,
    description: str,
    predicate: Callable[[dict[str, str]], bool],
    timeout: float = WAIT_SECONDS,
) -> dict[str, str]:
    """Wait until ``kubectl get bc <name>`` shows a row satisfying ``predicate``; fail showing the last.

    The polls read the API server's own printing of the row (the Table kubectl asks for, one GET
    over a kept client); kubectl itself runs when that row satisfies ``predicate``, and every
    ``KUBECTL_EVERY`` polls in any case, and only kubectl's row ends the wait."""
    seen: list[dict[str, str]] = []
    polls = itertools.count(1)

    def probe() -> dict[str, str] | None:
        rows = cluster.get_table(namespace, "bc", name)
        if rows and not predicate(rows[0]) and next(polls) % KUBECTL_EVERY:
            seen.append(rows[0])
            return None
        seen.append(bc_row(cluster, namespace, name))
        return seen[-1] if predicate(seen[-1]) else None

    try:
        return wait_for(description, probe, timeout)
    except pytest.fail.Exception:
        status = (cluster.get_json(namespace, "bc", name) or {}).get("status")
        pytest.fail(f"{description}: last row {seen[-1] if seen else None}, status {status}")


def pod(cluster: SealedCluster, namespace: str, name: str) -> dict[str, Any] | None:
    return cluster.get_json(namespace, "pod", name)


def role_of(cluster: SealedCluster, namespace: str, name: str) -> str | None:
    body = pod(cluster, namespace, name)
    return (body or {}).get("metadata", {}).get("labels", {}).get("role")


def running_pod(cluster: SealedCluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod, once its container has started (its containerID names the container to signal)."""
    return dict(
        wait_for(
            f"pod {name} with a started container",
            lambda: (
                (body := pod(cluster, namespace, name))
                and any(s.get("containerID") for s in body["status"].get("containerStatuses") or [])
                and body
            ),
        )
    )


def broker_gauge(cluster: SealedCluster, namespace: str, name: str, metric: str) -> float | None:
    """A gauge from the broker's own /metrics, at its pod IP (None while it does not answer); over
    TLS, verified, when the pod serves it (``local_cluster.broker_pod_calls``)."""
    body = pod(cluster, namespace, name)
    if not (body or {}).get("status", {}).get("podIP"):
        return None
    try:
        text = cluster.call_in_network(pod_call(cluster, body, 8080, "/metrics", timeout=2), timeout=22)
    except (OSError, BrokerPodCallError):
        return None
    for line in text.splitlines():
        if line.startswith(f"{metric} "):
            return float(line.split()[1])
    return None


def event_reasons(cluster: SealedCluster, namespace: str, name: str) -> list[str]:
    events = cluster.get_json(namespace, "events", "--field-selector", f"involvedObject.name={name}")
    return [e["reason"] for e in (events or {}).get("items", [])]


def wait_for_event(cluster: SealedCluster, namespace: str, name: str, reason: str) -> None:
    """Events are posted from queues (kopf's, the engine's ``EventWriter``) after the change they
    report: waited for, never read at once (CI, 2026-11-28: read right after a NetworkPolicy was
    gone, its ``Deleted`` event was not there yet)."""
    wait_for(
        f"a {reason} event of {name}",
        lambda: reason in event_reasons(cluster, namespace, name),
        timeout=30,
    )


def assert_children_owned(cluster: SealedCluster, namespace: str, uid: str) -> None:
    """Every child of BrokerCluster ``orders`` exists and is owned by it (uid ``uid``), but the
    journal claims, which the default ``whenDeleted: Retain`` leaves unowned."""
    for name in ("journal-orders-0", "journal-orders-1"):
        claim = wait_for(f"pvc/{name}", lambda name=name: cluster.get_json(namespace, "pvc", name))
        assert not claim["metadata"].get("ownerReferences"), claim["metadata"]
    for kind, name in [
        ("pod", "orders-0"),
        ("pod", "orders-1"),
        ("service", "orders-active"),
        ("service", "orders-brokers"),
        ("endpointslice", "orders-active"),  # the -active Service's endpoints, the operator's
        ("secret", "orders-broker-token"),
    ]:
        child = wait_for(
            f"{kind}/{name}", lambda kind=kind, name=name: cluster.get_json(namespace, kind, name)
        )
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "orders", uid), (
            f"{kind}/{name}"
        )
    assert "selector" not in cluster.get_json(namespace, "service", "orders-active")["spec"]


def assert_deleted_services_come_back(sealed_cluster: SealedCluster, namespace: str) -> None:
    """Services of cluster ``orders`` deleted by hand are created again (new uids); the ``-active`` one
    selects nothing, and its EndpointSlice (the operator's, owned by the BrokerCluster) serves it."""
    old_uids = {
        name: sealed_cluster.get_json(namespace, "service", name)["metadata"]["uid"]
        for name in ("orders-active", "orders-brokers")
    }
    sealed_cluster.kubectl("-n", namespace, "delete", "service", "orders-active", "orders-brokers")
    for name, old_uid in old_uids.items():
        wait_for(
            f"service/{name} created again",
            lambda name=name, old_uid=old_uid: (
                (body := sealed_cluster.get_json(namespace, "service", name))
                and body["metadata"]["uid"] != old_uid
            ),
            timeout=30,
        )
    assert "selector" not in sealed_cluster.get_json(namespace, "service", "orders-active")["spec"]
    assert sealed_cluster.get_json(namespace, "service", "orders-brokers")["spec"]["selector"]
    endpoints = sealed_cluster.get_json(namespace, "endpointslice", "orders-active")
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "orders-active"
    assert [e["addresses"] for e in endpoints["endpoints"]], endpoints  # names the active broker


def orders_in(namespace: str) -> str:
    """The labels of BrokerCluster ``orders``'s series in the operator's /metrics (prometheus_client
    writes label names sorted)."""
    return f'brokercluster="orders",brokercluster_namespace="{namespace}"'


def test_a_cluster_runs_owned_brokers_and_fails_over_after_kill_9(
    sealed_cluster: SealedCluster, namespace: str, simulators: dict[str, str], operator: LocalProcess
) -> None:
    manifest = broker_cluster(
        "orders",
        replicas=2,
        failback="Manual",  # keep the active where the failover put it while we look
        backend={"url": simulators["backend"]},
        cloud={"url": simulators["cloud"]},
    )
    created = apply(sealed_cluster, namespace, manifest)
    assert created.returncode == 0, created.stderr
    uid = sealed_cluster.get_json(namespace, "bc", "orders")["metadata"]["uid"]

    assert_children_owned(sealed_cluster, namespace, uid)

    # The engine activates the highest-priority broker and moves the label to it.
    healthy = wait_for_row(
        sealed_cluster,
        namespace,
        "orders",
        "orders-0 active and the cluster Healthy",
        lambda row: row["ACTIVE"] == "orders-0" and row["PHASE"] == "Healthy",
        timeout=90,
    )
    assert healthy["ACCOUNT"] == "acme" and healthy["COMPANY"] == "1000"
    first_epoch = int(healthy["EPOCH"])
    assert first_epoch >= 1
    wait_for("role=active on orders-0", lambda: role_of(sealed_cluster, namespace, "orders-0") == "active")
    assert role_of(sealed_cluster, namespace, "orders-1") == "standby"

    # kill -9 of the active broker's container (the runtime's): the pod watch sees the container die.
    sealed_cluster.signal_container(running_pod(sealed_cluster, namespace, "orders-0"), "SIGKILL")
    moved = wait_for_row(
        sealed_cluster, namespace, "orders", "failover to orders-1", lambda row: row["ACTIVE"] == "orders-1"
    )
    assert int(moved["EPOCH"]) > first_epoch
    wait_for("role=active on orders-1", lambda: role_of(sealed_cluster, namespace, "orders-1") == "active")
    wait_for("role=standby on orders-0", lambda: role_of(sealed_cluster, namespace, "orders-0") == "standby")
    status = sealed_cluster.get_json(namespace, "bc", "orders")["status"]
    assert status["lastFailover"]["from"] == "orders-0"
    assert status["lastFailover"]["to"] == "orders-1"
    assert status["failovers"] >= 1
    reasons = event_reasons(sealed_cluster, namespace, "orders")
    assert "Failover" in reasons, reasons

    # The killed broker comes back (restartPolicy Always) as a standby; a planned switchover
    # through spec.preferredActive moves the active back to it with the next epoch.
    wait_for(
        "orders-0 running again",
        lambda: (
            (body := pod(sealed_cluster, namespace, "orders-0"))
            and any(c.get("ready") for c in body["status"].get("containerStatuses") or [])
        ),
        timeout=60,
    )
    sealed_cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "bc",
        "orders",
        "--type=merge",
        "-p",
        '{"spec": {"preferredActive": "orders-0"}}',
    )
    back = wait_for_row(
        sealed_cluster,
        namespace,
        "orders",
        "switchover back to orders-0",
        lambda row: row["ACTIVE"] == "orders-0",
    )
    assert int(back["EPOCH"]) > int(moved["EPOCH"])
    wait_for(
        "role=active on orders-0 again", lambda: role_of(sealed_cluster, namespace, "orders-0") == "active"
    )
    wait_for_event(sealed_cluster, namespace, "orders", "Switchover")

    # A partition: SIGSTOP freezes the active broker without killing it. Heartbeats time out, the
    # operator waits out the lease (the frozen broker fences itself when it runs again), then
    # activates the standby with a newer epoch.
    frozen = running_pod(sealed_cluster, namespace, "orders-0")
    sealed_cluster.signal_container(frozen, "SIGSTOP")
    try:
        partitioned = wait_for_row(
            sealed_cluster,
            namespace,
            "orders",
            "failover away from the frozen orders-0",
            lambda row: row["ACTIVE"] == "orders-1",
        )
        assert int(partitioned["EPOCH"]) > int(back["EPOCH"])
    finally:
        try:
            sealed_cluster.signal_container(frozen, "SIGCONT")
        except SealedClusterError:
            # The kubelet's liveness probe (30 s) may have restarted the frozen container already.
            print(f"SIGCONT of orders-0 not delivered: {pod(sealed_cluster, namespace, 'orders-0')}")
    wait_for(
        "role=active on orders-1 after the partition",
        lambda: role_of(sealed_cluster, namespace, "orders-1") == "active",
    )
    # Once running again, the frozen broker finds its lease expired and is not active: never two.
    wait_for(
        "orders-0 self-fenced",
        lambda: broker_gauge(sealed_cluster, namespace, "orders-0", "broker_active") == 0,
    )
    assert broker_gauge(sealed_cluster, namespace, "orders-1", "broker_active") == 1
    back = partitioned

    # The engine's metrics are served by the operator process (on the cluster namespace's loopback).
    port = operator.metrics_port  # type: ignore[attr-defined]
    metrics = http_in_network(sealed_cluster, f"http://127.0.0.1:{port}/metrics")
    assert f"broker_failover_epoch{{{orders_in(namespace)}}} {back['EPOCH']}.0" in metrics
    assert f'broker_failover_phase{{{orders_in(namespace)},phase="Healthy"}}' in metrics
    assert f'broker_failover_failovers_total{{{orders_in(namespace)},kind="Failover"}}' in metrics
    assert "broker_failover_heartbeats_total" in metrics

    # Children deleted by hand come back (the operator runs with --reconcile-seconds 2).
    assert_deleted_services_come_back(sealed_cluster, namespace)


def test_a_second_cluster_for_the_same_pair_is_a_conflict(
    sealed_cluster: SealedCluster, namespace: str, operator: LocalProcess
) -> None:
    first = apply(sealed_cluster, namespace, broker_cluster("pair-first", replicas=1, company="2000"))
    assert first.returncode == 0, first.stderr
    wait_for("pair-first has a pod", lambda: pod(sealed_cluster, namespace, "pair-first-0"))
    second = apply(sealed_cluster, namespace, broker_cluster("pair-second", replicas=1, company="2000"))
    assert second.returncode == 0, second.stderr
    wait_for_row(
        sealed_cluster,
        namespace,
        "pair-second",
        "pair-second in phase Conflict",
        lambda row: row["PHASE"] == "Conflict",
    )
    status = sealed_cluster.get_json(namespace, "bc", "pair-second")["status"]
    assert status["conflictsWith"] == "pair-first"
    wait_for_event(sealed_cluster, namespace, "pair-second", "Conflict")
    assert pod(sealed_cluster, namespace, "pair-second-0") is None
    # Deleting the first hands the pair to the second.
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "pair-first", "--wait=false")
    wait_for("pair-second runs a pod", lambda: pod(sealed_cluster, namespace, "pair-second-0"), timeout=60)
    assert bc_row(sealed_cluster, namespace, "pair-second")["PHASE"] != "Conflict"
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "pair-second", "--wait=false")


def test_a_spec_change_rolls_standbys_first_then_switches_over(
    sealed_cluster: SealedCluster, namespace: str, simulators: dict[str, str], operator: LocalProcess
) -> None:
    manifest = broker_cluster(
        "upgrade",
        replicas=2,
        company="5000",
        failback="Manual",
        backend={"url": simulators["backend"]},
        cloud={"url": simulators["cloud"]},
    )
    assert apply(sealed_cluster, namespace, manifest).returncode == 0
    wait_for_row(
        sealed_cluster,
        namespace,
        "upgrade",
        "upgrade-0 active",
        lambda row: row["ACTIVE"] == "upgrade-0" and row["PHASE"] == "Healthy",
        timeout=90,
    )
    old_hash = template_hash(sealed_cluster, namespace, "upgrade-0")

    # A new image tag (the same image under the next version's tag in the node's containerd, as a
    # registry would serve it): the operator sees a new pod template and must replace both pods,
    # the active last.
    sealed_cluster.tag_image(
        "localhost/broker-failover/broker:0.1.0", "localhost/broker-failover/broker:0.1.1"
    )
    sealed_cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "bc",
        "upgrade",
        "--type=merge",
        "-p",
        '{"spec": {"image": "localhost/broker-failover/broker:0.1.1"}}',
    )
    actives_seen: list[int] = []

    def rolled() -> bool:
        pods = sealed_cluster.get_json(namespace, "pods", "-l", "broker.failover.dev/cluster=upgrade")[
            "items"
        ]
        actives_seen.append(sum(p["metadata"]["labels"].get("role") == "active" for p in pods))
        hashes = {p["metadata"]["name"]: p["metadata"]["annotations"].get(TEMPLATE_HASH) for p in pods}
        row = bc_row(sealed_cluster, namespace, "upgrade")
        return (
            len(hashes) == 2
            and old_hash not in hashes.values()
            and row["ACTIVE"] == "upgrade-1"
            and row["PHASE"] == "Healthy"
        )

    wait_for("both pods replaced and the active moved to upgrade-1", rolled, timeout=120)
    assert max(actives_seen) <= 1, "two pods labelled active at once"
    reasons = event_reasons(sealed_cluster, namespace, "upgrade")
    assert "RollingUpdate" in reasons and "SwitchoverRequested" in reasons and "Switchover" in reasons, (
        reasons
    )
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "upgrade", "--wait=false")


TEMPLATE_HASH = "broker.failover.dev/template-hash"


def template_hash(cluster: SealedCluster, namespace: str, name: str) -> str:
    return str((pod(cluster, namespace, name) or {})["metadata"]["annotations"][TEMPLATE_HASH])


LEASE_RESTART_SECONDS = 15


def test_an_operator_killed_and_restarted_keeps_the_active_and_its_epoch(
    sealed_cluster: SealedCluster, crd_installed: None, simulators: dict[str, str], tmp_path: Path
) -> None:
    # Its own namespace and operator: this test kills the operator.
    namespace = new_namespace(sealed_cluster, "restart")
    first = start_operator(sealed_cluster, namespace, tmp_path / "first.log")
    second: LocalProcess | None = None
    try:
        # A 15 s lease: an operator restart on a loaded 2-core machine can take close to the
        # default 10 s (the broker would then rightly fence itself, and the epoch would move on).
        manifest = broker_cluster(
            "restart",
            replicas=2,
            backend={"url": simulators["backend"]},
            cloud={"url": simulators["cloud"]},
            heartbeat={"leaseSeconds": LEASE_RESTART_SECONDS},
        )
        assert apply(sealed_cluster, namespace, manifest).returncode == 0
        before = wait_for_row(
            sealed_cluster,
            namespace,
            "restart",
            "restart-0 active",
            lambda row: row["ACTIVE"] == "restart-0" and row["PHASE"] == "Healthy",
            timeout=90,
        )
        first.kill()
        second = start_operator(sealed_cluster, namespace, tmp_path / "second.log")
        # The new operator reads the active and the epoch back from status and renews that active;
        # it never activates anything with an epoch at or below one already granted.
        time.sleep(LEASE_RESTART_SECONDS + 2)  # longer than the lease: a lost active would show by now
        after = wait_for_row(
            sealed_cluster,
            namespace,
            "restart",
            "restart-0 still active",
            lambda row: row["PHASE"] == "Healthy",
        )
        assert after["ACTIVE"] == "restart-0"
        assert after["EPOCH"] == before["EPOCH"]  # renewed, not re-elected
        assert broker_gauge(sealed_cluster, namespace, "restart-0", "broker_epoch") == int(after["EPOCH"])
        assert broker_gauge(sealed_cluster, namespace, "restart-1", "broker_active") == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_broker_pods_pass_the_restricted_pod_security_standard_and_start(
    sealed_cluster: SealedCluster, crd_installed: None, simulators: dict[str, str], tmp_path: Path
) -> None:
    """Pod Security admission of the real API server, in a namespace that enforces "restricted":
    a pod without the operator's security contexts (non-root, no escalation, no capabilities,
    RuntimeDefault seccomp) would be refused and the cluster would never get a broker. The real
    kubelet and runc enforce those contexts, and the brokers start under them.

    With issue 42's pod knobs set, as a managed cluster's install would: a ServiceAccount of the
    namespace (its token still not mounted), a PriorityClass (the API server resolves its value),
    pull secrets (the operator's first, then the cluster's; the image is on the node, so the kubelet
    pulls nothing), labels and annotations, and the default requests (Burstable, not BestEffort)."""
    namespace = new_namespace(sealed_cluster, "restricted")
    sealed_cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    # The namespace really refuses what the standard forbids (a dry run: nothing starts).
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "main", "image": "localhost/broker-failover/broker:0.1.0"}]},
    }
    refused = sealed_cluster.kubectl(
        "-n", namespace, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bare), check=False
    )
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:' in refused.stderr, refused.stderr
    priority_class = f"broker-e2e-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "priorityclass", priority_class, "--value=1000")
    sealed_cluster.kubectl("-n", namespace, "create", "serviceaccount", "broker-identity")
    for secret in ("operator-regcred", "regcred"):
        sealed_cluster.kubectl(
            "-n", namespace, "create", "secret", "docker-registry", secret,
            "--docker-server=registry.invalid", "--docker-username=u", "--docker-password=p",
        )  # fmt: skip
    operator = start_operator(
        sealed_cluster,
        namespace,
        tmp_path / "operator.log",
        "--broker-image-pull-secrets",
        "operator-regcred",
    )
    try:
        manifest = broker_cluster(
            "locked",
            replicas=2,
            backend={"url": simulators["backend"]},
            cloud={"url": simulators["cloud"]},
            serviceAccountName="broker-identity",
            priorityClassName=priority_class,
            imagePullSecrets=[{"name": "regcred"}],
            podMetadata={"labels": {"team": "erp"}, "annotations": {"example.com/owner": "basis"}},
        )
        created = apply(sealed_cluster, namespace, manifest)
        assert created.returncode == 0, created.stderr
        wait_for_row(
            sealed_cluster,
            namespace,
            "locked",
            "locked-0 active and the cluster Healthy in a restricted namespace",
            lambda row: row["ACTIVE"] == "locked-0" and row["PHASE"] == "Healthy",
            timeout=90,
        )
        body = pod(sealed_cluster, namespace, "locked-1")
        assert body is not None
        assert body["spec"]["securityContext"]["runAsUser"] == 10001
        assert body["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        # The pod knobs (issue 42), as the API server stored the pod.
        spec = body["spec"]
        assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (
            "broker-identity",
            False,
        )
        assert not [v for v in spec["volumes"] if v["name"].startswith("kube-api-access")], spec["volumes"]
        assert (spec["priorityClassName"], spec["priority"]) == (priority_class, 1000)
        assert spec["imagePullSecrets"] == [{"name": "operator-regcred"}, {"name": "regcred"}]
        assert body["metadata"]["labels"]["team"] == "erp"
        assert body["metadata"]["annotations"]["example.com/owner"] == "basis"
        assert spec["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
        assert body["status"]["qosClass"] == "Burstable"
    finally:
        operator.stop()
        print(operator.tail())  # shown by pytest on failure
        sealed_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        sealed_cluster.kubectl("delete", "priorityclass", priority_class, "--wait=false", check=False)


def claim_names(cluster: SealedCluster, namespace: str, name: str) -> list[str]:
    """``kubectl get pvc`` of one BrokerCluster's journal claims (bound by local-path-provisioner)."""
    listing = cluster.get_json(namespace, "pvc", "-l", f"broker.failover.dev/cluster={name}")
    return sorted(c["metadata"]["name"] for c in (listing or {}).get("items", []))


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_scale_down_and_deletion_keep_or_delete_claims_by_the_retention_policy(
    sealed_cluster: SealedCluster,
    namespace: str,
    simulators: dict[str, str],
    operator: LocalProcess,
    policy: str,
) -> None:
    name = f"shrink-{policy.lower()}"
    manifest = broker_cluster(
        name,
        replicas=3,
        company=f"6000-{policy}",
        persistentVolumeClaimRetentionPolicy={"whenScaled": policy, "whenDeleted": policy},
        backend={"url": simulators["backend"]},
        cloud={"url": simulators["cloud"]},
    )
    assert apply(sealed_cluster, namespace, manifest).returncode == 0
    wait_for_row(
        sealed_cluster,
        namespace,
        name,
        f"{name}-0 active",
        lambda row: row["ACTIVE"] == f"{name}-0" and row["PHASE"] == "Healthy",
        timeout=120,
    )
    claims = [f"journal-{name}-{ordinal}" for ordinal in range(3)]
    assert claim_names(sealed_cluster, namespace, name) == claims
    owners = {
        claim: [
            ref["uid"]
            for ref in sealed_cluster.get_json(namespace, "pvc", claim)["metadata"].get("ownerReferences")
            or []
        ]
        for claim in claims
    }
    uid = sealed_cluster.get_json(namespace, "bc", name)["metadata"]["uid"]
    assert set(map(tuple, owners.values())) == ({(uid,)} if policy == "Delete" else {()}), owners

    patched = sealed_cluster.kubectl(
        "-n", namespace, "patch", "bc", name, "--type=merge", "-p", '{"spec": {"replicas": 2}}'
    )
    assert patched.returncode == 0, patched.stderr
    wait_for(f"pod {name}-2 gone", lambda: pod(sealed_cluster, namespace, f"{name}-2") is None, timeout=90)
    if policy == "Delete":
        wait_for(
            f"journal-{name}-2 deleted",
            lambda: claim_names(sealed_cluster, namespace, name) == claims[:2],
            timeout=60,
        )
        # Waited for: kopf posts events in the background, after the deletion it reports.
        wait_for(
            "the ClaimDeleted event",
            lambda: "ClaimDeleted" in event_reasons(sealed_cluster, namespace, name),
            timeout=30,
        )
    else:
        time.sleep(6)  # three reconcile periods of the operator (--reconcile-seconds 2)
        assert claim_names(sealed_cluster, namespace, name) == claims
    assert bc_row(sealed_cluster, namespace, name)["ACTIVE"] == f"{name}-0"

    # Deleting the BrokerCluster: the garbage collector takes the owned claims (whenDeleted: Delete),
    # or they stay for a BrokerCluster created again under the name (Retain).
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", name, "--wait=false")
    wait_for(
        f"pods of {name} gone",
        lambda: (
            not sealed_cluster.get_json(namespace, "pods", "-l", f"broker.failover.dev/cluster={name}")[
                "items"
            ]
        ),
        timeout=90,
    )
    if policy == "Delete":
        wait_for(
            f"claims of {name} gone", lambda: claim_names(sealed_cluster, namespace, name) == [], timeout=90
        )
    else:
        time.sleep(4)
        assert claim_names(sealed_cluster, namespace, name) == claims


def ready_condition(cluster: SealedCluster, namespace: str, name: str) -> dict[str, Any] | None:
    status = (cluster.get_json(namespace, "bc", name) or {}).get("status") or {}
    conditions = status.get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


def test_a_missing_secret_is_named_in_the_ready_condition_and_an_event_until_it_exists(
    sealed_cluster: SealedCluster, namespace: str, simulators: dict[str, str], operator: LocalProcess
) -> None:
    """As a new user tried it: the example applied before the Secret it names. The cluster must say
    which Secret its pods wait for (not only "Pending"), and turn Ready once the Secret exists."""
    name = "unready"
    manifest = broker_cluster(
        name,
        company="4100",  # a pair of its own: the module's namespace holds other clusters
        replicas=2,
        backend={"urlSecretRef": {"name": "unready-endpoints", "key": "backend"}},
        cloud={"url": simulators["cloud"]},
    )
    assert apply(sealed_cluster, namespace, manifest).returncode == 0
    seen: list[Any] = []

    def stuck_condition() -> dict[str, Any] | None:
        condition = ready_condition(sealed_cluster, namespace, name)
        seen[:] = [condition]
        # No pod is made before the Secret exists (it would mount any Secret of that name that
        # appeared later): the credentials check names it (issue 39).
        named = condition and condition["reason"] == "CredentialRefused"
        return condition if named and "unready-endpoints" in condition["message"] else None

    try:
        stuck = wait_for("Ready=False naming the missing Secret", stuck_condition, timeout=90)
    except pytest.fail.Exception:
        pods = sealed_cluster.get_json(namespace, "pods", "-l", f"broker.failover.dev/cluster={name}")
        statuses = [p.get("status") for p in (pods or {}).get("items", [])]
        pytest.fail(f"Ready condition {seen}; pod statuses {statuses}")
    assert stuck["status"] == "False"
    assert (
        "Secret " + namespace + "/unready-endpoints (spec.backend.urlSecretRef) does not exist"
        in stuck["message"]
    )
    assert "broker.failover.dev/credential=true" in stuck["message"]
    wait_for_event(sealed_cluster, namespace, name, "CredentialRefused")
    sealed_cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", "unready-endpoints",
        f"--from-literal=backend={simulators['backend']}",
    )  # fmt: skip
    sealed_cluster.kubectl(
        "-n", namespace, "label", "secret", "unready-endpoints", "broker.failover.dev/credential=true"
    )
    ready = wait_for(
        "Ready=True once the Secret exists",
        lambda: (c := ready_condition(sealed_cluster, namespace, name)) and c["status"] == "True" and c,
        timeout=120,
    )
    assert ready["reason"] == "ActiveBrokerServing" and f"{name}-0 is active" in ready["message"]
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", name, "--wait=false")


def test_a_networkpolicy_is_created_accepted_and_the_brokers_are_heartbeated_on_the_admin_port(
    sealed_cluster: SealedCluster, namespace: str, simulators: dict[str, str], operator: LocalProcess
) -> None:
    """spec.networkPolicy on the real API server: the CRD takes and refuses peers, the API server
    accepts the operator's NetworkPolicy, and the brokers go Active through the admin port (the
    main port refuses Heartbeat). The local cluster's network plugin (the CNI bridge) does not
    enforce NetworkPolicies: what they admit is checked here as written."""
    erp = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "erp"}}}
    relay = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.9.0/24"]}}
    refused = apply(
        sealed_cluster,
        namespace,
        broker_cluster("guarded", company="7100", networkPolicy={"enabled": True, "sendMessagesFrom": [{}]}),
    )
    assert refused.returncode != 0
    assert "spec.networkPolicy.sendMessagesFrom[] entries must set podSelector" in refused.stderr
    manifest = broker_cluster(
        "guarded",
        replicas=2,
        company="7100",  # a pair of its own: the module's namespace holds other clusters
        backend={"url": simulators["backend"]},
        cloud={"url": simulators["cloud"]},
        networkPolicy={"enabled": True, "sendMessagesFrom": [erp, relay]},
    )
    created = apply(sealed_cluster, namespace, manifest)
    assert created.returncode == 0, created.stderr
    uid = sealed_cluster.get_json(namespace, "bc", "guarded")["metadata"]["uid"]

    policy = wait_for(
        "networkpolicy/guarded-brokers-ingress",
        lambda: sealed_cluster.get_json(namespace, "networkpolicy", "guarded-brokers-ingress"),
    )
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "guarded", uid)
    operator_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_POD_NAMESPACE}},
        "podSelector": {"matchLabels": dict(label.split("=") for label in OPERATOR_POD_LABELS.split(","))},
    }
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # Egress (issue 39): DNS, and TCP to every pod and every address but the link-local ranges.
    assert policy["spec"]["egress"] == [
        dict(network_policy.DNS_EGRESS),
        {"to": [dict(peer) for peer in network_policy.DEFAULT_EGRESS_PEERS], "ports": [{"protocol": "TCP"}]},
    ]
    assert policy["spec"]["ingress"] == [
        {"from": [operator_peer], "ports": [{"protocol": "TCP", "port": "admin"}]},
        {"from": [erp, relay, operator_peer], "ports": [{"protocol": "TCP", "port": "soap"}]},
    ]
    listed = sealed_cluster.kubectl("-n", namespace, "get", "networkpolicy", "-o", "name").stdout.split()
    assert "networkpolicy.networking.k8s.io/guarded-brokers-ingress" in listed

    # The brokers are heartbeated on their admin port: one goes Active, the other is a ready standby.
    wait_for_row(
        sealed_cluster,
        namespace,
        "guarded",
        "guarded-0 active and the cluster Healthy",
        lambda row: row["ACTIVE"] == "guarded-0" and row["PHASE"] == "Healthy",
        timeout=90,
    )
    body = pod(sealed_cluster, namespace, "guarded-0")
    assert body is not None
    (container,) = body["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"soap": 8080, "admin": 8081}
    # The main port refuses the operator's call, naming the admin port; so Healthy came through 8081.
    token = sealed_cluster.kubectl(
        "-n", namespace, "get", "secret", "guarded-broker-token", "-o", "jsonpath={.data.token}"
    ).stdout
    heartbeat = HEARTBEAT_CHECK.encode()
    # Over TLS (the pods serve it by default), with the operator's own client certificate: the
    # refusal is the main port's, not the handshake's.
    call = pod_call(
        sealed_cluster, body, 8080, "/soap", data=heartbeat, client=True, timeout=10,
        headers={
            "Content-Type": "text/xml; charset=utf-8",
            "Authorization": f"Bearer {base64.b64decode(token).decode().strip()}",
        },
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as fault:
        sealed_cluster.call_in_network(call, timeout=30)
    text = fault.value.read().decode()
    assert "WRONG_PORT" in text and "admin port 8081" in text, text
    brokers = sealed_cluster.get_json(namespace, "bc", "guarded")["status"]["brokers"]
    assert {b["name"]: b["state"] for b in brokers} == {"guarded-0": "Active", "guarded-1": "Inactive"}

    # Turned off, the policy goes; the brokers keep running.
    sealed_cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "bc",
        "guarded",
        "--type=merge",
        "-p",
        '{"spec": {"networkPolicy": {"enabled": false}}}',
    )
    wait_for(
        "networkpolicy/guarded-brokers-ingress deleted",
        lambda: sealed_cluster.get_json(namespace, "networkpolicy", "guarded-brokers-ingress") is None,
        timeout=30,
    )
    wait_for_event(sealed_cluster, namespace, "guarded", "Deleted")
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "guarded", "--wait=false")


# A renewLease=false check: it would change nothing even where it were accepted.
HEARTBEAT_CHECK = (
    '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
    f'xmlns:t="{soap.NAMESPACE}"><soapenv:Body><t:Heartbeat><t:active>true</t:active><t:epoch>0</t:epoch>'
    "<t:operatorId>e2e</t:operatorId><t:renewLease>false</t:renewLease></t:Heartbeat></soapenv:Body>"
    "</soapenv:Envelope>"
)
