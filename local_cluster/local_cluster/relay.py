"""The relay as users run it, deployed on the sealed local cluster: chart, example, simulator pods.

Shared by the Service-path tests, the Kubernetes failover benchmark, the soak and the demo:
``deploy_relay`` installs the chart (the operator as a pod, in-cluster config through the
``kubernetes`` Service) into a namespace, creates the Secrets the example names, starts the
SAP backend and the cloud as simulator pods behind Services of their own, and applies
``examples/brokercluster-pods.yaml``. The backend simulator sends to
``http://orders-active.<namespace>.svc:8080``: the ``-active`` Service, through CoreDNS and
kube-proxy, the one address a producer follows.

TLS (ARCHITECTURE.md "Channels and trust"; :mod:`local_cluster.relay_tls` makes the certificates):
by default both simulators serve HTTPS with certificates from a CA made for the run, the brokers
call them at ``https://`` URLs verified against that CA (``spec.tls.upstreamCASecretRef``), and
the harness verifies them too. ``upstream_tls=False`` is the plain-HTTP opt-out. The backend →
broker leg is TLS too (``broker_tls``, default :data:`BROKER_TLS`), as the operator's brokers serve
it by default; ``broker_tls=False`` installs the chart with ``operator.brokerTls=false`` so that
the brokers serve plain HTTP to match. :class:`RelayTls` holds the switches.

The simulators' control API (``/sim/...``) is reached from this process through
``SealedCluster.call_in_network``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from broker_contracts import environment
from local_cluster.cluster import REPO_ROOT
from local_cluster.image_build import TAG as IMAGE_TAG
from local_cluster.local_path_storage import SHARED_CLASS
from local_cluster.relay_tls import (
    SecretMount,
    SimulatorsPki,
    brokercluster_tls,
    calling_brokers,
    create_simulators_pki,
    pki_secrets,
    service_context,
    service_host,
    serving,
)
from local_cluster.sealed_cluster import SealedCluster

CHART = REPO_ROOT / "charts" / "broker-failover"
CRD_FILE = REPO_ROOT / "crds" / "broker.failover.dev_brokerclusters.yaml"
CRD_NAME = "brokerclusters.broker.failover.dev"
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


# The backend → broker leg over TLS, as the operator's brokers serve it by default
# (ControllerSettings.broker_tls, the chart's operator.brokerTls). deploy_relay's and the demo's
# default; False installs the operator with operator.brokerTls=false, so both ends speak plain HTTP.
BROKER_TLS = True


@dataclass(frozen=True)
class RelayTls:
    """Which legs of the relay speak TLS.

    ``upstream``: the simulators serve HTTPS and the brokers call them at ``https://`` URLs,
    verified against the run's simulators' CA (the default; False: plain HTTP, the opt-out).
    ``broker``: the backend calls ``https://<cluster>-active.<ns>.svc:8080``, verified against the
    ``ca.crt`` of the operator-written Secret ``<cluster>-tls`` (needs brokers that serve TLS).
    ``backend_client_certificate``: with ``broker``, the backend presents its client certificate
    and the BrokerCluster allows only its subject (``spec.tls.backendClients``).
    """

    upstream: bool = True
    broker: bool = BROKER_TLS
    backend_client_certificate: bool = False

    def __post_init__(self) -> None:
        if self.backend_client_certificate and not self.broker:
            raise ValueError(
                "RelayTls(backend_client_certificate=True) needs broker=True: a client certificate "
                "is presented to brokers that serve TLS only"
            )

    def pki(self, namespace: str) -> SimulatorsPki | None:
        """The run's simulators' PKI, when a leg needs it (openssl, about a second)."""
        if not (self.upstream or self.backend_client_certificate):
            return None
        return create_simulators_pki(namespace, backend_client=self.backend_client_certificate)

    def sim_scheme(self) -> str:
        return "https" if self.upstream else "http"

    def broker_url(self, namespace: str) -> str:
        """The backend's broker URL: the ``-active`` Service by its name."""
        return f"{'https' if self.broker else 'http'}://{CLUSTER_NAME}-active.{namespace}.svc:8080"


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
    name: str,
    image: str,
    args: list[str],
    env: list[dict[str, Any]] | None = None,
    mounts: Sequence[SecretMount] = (),
) -> list[dict[str, Any]]:
    """A simulator pod (ready once it listens: a TCP probe, the same over HTTP and HTTPS) and a
    Service of the same name in front of it; ``mounts``: Secrets it reads (its TLS files)."""
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
    if mounts:
        container["volumeMounts"] = [mount.container_mount() for mount in mounts]
    pod: dict[str, Any] = {
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
    if mounts:
        pod["spec"]["volumes"] = [mount.pod_volume() for mount in mounts]
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
    simulators_ca: bytes | None = None  # None: the simulators serve plain HTTP

    def sim_context(self, simulator: str) -> ssl.SSLContext | None:
        """How to call ``simulator`` (``backend``, ``cloud``) at its ClusterIP URL: verified against
        the run's CA under its Service's name (``relay_tls.service_context``), or None for HTTP."""
        if self.simulators_ca is None:
            return None
        return service_context(self.simulators_ca, service_host(simulator, self.namespace))

    def sim(self, simulator: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """``simulator``'s ``path`` (GET, or POST of ``payload``), its JSON reply."""
        url = f"{getattr(self, f'{simulator}_url')}{path}"
        context = self.sim_context(simulator)

        def call() -> Any:
            data = None if payload is None else json.dumps(payload).encode()
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10, context=context) as reply:
                return json.loads(reply.read())

        return self.cluster.call_in_network(call)

    def backend(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.sim("backend", path, payload)

    def cloud(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.sim("cloud", path, payload)

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
            context = self.relay.sim_context("backend")
            body = json.dumps({"count": self.per_stream}).encode()
            next_tick = time.monotonic()
            while not self.stop.is_set():
                request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                # The backend simulator never goes down here; a slow call is just skipped.
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(request, timeout=2, context=context).close()
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


def example_secrets(namespace: str, scheme: str = "http") -> list[dict[str, Any]]:
    """The Secrets ``examples/brokercluster-pods.yaml`` names, for the simulators behind Services of
    ``namespace``: the targets' URLs (``scheme``: ``https`` when the simulators serve it), what the
    brokers present to them (never inside a URL; the simulators take any), and the backend's token
    (32 random bytes, the operator's minimum). Each opts in as a credential, or the operator would
    use none of them (docs/operator.md)."""

    def secret(name: str, data: dict[str, str], kind: str = "Opaque") -> dict[str, Any]:
        labels = {"broker.failover.dev/credential": "true"}
        meta = {"name": name, "namespace": namespace, "labels": labels}
        return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": meta, "stringData": data}

    base = f"{scheme}://{{}}.{namespace}.svc:{SIM_PORT}"
    return [
        secret("erp-endpoints", {"backend": base.format("backend"), "cloud": base.format("cloud")}),
        secret(
            "erp-login", {"username": "broker", "password": os.urandom(16).hex()}, "kubernetes.io/basic-auth"
        ),
        secret("erp-cloud-key", {"token": os.urandom(16).hex()}),
        secret("erp-broker-credential", {"token": os.urandom(16).hex()}),
    ]


def relay_secrets(namespace: str, tls: RelayTls, pki: SimulatorsPki | None) -> list[dict[str, Any]]:
    """:func:`example_secrets` with the URLs ``tls`` calls for, and the Secrets of ``pki``
    (``relay_tls.pki_secrets``: ``simulators-ca``, ``<simulator>-simulator-tls``, and
    ``backend-client-tls`` when the backend presents a certificate)."""
    return [*example_secrets(namespace, tls.sim_scheme()), *(pki_secrets(pki) if pki is not None else [])]


def relay_simulators(
    namespace: str, tls: RelayTls, *, backend_args: list[str], cloud_args: list[str]
) -> list[dict[str, Any]]:
    """The cloud and the backend as pods behind Services (:func:`simulator_objects`), the backend
    sending to :meth:`RelayTls.broker_url` with the backend's token from ``erp-broker-credential``;
    each serving HTTPS with ``tls.upstream``, the backend calling brokers over TLS with
    ``tls.broker``. ``backend_args`` and ``cloud_args``: the traffic's shape."""
    token_env = [
        {
            "name": environment.BROKER_BACKEND_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": "erp-broker-credential", "key": "token"}},
        }
    ]
    mounts: dict[str, list[SecretMount]] = {"cloud": [], "backend": []}
    args: dict[str, list[str]] = {
        "cloud": list(cloud_args),
        "backend": [f"--broker-url={tls.broker_url(namespace)}", *backend_args],
    }
    if tls.upstream:
        for simulator in ("cloud", "backend"):
            mount, flags = serving(simulator)
            mounts[simulator].append(mount)
            args[simulator] += flags
    if tls.broker:
        broker_mounts, flags = calling_brokers(
            CLUSTER_NAME, client_certificate=tls.backend_client_certificate
        )
        mounts["backend"] += broker_mounts
        args["backend"] += flags
    return [
        *simulator_objects("cloud", CLOUD_IMAGE, args["cloud"], mounts=mounts["cloud"]),
        *simulator_objects("backend", BACKEND_IMAGE, args["backend"], token_env, mounts["backend"]),
    ]


def relay_brokercluster(tls: RelayTls, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example's BrokerCluster with the ``spec.tls`` that ``tls`` needs (``upstreamCASecretRef``
    naming ``simulators-ca``, ``backendClients``), then ``spec``'s top-level fields in place of its
    own (a ``tls`` there replaces the relay's whole)."""
    brokercluster = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    spec_tls = brokercluster_tls(
        upstream=tls.upstream, backend_client_certificate=tls.backend_client_certificate
    )
    if spec_tls is not None:
        brokercluster["spec"]["tls"] = {**(brokercluster["spec"].get("tls") or {}), **spec_tls}
    brokercluster["spec"].update(spec or {})
    return dict(brokercluster)


def apply_crd(cluster: SealedCluster) -> None:
    """The BrokerCluster CRD, applied once another test's deletion of it has finished (an apply to a
    CRD being deleted is lost with it), and Established."""

    def not_being_deleted() -> bool:
        crd = cluster.get_json("default", "crd", CRD_NAME) or {}
        return not crd.get("metadata", {}).get("deletionTimestamp")

    wait_until("an earlier test's deletion of the CRD to finish", not_being_deleted, 120)
    cluster.kubectl("apply", "-f", str(CRD_FILE))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")


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
    upstream_tls: bool = True,
    broker_tls: bool = BROKER_TLS,
    backend_client_certificate: bool = False,
    backend_extra_args: Sequence[str] = (),
) -> Relay:
    """Install everything in ``namespace`` (which must exist); return once the cluster is Healthy.

    The BrokerCluster is the example's, with ``spec``'s top-level fields in place of its own
    (``{"heartbeat": {...}}`` replaces the whole heartbeat section). ``simulators_node`` pins the
    two simulator pods to that node (a node fault test keeps the traffic's source and sink off the
    node it breaks).

    TLS (:class:`RelayTls`), the Secrets in ``relay_tls``:

    * ``upstream_tls`` (default True): the cloud and backend simulators serve HTTPS with
      certificates from a CA made for this run (Secrets ``cloud-simulator-tls`` and
      ``backend-simulator-tls``), ``erp-endpoints`` holds ``https://`` URLs, and the BrokerCluster's
      ``spec.tls.upstreamCASecretRef`` names ``simulators-ca`` (the CA, key ``ca.crt``, labelled as
      a credential), so the brokers verify both targets. The returned :class:`Relay` calls the
      simulators' ``/sim`` API verified against the same CA. False: plain HTTP on those legs, and
      everything else as it was before TLS.
    * ``broker_tls`` (default :data:`BROKER_TLS`, True, as the operator's brokers serve TLS by
      default): the backend sends to
      ``https://orders-active.<ns>.svc:8080``, verified with ``--broker-ca-file`` against the
      ``ca.crt`` of the operator-written Secret ``orders-tls`` (that key alone is mounted). The
      backend pod waits in ContainerCreating until the operator has written it. False: the chart
      is installed with ``operator.brokerTls=false`` (unless ``helm_values`` says otherwise), so the
      brokers serve plain HTTP and the backend calls ``http://``.
    * ``backend_client_certificate`` (needs ``broker_tls``): the backend also presents a client
      certificate (Secret ``backend-client-tls``, subject ``CN=sap-erp-local,OU=Basis,O=ACME``), and
      ``spec.tls.backendClients`` lists that subject with ``simulators-ca`` as its CA.

    ``backend_extra_args``: more arguments of the backend simulator, such as ``--poison
    orders-0000:120:always`` (a message the cloud always refuses: a poisoned stream).
    """
    tls = RelayTls(
        upstream=upstream_tls, broker=broker_tls, backend_client_certificate=backend_client_certificate
    )

    def kubectl(*args: str, input: str | None = None) -> None:
        cluster.kubectl("-n", namespace, *args, input=input)

    def apply(items: list[dict[str, Any]]) -> None:
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    wait_until(
        "the namespace's default ServiceAccount",
        lambda: cluster.get_json(namespace, "serviceaccount", "default") is not None,
        60,
    )
    kubectl("apply", "-f", "-", input=json.dumps(message_log_claim()))
    release = f"bf-{namespace}"
    apply_crd(cluster)
    # Many releases share the test cluster's one CRD, and helm lets one release own it: the CRD is
    # applied above, and each release leaves it out (charts/README.md, "CRDs").
    values = {"crds.create": "false", "operator.watchNamespaces": f"{{{namespace}}}", **(helm_values or {})}
    if not tls.broker:
        # A backend calling http:// needs brokers that serve it: the operator's opt-out.
        values.setdefault("operator.brokerTls", "false")
    settings = [argument for key, value in values.items() for argument in ("--set", f"{key}={value}")]
    cluster.helm(
        "install", release, str(CHART), "--namespace", namespace, *settings, "--wait", "--timeout=240s",
        timeout=300,
    )  # fmt: skip
    pki = tls.pki(namespace)
    apply(relay_secrets(namespace, tls, pki))
    backend_args = [
        "--account=acme",
        "--company=1000",
        f"--streams={streams}",
        f"--messages-per-stream={messages_per_stream}",
        f"--bundle-size={bundle_size}",
        f"--lanes={lanes}",
        *backend_extra_args,
    ]
    if request_timeout_seconds is not None:
        backend_args.append(f"--request-timeout-seconds={request_timeout_seconds}")
    if client is not None:
        backend_args += [
            f"--connect-timeout-seconds={client.connect_timeout_seconds}",
            f"--backoff-max-seconds={client.backoff_max_seconds}",
        ]
    cloud_args = [f"--inbound-streams={streams}", f"--inbound-messages-per-stream={messages_per_stream}"]
    objects = relay_simulators(namespace, tls, backend_args=backend_args, cloud_args=cloud_args)
    if simulators_node is not None:
        for pod in (item for item in objects if item["kind"] == "Pod"):
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": simulators_node}
    apply(objects)
    kubectl("apply", "-f", "-", input=json.dumps(relay_brokercluster(tls, spec)))
    relay = Relay(
        cluster,
        namespace,
        release,
        backend_url="",
        cloud_url="",
        inbound_streams=streams,
        simulators_ca=pki.ca if pki is not None and tls.upstream else None,
    )

    wait_until(
        "the BrokerCluster Healthy with an active broker",
        lambda: (s := relay.status()).get("phase") == "Healthy" and s.get("active"),
        240,
    )
    wait_until("both simulators ready", lambda: relay.pod_ready("cloud") and relay.pod_ready("backend"), 120)
    for name in ("backend", "cloud"):
        ip = relay.get("service", name)["spec"]["clusterIP"]
        setattr(relay, f"{name}_url", f"{tls.sim_scheme()}://{ip}:{SIM_PORT}")
    return relay
