"""Mutual TLS for the plugin's admin calls: the client certificate the brokers' admin port accepts,
and a ``requests`` adapter that dials a pod's IP while it verifies the pod's DNS name.

A broker that serves TLS requires a client certificate on its admin port, the operator's. The
plugin presents the same one, read with the user's own RBAC from the one Secret that holds it and
nothing more (:func:`client_material`):

- mode ``Operator``: ``<name>-operator-client`` (``tls.crt``, ``tls.key``, and ``ca.crt``, the CA
  the brokers' serving certificate chains to), only if it is recorded as the operator's (its
  ownership label and a controller reference to the BrokerCluster): a Secret of that name made by
  someone else must not choose which brokers the plugin trusts with the operator's token. Never
  ``<name>-ca``: that one holds the CA's key, and a user who can run ``held`` must not thereby be
  able to issue certificates. So RBAC grants ``get`` on ``<name>-operator-client`` by
  ``resourceNames`` (docs/kubectl-plugin.md).
- mode ``Secrets``: ``tls.crt``/``tls.key`` of ``spec.tls.secrets.operatorClient`` and ``ca.crt`` of
  ``spec.tls.secrets.server``, each only if it opts in as a credential, as the operator reads them.

The reading rules are the operator's own (``controller.client_tls``: bounded reads, CA certificates
only in the bundle, the key the certificate's), and so is the ``ssl.SSLContext``
(``tls_client.client_ssl_context``: TLS 1.2 at least, the bundle as the only trust, never the
system's; the key handed to OpenSSL through an anonymous in-memory file, or a 0700 directory removed
at once, and never logged).

Which name is verified: pods are dialled at their IP, and their certificate carries their DNS name
under the headless Service (``<pod>.<cluster>-brokers.<ns>.svc.<clusterDomain>``), never an IP; so
the adapter sends that name as SNI and checks the certificate for it while it connects to the IP,
as the operator's heartbeats do. The same holds through ``kubectl port-forward`` and ``--url
https://127.0.0.1:18081/soap``: the broker on the other end is still the pod. OpenSSL checks the
name (``check_hostname`` of the context, with ``server_hostname``), so a mismatch reads as the
operator's does ("Hostname mismatch"). ``requests`` would otherwise add its certifi bundle to the
context's trust (``HTTPAdapter.cert_verify`` sets ``ca_certs``, and urllib3 loads it into the
context given): the adapter clears it.

What it does not do: decide which broker to ask (``held``), or speak SOAP (``admin``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from requests import PreparedRequest
from requests.adapters import HTTPAdapter

from broker_operator.controller import names
from broker_operator.controller.bodies import BrokerClusterBody
from broker_operator.controller.client_tls import operator_secret_material, user_secrets_material
from broker_operator.core import spec_fields as fields
from broker_operator.kubectl_plugin.errors import PluginError
from broker_operator.tls_client import TlsMaterialError, client_ssl_context
from broker_operator.tls_material import ClientTlsMaterial

__all__ = ["AdminTls", "VerifiedAsAdapter", "client_material", "rbac_advice"]

DOCS: Final = 'docs/kubectl-plugin.md, "RBAC a user needs"'
SecretReader = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class AdminTls:
    """How to call one broker over TLS: the client material, and the name its certificate must carry
    (the pod's DNS name; None: the URL's own host, as for an ``https`` endpoint)."""

    material: ClientTlsMaterial = field(repr=False)
    server_name: str | None
    source: str  # which Secret(s) the material came from, for an error message

    def context(self) -> ssl.SSLContext:
        try:
            return client_ssl_context(self.material)
        except TlsMaterialError as error:
            raise PluginError(f"the client certificate in {self.source} does not load: {error}") from None


class VerifiedAsAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose connections present the client certificate of ``context``, trust its
    bundle alone, and verify the server as ``server_name`` whatever host the URL dials."""

    def __init__(self, context: ssl.SSLContext, server_name: str | None) -> None:
        self._context = context
        self._server_name = server_name
        super().__init__(max_retries=0)

    def build_connection_pool_key_attributes(
        self, request: PreparedRequest, verify: Any, cert: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        host, _ = super().build_connection_pool_key_attributes(request, verify, cert)
        pool: dict[str, Any] = {"ssl_context": self._context, "cert_reqs": "CERT_REQUIRED"}
        if self._server_name is not None:
            pool["server_hostname"] = self._server_name  # SNI, and the name OpenSSL checks
        return host, pool

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        # Never requests' own choice: with ``verify=True`` it would point the pool at certifi's
        # bundle, which urllib3 then loads into our context, and a public CA would be trusted.
        conn.cert_reqs = "CERT_REQUIRED"
        conn.ca_certs = None
        conn.ca_cert_dir = None


def rbac_advice(namespace: str, secrets: tuple[str, ...]) -> str:
    listed = ", ".join(secrets)
    return (
        f"ask for a Role in namespace {namespace} granting get on secrets with resourceNames [{listed}] "
        f"({DOCS}; check with: kubectl auth can-i get secret/{secrets[0]} -n {namespace})"
    )


def client_material(
    body: BrokerClusterBody,
    namespace: str,
    tls_mode: str,
    user_secrets: tuple[str, str] | None,
    read: SecretReader,
) -> tuple[ClientTlsMaterial, str]:
    """The client material for ``body``'s brokers, and which Secret(s) it came from.

    ``read(secret_name, advice)`` returns the Secret as the API returns it (None: absent) and raises
    a :class:`PluginError` that ends with ``advice`` when RBAC refuses; ``user_secrets`` is
    ``(operatorClient, server)`` in mode Secrets."""
    cluster = body["metadata"]["name"]
    if tls_mode == fields.TLS_MODE_DISABLED:
        raise PluginError(
            f"a broker of BrokerCluster {cluster} serves TLS but spec.tls.mode is Disabled: its pods are "
            "being rolled to plain HTTP; try again once the rollout is done, or ask with --url over http"
        )
    if user_secrets is None:
        secret_name = names.operator_client_secret_name(cluster)
        advice = rbac_advice(namespace, (secret_name,))
        found = operator_secret_material(read(secret_name, advice), namespace, cluster)
        where = f"Secret {namespace}/{secret_name}"
        if found.material is None:
            raise PluginError(
                f"cannot call the brokers of BrokerCluster {cluster} over mutual TLS: {found.reason}. The "
                "operator writes it with the cluster's certificates (see condition CertificatesValid: "
                f"kubectl describe bc {cluster} -n {namespace}); an operator from before the Secret "
                f"existed keeps its client certificate in {names.ca_secret_name(cluster)}, beside the CA's "
                "key, which the plugin never reads: upgrade the operator"
            )
        return found.material, where
    client_name, server_name = user_secrets
    advice = rbac_advice(namespace, user_secrets)
    client = read(client_name, advice)
    server = read(server_name, advice)
    found = user_secrets_material(client, server, namespace, client_name, server_name)
    if found.material is None:
        raise PluginError(
            f"cannot call the brokers of BrokerCluster {cluster} over mutual TLS: {found.reason} "
            "(spec.tls.mode Secrets: the operator's client certificate is spec.tls.secrets.operatorClient, "
            "the CA the brokers chain to is ca.crt of spec.tls.secrets.server)"
        )
    return found.material, f"Secrets {namespace}/{client_name} and {server_name}"
