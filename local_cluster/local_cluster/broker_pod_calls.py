"""How the harness (tests, soak, benchmarks) calls a broker pod at its IP, whichever way it listens.

A broker pod serves TLS on both of its ports when the operator gave it ``BROKER_TLS_DIR`` (the
default since issue 41; ``observed.serves_tls`` reads the same variable), and plain HTTP otherwise
(``spec.tls.mode: Disabled``, or an operator run with ``--no-broker-tls``). The harness dials the
pod's IP from the cluster's network namespace, where cluster DNS does not answer, and verifies the
certificate as the operator does: against the CA of the BrokerCluster's serving Secret
(``ca.crt`` of ``<name>-tls`` in mode Operator, of ``spec.tls.secrets.server`` in mode Secrets),
under the pod's DNS name ``<hostname>.<subdomain>.<namespace>.svc.<clusterDomain>`` (pod IPs are
never in the certificate). Verification is never turned off.

The admin port also wants a client certificate its ``ca.crt`` trusts: :func:`pod_call` with
``client=True`` presents the operator's own (``tls.crt``/``tls.key`` of ``<name>-operator-client``,
which the operator and the ``kubectl broker held`` users granted it read: the harness stands in
for the operator here, as the tests that call the admin port do).

Not here: anything the operator does with these calls (that is ``broker_operator``), and calls
through the ``-active`` Service (``relay_tls``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from broker_contracts import environment
from local_cluster.cluster import ClusterAccess
from local_cluster.relay_tls import service_context

CLUSTER_LABEL = "broker.failover.dev/cluster"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


class BrokerPodCallError(RuntimeError):
    """What the harness needed to call a broker pod is not there (yet); says what."""


def serves_tls(pod: dict[str, Any]) -> bool:
    """Whether the pod's broker serves TLS: its container has a non-empty ``BROKER_TLS_DIR``."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return any(
        env.get("name") == environment.BROKER_TLS_DIR and env.get("value")
        for env in containers[0].get("env") or []
    )


def secret_bytes(access: ClusterAccess, namespace: str, name: str, key: str) -> bytes:
    """The decoded ``key`` of Secret ``namespace/name``; a clear error when either is missing."""
    secret = access.get_json(namespace, "secret", name)
    data = (secret or {}).get("data") or {}
    if key not in data:
        raise BrokerPodCallError(f"Secret {namespace}/{name} has no key {key!r} (yet)")
    return base64.b64decode(data[key])


def _tls_spec(access: ClusterAccess, namespace: str, cluster: str) -> dict[str, Any]:
    body = access.get_json(namespace, "brokercluster", cluster) or {}
    return dict((body.get("spec") or {}).get("tls") or {})


def serving_ca(access: ClusterAccess, namespace: str, cluster: str) -> bytes:
    """The CA bundle the cluster's brokers' serving certificate chains to (what ``kubectl broker
    ca`` exports): ``ca.crt`` of the Secret that holds the serving certificate."""
    secrets = _tls_spec(access, namespace, cluster).get("secrets") or {}
    return secret_bytes(access, namespace, secrets.get("server") or f"{cluster}-tls", "ca.crt")


def pod_server_name(pod: dict[str, Any], cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> str:
    """The pod's DNS name, as its serving certificate carries it and the operator verifies it."""
    spec, meta = pod["spec"], pod["metadata"]
    return f"{spec['hostname']}.{spec['subdomain']}.{meta['namespace']}.svc.{cluster_domain}"


@dataclass(frozen=True)
class OperatorClientCertificate:
    """The operator's client certificate and key, PEM, from ``<name>-operator-client``."""

    cert: bytes
    key: bytes

    @classmethod
    def read(cls, access: ClusterAccess, namespace: str, cluster: str) -> OperatorClientCertificate:
        name = f"{cluster}-operator-client"
        return cls(
            secret_bytes(access, namespace, name, "tls.crt"),
            secret_bytes(access, namespace, name, "tls.key"),
        )

    @contextlib.contextmanager
    def files(self) -> Iterator[tuple[str, str]]:
        """The two PEMs as files of a 0700 directory removed on exit (``load_cert_chain`` reads
        files only)."""
        with tempfile.TemporaryDirectory(prefix="operator-client-") as directory:
            os.chmod(directory, 0o700)
            paths = (os.path.join(directory, "client.crt"), os.path.join(directory, "client.key"))
            for path, content in zip(paths, (self.cert, self.key), strict=True):
                with open(path, "wb") as handle:
                    handle.write(content)
            yield paths


def pod_context(access: ClusterAccess, pod: dict[str, Any], *, client: bool = False) -> ssl.SSLContext | None:
    """How to call the broker of ``pod`` at its IP: None for plain HTTP, else a context verifying
    its chain against the cluster's serving CA and its name as the pod's DNS name; ``client``: the
    operator's client certificate presented too (what the admin port requires)."""
    if not serves_tls(pod):
        return None
    namespace = pod["metadata"]["namespace"]
    cluster = (pod["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
    if not cluster:
        raise BrokerPodCallError(f"pod {namespace}/{pod['metadata']['name']} has no {CLUSTER_LABEL} label")
    tls = _tls_spec(access, namespace, cluster)
    domain = tls.get("clusterDomain") or DEFAULT_CLUSTER_DOMAIN
    context = service_context(serving_ca(access, namespace, cluster), pod_server_name(pod, domain))
    if client:
        with OperatorClientCertificate.read(access, namespace, cluster).files() as (cert, key):
            context.load_cert_chain(cert, key)
    return context


def pod_url(pod: dict[str, Any], port: int, path: str) -> str:
    """``https://`` or ``http://`` at the pod's IP, as the pod listens."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise BrokerPodCallError(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has no IP")
    return f"{'https' if serves_tls(pod) else 'http'}://{ip}:{port}{path}"


def pod_call(
    access: ClusterAccess,
    pod: dict[str, Any],
    port: int,
    path: str,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    client: bool = False,
    timeout: float = 5,
) -> Callable[[], str]:
    """A call of the pod's ``port`` and ``path`` (GET, or POST of ``data``) that returns the reply's
    body, to be run in the cluster's network namespace (``call_in_network``); what it needs from
    the API server (the CA, the client certificate) is read now, in the caller's namespace, where
    the API server is reachable. urllib's errors reach the caller as it raises them."""
    url = pod_url(pod, port, path)
    context = pod_context(access, pod, client=client)

    def call() -> str:
        request = urllib.request.Request(url, data=data, headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
            return str(reply.read().decode())

    return call
