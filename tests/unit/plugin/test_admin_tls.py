"""The plugin's side of mutual TLS, without a broker: which Secret it reads (never ``<name>-ca``), what
it says when that Secret is missing, foreign or forbidden, the pods' DNS names it verifies, and
that a plain-HTTP cluster never reads a certificate. The handshakes are in
tests/integration/operator/test_plugin_admin_tls.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, ClassVar

import kubernetes
import pytest
import requests
from kubernetes.client.exceptions import ApiException

from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.kubectl_plugin import admin_tls, held
from broker_operator.kubectl_plugin.admin import BrokerAdmin
from broker_operator.kubectl_plugin.admin_tls import AdminTls, VerifiedAsAdapter
from broker_operator.kubectl_plugin.errors import PluginError
from broker_operator.kubectl_plugin.kube import BrokerAddress, Kube
from broker_operator.pki import issue_client, issue_server, new_ca
from broker_operator.tls_material import ClientTlsMaterial
from tests.unit.plugin.support import FakeKube, cluster_body

NOW = datetime.now(UTC)
OWNER = {"apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": names.KIND,
         "metadata": {"name": "orders", "namespace": "shop", "uid": "uid-orders"}}  # fmt: skip
CA = new_ca("orders CA", days=30, now=NOW, key_bits=2048)
CLIENT = issue_client(CA, shapes.OPERATOR_CLIENT_NAME, days=30, now=NOW)


def operator_client() -> dict[str, Any]:
    data = shapes.operator_client_secret_data(CLIENT, CA.certificate_pem)
    return shapes.build_operator_client_secret(OWNER, data)


class Reads:
    def __init__(self, secrets: dict[str, dict[str, Any]]) -> None:
        self.secrets, self.names = secrets, []  # type: ignore[var-annotated]

    def __call__(self, name: str, advice: str) -> dict[str, Any] | None:
        self.names.append(name)
        return self.secrets.get(name)


def test_mode_operator_reads_the_operator_client_secret_alone() -> None:
    reads = Reads({"orders-operator-client": operator_client(), "orders-ca": {"data": {"ca.key": "x"}}})
    material, source = admin_tls.client_material(cluster_body(), "shop", "Operator", None, reads)
    assert reads.names == ["orders-operator-client"]  # never <name>-ca: it holds the CA's key
    assert material.certificate_pem == CLIENT.certificate_pem and material.key_pem == CLIENT.key_pem
    assert material.trust_bundle_pem == CA.certificate_pem
    assert source == "Secret shop/orders-operator-client"
    assert "BEGIN" not in repr(AdminTls(material, "x", source))


def test_a_missing_or_foreign_secret_says_which_and_what_to_do() -> None:
    with pytest.raises(PluginError) as missing:
        admin_tls.client_material(cluster_body(), "shop", "Operator", None, Reads({}))
    text = str(missing.value)
    assert "Secret shop/orders-operator-client does not exist yet" in text
    assert "CertificatesValid" in text and "upgrade the operator" in text
    foreign = operator_client()
    foreign["metadata"]["ownerReferences"] = []
    with pytest.raises(PluginError, match="orders-operator-client is not recorded as the operator's"):
        admin_tls.client_material(
            cluster_body(), "shop", "Operator", None, Reads({"orders-operator-client": foreign})
        )
    with pytest.raises(PluginError, match=r"spec\.tls\.mode is Disabled"):
        admin_tls.client_material(cluster_body(), "shop", "Disabled", None, Reads({}))


def test_mode_secrets_reads_the_users_client_and_servers_ca() -> None:
    def user(pair: Any, labelled: bool = True) -> dict[str, Any]:
        data = shapes.operator_client_secret_data(pair, CA.certificate_pem)
        labels = {names.LABEL_CREDENTIAL: "true"} if labelled else {}
        return {"metadata": {"name": "x", "labels": labels}, "data": shapes._encoded(data)}

    server = issue_server(CA, ["orders-active.shop.svc"], days=30, now=NOW)
    reads = Reads({"cli": user(CLIENT), "srv": user(server)})
    material, source = admin_tls.client_material(cluster_body(), "shop", "Secrets", ("cli", "srv"), reads)
    assert (
        material.certificate_pem == CLIENT.certificate_pem and material.trust_bundle_pem == CA.certificate_pem
    )
    assert reads.names == ["cli", "srv"] and source == "Secrets shop/cli and srv"
    with pytest.raises(PluginError, match="does not carry the label"):
        admin_tls.client_material(
            cluster_body(),
            "shop",
            "Secrets",
            ("cli", "srv"),
            Reads({"cli": user(CLIENT, False), "srv": user(server)}),
        )


def refusing(status: int) -> Any:
    def method(*args: Any, **kwargs: Any) -> Any:
        error = ApiException(status=status, reason="Refused")
        error.body = json.dumps({"message": "user alice cannot get secret"})
        raise error

    return method


def test_a_forbidden_secret_names_the_role_to_ask_for() -> None:
    kube = Kube(kubernetes.client.ApiClient(), "shop")
    kube._core.read_namespaced_secret = refusing(403)  # type: ignore[method-assign]
    with pytest.raises(PluginError) as forbidden:
        kube.client_tls(cluster_body())
    text = str(forbidden.value)
    assert text.startswith("forbidden: you may not get Secret shop/orders-operator-client")
    assert "granting get on secrets with resourceNames [orders-operator-client]" in text
    assert "kubectl auth can-i get secret/orders-operator-client -n shop" in text
    kube._core.read_namespaced_secret = refusing(404)  # type: ignore[method-assign]
    with pytest.raises(PluginError, match="does not exist yet"):
        kube.client_tls(cluster_body())


def test_pod_addresses_carry_the_pods_dns_name_even_before_the_pod_exists() -> None:
    kube = Kube(kubernetes.client.ApiClient(), "shop")
    pod = {
        "metadata": {"name": "orders-0", "namespace": "shop", "labels": {names.LABEL_CLUSTER: "orders"}},
        "spec": {"hostname": "orders-0", "subdomain": "orders-brokers", "containers": []},
        "status": {"podIP": "10.0.0.7"},
    }
    kube.broker_pods = lambda cluster: [pod]  # type: ignore[method-assign,assignment,return-value]
    addresses = kube.broker_addresses(cluster_body())  # type: ignore[arg-type]
    assert addresses == [
        BrokerAddress(
            "orders-0", "http://10.0.0.7:8080/soap", "orders-0.orders-brokers.shop.svc.cluster.local"
        ),
        BrokerAddress("orders-1", None, "orders-1.orders-brokers.shop.svc.cluster.local"),
    ]
    # --url keeps the name: through a port-forward the broker is still the pod.
    (chosen,) = held.chosen_brokers(cluster_body(), addresses, "orders-1", url="https://127.0.0.1:18081/soap")
    assert chosen == BrokerAddress(
        "orders-1", "https://127.0.0.1:18081/soap", "orders-1.orders-brokers.shop.svc.cluster.local"
    )


class TlsKube(FakeKube):
    def __init__(self, urls: dict[str, str]) -> None:
        super().__init__(cluster_body())
        self.urls = urls
        self.tls_reads = 0
        self.refuse: str | None = None

    def broker_addresses(self, body: dict[str, Any]) -> list[BrokerAddress]:
        return [
            BrokerAddress(name, url, f"{name}.orders-brokers.shop.svc.cluster.local")
            for name, url in self.urls.items()
        ]

    def client_tls(self, body: dict[str, Any]) -> tuple[ClientTlsMaterial, str]:
        self.tls_reads += 1
        if self.refuse:
            raise PluginError(self.refuse)
        return ClientTlsMaterial(
            CLIENT.certificate_pem, CLIENT.key_pem, CA.certificate_pem
        ), "Secret shop/orders-operator-client"


class RecordingAdmin:
    made: ClassVar[list[tuple[str, AdminTls | None]]] = []

    def __init__(
        self, broker: str, url: str, token: str, timeout: float, *, tls: AdminTls | None = None
    ) -> None:
        RecordingAdmin.made.append((broker, tls))

    def list_held(self, stream: str | None = None) -> list[Any]:
        return []


def test_only_https_brokers_get_the_client_certificate_read_once_per_command() -> None:
    RecordingAdmin.made = []
    plain = TlsKube({"orders-0": "http://10.0.0.1:8081/soap", "orders-1": "http://10.0.0.2:8081/soap"})
    counts = held.held_counts(plain, cluster_body(), admin=RecordingAdmin)  # type: ignore[arg-type]
    assert {n: c.count for n, c in counts.items()} == {"orders-0": 0, "orders-1": 0}
    assert plain.tls_reads == 0 and all(tls is None for _, tls in RecordingAdmin.made)

    RecordingAdmin.made = []
    secure = TlsKube({"orders-0": "https://10.0.0.1:8081/soap", "orders-1": "https://10.0.0.2:8081/soap"})
    held.list_held(secure, cluster_body(), broker=None, all_brokers=True, url=None, stream=None,
                   timeout=5, admin=RecordingAdmin)  # type: ignore[arg-type]  # fmt: skip
    assert secure.tls_reads == 1
    assert sorted((b, t.server_name if t else None) for b, t in RecordingAdmin.made) == [
        ("orders-0", "orders-0.orders-brokers.shop.svc.cluster.local"),
        ("orders-1", "orders-1.orders-brokers.shop.svc.cluster.local"),
    ]

    secure.refuse = "forbidden: you may not get Secret shop/orders-operator-client"
    counts = held.held_counts(secure, cluster_body(), admin=RecordingAdmin)  # type: ignore[arg-type]
    assert all(c.count is None and c.error == secure.refuse for c in counts.values())


def test_the_adapter_trusts_the_bundle_alone_and_sends_the_pods_name() -> None:
    material = ClientTlsMaterial(CLIENT.certificate_pem, CLIENT.key_pem, CA.certificate_pem)
    pod_name = "orders-0.orders-brokers.shop.svc.cluster.local"
    admin = BrokerAdmin(
        "orders-0", "https://10.0.0.1:8081/soap", "t", 1, tls=AdminTls(material, pod_name, "s")
    )
    mounted = admin._session.get_adapter("https://10.0.0.1:8081/soap")  # type: ignore[attr-defined]
    assert isinstance(mounted, VerifiedAsAdapter)
    request = requests.Request("POST", "https://10.0.0.1:8081/soap").prepare()
    host, pool = mounted.build_connection_pool_key_attributes(request, "/etc/ssl/certs/ca-certificates.crt")
    assert (
        host["host"] == "10.0.0.1"
        and pool["server_hostname"] == "orders-0.orders-brokers.shop.svc.cluster.local"
    )
    assert "ca_certs" not in pool and "ca_cert_dir" not in pool  # REQUESTS_CA_BUNDLE has no say

    class Pool:
        ca_certs = "/etc/ssl/certs/ca-certificates.crt"
        ca_cert_dir = None
        cert_reqs = None

    conn = Pool()
    mounted.cert_verify(conn, "https://10.0.0.1:8081/soap", True, None)
    assert (conn.ca_certs, conn.cert_reqs) == (None, "CERT_REQUIRED")
    context = pool["ssl_context"]
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "orders CA"),),)]
    # A plain-HTTP broker is called exactly as before: no adapter, nothing read.
    plain = BrokerAdmin("orders-0", "http://10.0.0.1:8081/soap", "t", 1, tls=AdminTls(material, "x", "s"))
    assert not isinstance(plain._session.get_adapter("https://10.0.0.1/"), VerifiedAsAdapter)  # type: ignore[attr-defined]
