"""The plugin's Kubernetes calls, with the user's kubeconfig, as kubectl would make them.

``connect`` honours ``--kubeconfig``, ``--context`` and ``-n`` as kubectl does (the namespace
defaults to the context's, then ``default``; inside a pod without a kubeconfig, the pod's service
account and namespace). Every call turns an ``ApiException`` into a :class:`PluginError` that
names the verb, the resource and the namespace, so that a 403 tells the user which permission to
ask for (``kubectl auth can-i VERB RESOURCE -n NS``) instead of printing an HTTP body.

Broker addresses, the operator token and the client certificate for brokers that serve TLS are
resolved here too, because all are read from the API server: pod IPs (pods carrying the cluster's
label) and DNS names in replicas mode, ``spec.endpoints`` URLs in endpoints mode; the token from
``spec.auth.tokenSecretRef`` or the Secret the operator generates; the client certificate from
``<name>-operator-client`` or the user's Secrets (``admin_tls``).
The spec is read with the operator's own parser (``controller.spec``), so both agree on defaults.

Not here: anything about brokers' SOAP, or what to print.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import kubernetes
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from broker_operator.controller import names
from broker_operator.controller.bodies import BrokerClusterBody, PodBody
from broker_operator.controller.observed import admin_soap_url, pod_dns_name
from broker_operator.controller.spec import ClusterSpec, SecretRef, SpecError, parse_spec
from broker_operator.kubectl_plugin import admin_tls
from broker_operator.kubectl_plugin.errors import PluginError, UsageError
from broker_operator.tls_material import ClientTlsMaterial

REQUEST_TIMEOUT_SECONDS: Final = 15
HTTP_UNAUTHORIZED: Final = 401
HTTP_FORBIDDEN: Final = 403
HTTP_NOT_FOUND: Final = 404
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_BROKER_CLUSTERS = f"{names.PLURAL}.{names.GROUP}"

T = TypeVar("T")


@dataclass(frozen=True)
class BrokerAddress:
    """Where to reach one broker's SOAP endpoint; ``url`` is None while a pod has no IP yet.
    ``server_name``: the name its TLS certificate carries and is verified as (a pod's DNS name; None
    for an endpoint, verified as its URL's host)."""

    name: str
    url: str | None
    server_name: str | None = None


class Kube:
    """The calls the plugin makes, bound to one API client and one default namespace."""

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self._api_client = api_client
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._custom = kubernetes.client.CustomObjectsApi(api_client)

    def get_cluster(self, name: str) -> BrokerClusterBody:
        body = _call(
            "get", _BROKER_CLUSTERS, self.namespace, self._custom.get_namespaced_custom_object,
            names.GROUP, names.VERSION, self.namespace, names.PLURAL, name, missing=name,
        )  # fmt: skip
        return cast(BrokerClusterBody, body)

    def list_clusters(self, all_namespaces: bool) -> list[BrokerClusterBody]:
        if all_namespaces:
            listing = _call(
                "list", _BROKER_CLUSTERS, None, self._custom.list_cluster_custom_object,
                names.GROUP, names.VERSION, names.PLURAL,
            )  # fmt: skip
        else:
            listing = _call(
                "list", _BROKER_CLUSTERS, self.namespace, self._custom.list_namespaced_custom_object,
                names.GROUP, names.VERSION, self.namespace, names.PLURAL,
            )  # fmt: skip
        items = cast(list[BrokerClusterBody], cast(dict[str, Any], listing).get("items") or [])
        return sorted(
            items, key=lambda b: (b["metadata"].get("namespace", ""), b["metadata"].get("name", ""))
        )

    def set_preferred_active(self, name: str, broker: str | None) -> None:
        """Merge-patch ``spec.preferredActive`` (None removes it): the switchover request."""
        _call(
            "patch", _BROKER_CLUSTERS, self.namespace, self._custom.patch_namespaced_custom_object,
            names.GROUP, names.VERSION, self.namespace, names.PLURAL, name,
            {"spec": {"preferredActive": broker}}, missing=name,
        )  # fmt: skip

    def broker_pods(self, cluster: str) -> list[PodBody]:
        selector = f"{names.LABEL_CLUSTER}={cluster}"
        listing = _call(
            "list", "pods", self.namespace, self._core.list_namespaced_pod, self.namespace,
            label_selector=selector,
        )  # fmt: skip
        pods = [cast(PodBody, self._api_client.sanitize_for_serialization(p)) for p in listing.items]
        # The selector is re-checked: another cluster's pods must never be taken for this one's.
        return [p for p in pods if (p["metadata"].get("labels") or {}).get(names.LABEL_CLUSTER) == cluster]

    def broker_addresses(self, body: BrokerClusterBody) -> list[BrokerAddress]:
        """Every broker of the cluster with its SOAP URL, in priority order."""
        name = body["metadata"]["name"]
        spec = cluster_spec(body)
        if spec.endpoints_mode:
            return [BrokerAddress(e.name, e.url) for e in sorted(spec.endpoints, key=lambda e: e.priority)]
        # The admin operations go where the operator's heartbeats go: the pod's admin port if it has
        # one, in https when it serves TLS, verified as the pod's DNS name (observed.py).
        pods = {p["metadata"]["name"]: p for p in self.broker_pods(name)}
        wanted = [names.pod_name(name, ordinal) for ordinal in range(spec.replicas)]
        # Pods beyond replicas (a scale-down under way) are still brokers someone may ask.
        extra = sorted(set(pods) - set(wanted), key=_ordinal)
        domain = spec.tls.cluster_domain
        return [
            BrokerAddress(
                pod,
                admin_soap_url(pods[pod]) if pod in pods else None,
                # A pod not there yet still has its name: --url through a port-forward verifies it.
                (pod_dns_name(pods[pod], domain) if pod in pods else None)
                or f"{pod}.{names.headless_service_name(name)}.{self.namespace}.svc.{domain}",
            )
            for pod in [*wanted, *extra]
        ]

    def client_tls(self, body: BrokerClusterBody) -> tuple[ClientTlsMaterial, str]:
        """The operator's client certificate and the CA bundle the brokers chain to, for calls to
        brokers that serve TLS, and which Secret(s) they came from (``admin_tls.client_material``)."""
        tls = cluster_spec(body).tls
        secrets = None
        if not tls.operator_issues and tls.secrets is not None:  # mode Secrets
            secrets = (tls.secrets.operator_client, tls.secrets.server)
        return admin_tls.client_material(body, self.namespace, tls.mode, secrets, self.tls_secret)

    def tls_secret(self, secret: str, advice: str) -> dict[str, Any] | None:
        """Secret ``secret`` as the API returns it (None: absent); a 403 ends with ``advice``."""
        try:
            found = self._core.read_namespaced_secret(
                secret, self.namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            reason = _api_message(error)
            if error.status == HTTP_FORBIDDEN:
                raise PluginError(
                    f"forbidden: you may not get Secret {self.namespace}/{secret} ({reason}), which holds "
                    "the client certificate the brokers' admin port requires over TLS; " + advice
                ) from None
            raise PluginError(
                f"cannot get Secret {self.namespace}/{secret}: HTTP {error.status}: {reason}"
            ) from None
        except (HTTPError, OSError) as error:
            raise PluginError(f"cannot reach the API server to get Secret {secret}: {error}") from None
        return cast(dict[str, Any], self._api_client.sanitize_for_serialization(found))

    def secret_bytes(self, secret: str, key: str) -> bytes | None:
        """One key of a Secret, decoded; None if the Secret or the key is not there."""
        try:
            found = _call(
                "get", "secrets", self.namespace, self._core.read_namespaced_secret, secret, self.namespace,
                missing=secret,
            )  # fmt: skip
        except UsageError:
            return None
        encoded = (found.data or {}).get(key)
        return base64.b64decode(encoded) if encoded else None

    def operator_token(self, body: BrokerClusterBody) -> str:
        """The operator's token for admin calls: ``spec.auth.tokenSecretRef`` or ``<name>-broker-token``."""
        ref = token_ref(body)
        secret = _call(
            "get", "secrets", self.namespace, self._core.read_namespaced_secret, ref.name, self.namespace,
        )  # fmt: skip
        encoded = (secret.data or {}).get(ref.key)
        if not encoded:
            raise PluginError(
                f"Secret {self.namespace}/{ref.name} has no key {ref.key!r}: the operator's token for "
                f"BrokerCluster {body['metadata']['name']} is not there"
            )
        return base64.b64decode(encoded).decode().strip()


def cluster_spec(body: BrokerClusterBody) -> ClusterSpec:
    """The spec as the operator reads it; an invalid spec still gives its brokers where it can."""
    name = body["metadata"]["name"]
    spec = body.get("spec") or {}
    try:
        return parse_spec(name, spec)
    except SpecError:
        pass
    # The operator runs nothing for an invalid spec, but the user may still want to look at it:
    # read what can be read (the brokers, the token Secret), defaults for the rest.
    for kept in (("account", "company", "replicas", "endpoints", "auth"), ("account", "company")):
        try:
            return parse_spec(name, {k: v for k, v in spec.items() if k in kept})
        except SpecError:
            continue
    return parse_spec(name, {"account": "-", "company": "-"})


def token_ref(body: BrokerClusterBody) -> SecretRef:
    return cluster_spec(body).token_ref(body["metadata"]["name"])


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Kube:
    """A :class:`Kube` from the kubeconfig (as kubectl reads it), or in-cluster config inside a pod."""
    if kubeconfig is None and not _kubeconfig_exists() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = kubernetes.client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as error:
            raise UsageError(f"no kubeconfig and no usable in-cluster config: {error}") from error
        default_namespace = _read_text(_SERVICE_ACCOUNT_NAMESPACE) or "default"
        return Kube(kubernetes.client.ApiClient(configuration), namespace or default_namespace)
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError) as error:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise UsageError(f"cannot read the kubeconfig {where}: {error}") from error
    chosen = current if context is None else next((c for c in contexts if c.get("name") == context), None)
    if chosen is None:
        known = ", ".join(str(c.get("name")) for c in contexts) or "none"
        raise UsageError(f"context {context!r} is not in the kubeconfig (contexts: {known})")
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as error:
        raise UsageError(f"cannot use context {chosen.get('name')!r}: {error}") from error
    default_namespace = (chosen.get("context") or {}).get("namespace") or "default"
    return Kube(api_client, namespace or default_namespace)


def _call(
    verb: str,
    resource: str,
    namespace: str | None,
    method: Callable[..., T],
    *args: Any,
    missing: str | None = None,
    **kwargs: Any,
) -> T:
    """``method(*args)`` with a timeout; API errors become sentences naming verb, resource and namespace."""
    where = f"in namespace {namespace}" if namespace else "in any namespace"
    try:
        return method(*args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)
    except ApiException as error:
        reason = _api_message(error)
        if error.status == HTTP_NOT_FOUND and missing is not None:
            raise UsageError(f"BrokerCluster {missing!r} not found in namespace {namespace}") from None
        if error.status == HTTP_FORBIDDEN:
            scope = f" -n {namespace}" if namespace else " --all-namespaces"
            raise PluginError(
                f"forbidden: you may not {verb} {resource} {where} ({reason}); ask for a Role that grants "
                f"it (check with: kubectl auth can-i {verb} {resource}{scope})"
            ) from None
        if error.status == HTTP_UNAUTHORIZED:
            raise PluginError(f"unauthorized: the API server refused your credentials ({reason})") from None
        raise PluginError(f"cannot {verb} {resource} {where}: HTTP {error.status}: {reason}") from None
    except (HTTPError, OSError) as error:
        raise PluginError(f"cannot reach the API server to {verb} {resource}: {error}") from None


def _api_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        return str(error.reason)


def _ordinal(pod: str) -> tuple[int, str]:
    tail = pod.rsplit("-", 1)[-1]
    return (int(tail), pod) if tail.isdigit() else (1 << 30, pod)


def _kubeconfig_exists() -> bool:
    paths = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return any(Path(p).expanduser().exists() for p in paths.split(os.pathsep) if p)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
