"""The relay as users run it, deployed on the sealed local cluster: chart, example, simulator pods.

Shared by the Service-path tests, the Kubernetes failover benchmark, the soak and the demo:
``deploy_relay`` installs the chart (the operator as a pod, in-cluster config through the
``kubernetes`` Service) into a namespace, creates the Secrets the example names, starts the
SAP backend and the cloud as simulator pods behind Services of their own, and applies
``examples/brokercluster-pods.yaml``. The backend simulator sends to
``http://orders-active.<namespace>.svc:8080``: the ``-active`` Service, through CoreDNS and
kube-proxy, the one address a producer follows.

The simulators' control API (``/sim/...``) is reached from this process through
``SealedCluster.call_in_network``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import yaml

from broker_contracts import environment
from local_cluster.cluster import REPO_ROOT
from local_cluster.image_build import TAG as IMAGE_TAG
from local_cluster.local_path_storage import SHARED_CLASS
from local_cluster.sealed_cluster import SealedCluster

CHART = REPO_ROOT / "charts" / "broker-failover"
EXAMPLE = REPO_ROOT / "examples" / "brokercluster-pods.yaml"
CLUSTER_NAME = "orders"  # the example's name; its account/company are acme/1000
MESSAGE_LOG_CLAIM = "broker-message-logs"  # the example's spec.messageLog.claimName


def message_log_claim() -> dict[str, Any]:
    """The shared message-log store's claim, as a user creates it before the chart: ReadWriteMany,
    so of a class that offers it (the local cluster's ``shared-path``; on a real cluster an NFS,
    CephFS, EFS or Azure Files class; a cluster's default class is usually ReadWriteOnce only)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": MESSAGE_LOG_CLAIM},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": SHARED_CLASS,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


SIM_PORT = 8080
# The simulators' images, as `make images` tags them (imported into the node; never pulled).
CLOUD_IMAGE = f"localhost/broker-failover/cloud-simulator:{IMAGE_TAG}"
BACKEND_IMAGE = f"localhost/broker-failover/backend-simulator:{IMAGE_TAG}"


class RelayError(RuntimeError):
    """A step of the deployment did not happen in time; says which and what was seen."""


def wait_until(what: str, probe: Any, timeout: float, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise RelayError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def simulator_objects(
    name: str, image: str, args: list[str], env: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A simulator pod (ready once it listens) and a Service of the same name in front of it."""
    labels = {"app": name}
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "args": ["--host=0.0.0.0", f"--port={SIM_PORT}", *args],
        "readinessProbe": {"tcpSocket": {"port": SIM_PORT}, "periodSeconds": 1},
        "env": env or [],
        # As the chart's pods and the brokers: the simulators write nothing (no --record-dir here).
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            # Enforced by the node's kubelet and runc, as on any cluster.
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": labels, "ports": [{"port": SIM_PORT, "targetPort": SIM_PORT}]},
    }
    return [pod, service]


@dataclass
class Relay:
    cluster: SealedCluster
    namespace: str
    release: str
    backend_url: str  # ClusterIP URLs of the simulators, for their /sim API
    cloud_url: str
    inbound_streams: int  # the cloud's streams toward the backend, for judging inbound

    def sim(self, url: str, payload: dict[str, Any] | None = None) -> Any:
        def call() -> Any:
            data = None if payload is None else json.dumps(payload).encode()
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read())

        return self.cluster.call_in_network(call)

    def backend(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.sim(f"{self.backend_url}{path}", payload)

    def cloud(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.sim(f"{self.cloud_url}{path}", payload)

    def all_confirmed(self) -> bool:
        """Every message confirmed to its source, both ways, as the simulators see it."""
        return bool(self.backend("/sim/status")["allConfirmed"]) and bool(
            self.cloud("/sim/status")["inboundAllConfirmed"]
        )

    def wait_all_confirmed(self, timeout: float = 240) -> None:
        """Wait (bounded) until :meth:`all_confirmed`: the traffic is over, both ways."""
        wait_until("every message confirmed, both ways", self.all_confirmed, timeout, 1)

    def record_violations(self) -> dict[str, int]:
        """Messages lost, taken twice and taken out of order by the targets, both directions, from
        the simulators' own records.

        Safe while traffic flows: outbound is judged against the backend's cursors, read first
        (every seq below a stream's cursor was confirmed, so the cloud must have taken it), not
        against what the backend still has to send. Inbound is judged against everything the cloud
        produced: call it once the cloud reports every inbound message confirmed.
        """
        cursors = self.backend("/sim/status")["cursors"]
        inbound_per_stream = int(self.cloud("/sim/status")["inboundTotal"]) // self.inbound_streams
        outbound, inbound = self.cloud("/sim/received"), self.backend("/sim/received")
        lost = sum(
            len(set(range(1, int(cursor))) - set(outbound.get(stream, [])))
            for stream, cursor in cursors.items()
        )
        lost += sum(len(set(range(1, inbound_per_stream + 1)) - set(seqs)) for seqs in inbound.values())
        lost += (self.inbound_streams - len(inbound)) * inbound_per_stream  # streams the backend never saw
        received = [*outbound.values(), *inbound.values()]
        return {
            "lost": lost,
            "twice": sum(len(seqs) - len(set(seqs)) for seqs in received),
            "out-of-order": sum(1 for seqs in received for a, b in itertools.pairwise(seqs) if b <= a),
        }

    def get(self, *what: str) -> Any:
        """``kubectl get WHAT -o json`` in the relay's namespace, or None (``ClusterAccess.get_json``)."""
        return self.cluster.get_json(self.namespace, *what)

    def status(self) -> dict[str, Any]:
        return dict(((self.get("brokercluster", CLUSTER_NAME) or {}).get("status")) or {})

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.get("pod", name)
        if not pod:
            raise RelayError(f"pod {self.namespace}/{name} not found")
        return dict(pod)

    def pod_ready(self, name: str) -> bool:
        conditions = ((self.get("pod", name) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def kill_9(self, pod_name: str) -> None:
        """SIGKILL every process of the pod's container, as a crash or an OOM kill would."""
        self.cluster.signal_container(self.pod(pod_name), "SIGKILL")

    def active_service_addresses(self) -> list[str]:
        slices = self.get("endpointslices", "-l", f"kubernetes.io/service-name={CLUSTER_NAME}-active") or {}
        return [
            address
            for item in slices.get("items") or []
            for endpoint in item.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready", True)
            for address in endpoint.get("addresses") or []
        ]

    def operator_diagnostics(self, log_lines: int = 200) -> str:
        """What to read when a test of this relay fails, taken before its namespace goes: each
        operator pod (node, restarts, the last termination), its log (and the previous
        container's, after a restart) and the namespace's events, oldest first."""
        selector = "app.kubernetes.io/component=operator"
        parts: list[str] = []
        for pod in (self.get("pods", "-l", selector) or {}).get("items") or []:
            name = pod["metadata"]["name"]
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            restarts = sum(int(status.get("restartCount", 0)) for status in statuses)
            last = [status.get("lastState", {}).get("terminated") for status in statuses]
            parts.append(
                f"--- operator pod {name} on {pod['spec'].get('nodeName')}: restarts {restarts}, "
                f"last termination {[t for t in last if t] or None}"
            )
            for previous in (True, False) if restarts else (False,):
                logs = self.cluster.kubectl(
                    "-n", self.namespace, "logs", name, "--timestamps", f"--tail={log_lines}",
                    *(["--previous"] if previous else []), check=False,
                )  # fmt: skip
                parts.append(
                    f"--- {'previous ' if previous else ''}log of {name}\n{logs.stdout}{logs.stderr}"
                )
        events = self.cluster.kubectl(
            "-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp", check=False
        )
        parts.append(f"--- events in {self.namespace}\n{events.stdout}{events.stderr}")
        return "\n".join(parts)

    def uninstall(self) -> None:
        # The BrokerCluster gone first (bounded): its operator removes its finalizer. Uninstalled
        # before that, it leaves it for good, and a later deletion of the CRD then never ends.
        self.cluster.kubectl(
            "-n", self.namespace, "delete", "brokercluster", CLUSTER_NAME, "--timeout=60s",
            timeout=90, check=False,
        )  # fmt: skip
        self.cluster.helm("uninstall", self.release, "--namespace", self.namespace, "--wait", check=False)


@dataclass
class Feeder:
    """Adds ``per_stream`` outbound messages per stream every ``tick`` seconds through the backend
    simulator's ``/sim/produce``, from a thread in the cluster's network, until ``stop`` is set."""

    relay: Relay
    per_stream: int = 5
    tick: float = 0.1
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Feeder:
        def feed() -> None:
            url = f"{self.relay.backend_url}/sim/produce"
            body = json.dumps({"count": self.per_stream}).encode()
            next_tick = time.monotonic()
            while not self.stop.is_set():
                request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                # The backend simulator never goes down here; a slow call is just skipped.
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(request, timeout=2).close()
                next_tick += self.tick
                time.sleep(max(0.0, next_tick - time.monotonic()))

        thread = threading.Thread(
            target=self.relay.cluster.call_in_network, args=(feed, 24 * 3600), daemon=True, name="feeder"
        )
        thread.start()
        return self


@dataclass(frozen=True)
class BackendClient:
    """How the backend simulator retries while the ``-active`` Service moves (its own defaults:
    a 0.1 s connect timeout, fast failures backed off from 20 ms to 250 ms). The failover
    benchmarks measure to the first bundle accepted after a fault, so a slow retry of the client
    would be counted as the failover's; they use ``FAST_RETRYING_CLIENT``."""

    connect_timeout_seconds: float
    backoff_max_seconds: float


# A connect given up after 30 ms (a SYN-ACK within the pod network takes well under a
# millisecond; a SYN that kube-proxy's reject dropped is resent by TCP only after a second), and
# a refused or BROKER_INACTIVE request tried again every 20 ms.
FAST_RETRYING_CLIENT = BackendClient(connect_timeout_seconds=0.03, backoff_max_seconds=0.02)


def example_secrets(namespace: str) -> list[dict[str, Any]]:
    """The Secrets ``examples/brokercluster-pods.yaml`` names, for the simulators behind Services of
    ``namespace``: the targets' URLs, what the brokers present to them (never inside a URL; the
    simulators take any), and the backend's token (32 random bytes, the operator's minimum). Each
    opts in as a credential, or the operator would use none of them (docs/operator.md)."""

    def secret(name: str, data: dict[str, str], kind: str = "Opaque") -> dict[str, Any]:
        labels = {"broker.failover.dev/credential": "true"}
        meta = {"name": name, "namespace": namespace, "labels": labels}
        return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": meta, "stringData": data}

    base = f"http://{{}}.{namespace}.svc:{SIM_PORT}"
    return [
        secret("erp-endpoints", {"backend": base.format("backend"), "cloud": base.format("cloud")}),
        secret(
            "erp-login", {"username": "broker", "password": os.urandom(16).hex()}, "kubernetes.io/basic-auth"
        ),
        secret("erp-cloud-key", {"token": os.urandom(16).hex()}),
        secret("erp-broker-credential", {"token": os.urandom(16).hex()}),
    ]


def deploy_relay(
    cluster: SealedCluster,
    namespace: str,
    *,
    streams: int,
    messages_per_stream: int,
    bundle_size: int = 20,
    lanes: int = 2,
    request_timeout_seconds: float | None = None,
    client: BackendClient | None = None,
    helm_values: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    simulators_node: str | None = None,
) -> Relay:
    """Install everything in ``namespace`` (which must exist); return once the cluster is Healthy.

    The BrokerCluster is the example's, with ``spec``'s top-level fields in place of its own
    (``{"heartbeat": {...}}`` replaces the whole heartbeat section). ``simulators_node`` pins the
    two simulator pods to that node (a node fault test keeps the traffic's source and sink off the
    node it breaks)."""

    def kubectl(*args: str, input: str | None = None) -> None:
        cluster.kubectl("-n", namespace, *args, input=input)

    wait_until(
        "the namespace's default ServiceAccount",
        lambda: cluster.get_json(namespace, "serviceaccount", "default") is not None,
        60,
    )
    kubectl("apply", "-f", "-", input=json.dumps(message_log_claim()))
    release = f"bf-{namespace}"
    values = {"operator.watchNamespaces": f"{{{namespace}}}", **(helm_values or {})}
    settings = [argument for key, value in values.items() for argument in ("--set", f"{key}={value}")]
    cluster.helm(
        "install", release, str(CHART), "--namespace", namespace, *settings, "--wait", "--timeout=240s",
        timeout=300,
    )  # fmt: skip
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": example_secrets(namespace)}),
    )
    backend_args = [
        f"--broker-url=http://{CLUSTER_NAME}-active.{namespace}.svc:8080",
        "--account=acme",
        "--company=1000",
        f"--streams={streams}",
        f"--messages-per-stream={messages_per_stream}",
        f"--bundle-size={bundle_size}",
        f"--lanes={lanes}",
    ]
    if request_timeout_seconds is not None:
        backend_args.append(f"--request-timeout-seconds={request_timeout_seconds}")
    if client is not None:
        backend_args += [
            f"--connect-timeout-seconds={client.connect_timeout_seconds}",
            f"--backoff-max-seconds={client.backoff_max_seconds}",
        ]
    token_env = [
        {
            "name": environment.BROKER_BACKEND_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": "erp-broker-credential", "key": "token"}},
        }
    ]
    objects = [
        *simulator_objects(
            "cloud",
            CLOUD_IMAGE,
            [f"--inbound-streams={streams}", f"--inbound-messages-per-stream={messages_per_stream}"],
        ),
        *simulator_objects("backend", BACKEND_IMAGE, backend_args, token_env),
    ]
    if simulators_node is not None:
        for pod in (item for item in objects if item["kind"] == "Pod"):
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": simulators_node}
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    brokercluster = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    brokercluster["spec"].update(spec or {})
    kubectl("apply", "-f", "-", input=json.dumps(brokercluster))
    relay = Relay(cluster, namespace, release, backend_url="", cloud_url="", inbound_streams=streams)

    wait_until(
        "the BrokerCluster Healthy with an active broker",
        lambda: (s := relay.status()).get("phase") == "Healthy" and s.get("active"),
        240,
    )
    wait_until("both simulators ready", lambda: relay.pod_ready("cloud") and relay.pod_ready("backend"), 120)
    for name in ("backend", "cloud"):
        ip = relay.get("service", name)["spec"]["clusterIP"]
        setattr(relay, f"{name}_url", f"http://{ip}:{SIM_PORT}")
    return relay
