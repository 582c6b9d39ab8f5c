"""``kubectl broker held`` over mutual TLS against a real broker on loopback (issue 41).

A real ``broker-service`` serves TLS on both ports from the test PKI (``tls_helpers.make_pki``); its
admin port requires the operator's client certificate. It is Active (heartbeats over mTLS) and
relays a cloud simulator's inbound messages, two of which the backend simulator always rejects, so
it holds them. The plugin's own code then lists, replays and discards them: ``held.list_held`` and
``held.release_held`` with the real ``BrokerAdmin`` (zeep over requests, through
``admin_tls.VerifiedAsAdapter``) and the client certificate read by the real rules
(``admin_tls.client_material`` over a ``<name>-operator-client`` Secret as the operator writes it).
Only the Kubernetes reads are stood in for: the pod's address (its IP, ``127.x.y.z``) and its DNS
name (``SERVER_NAME``, which the serving certificate carries and the plugin verifies while dialling
the IP, through ``--url`` too).

Refused: no client certificate, one from a CA the broker does not trust, a trust bundle that does
not hold the broker's CA (with ``REQUESTS_CA_BUNDLE`` naming the right one: the adapter trusts the
bundle alone), and a name the certificate does not carry; each a clear error, not a hang.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.kubectl_plugin import admin_tls, held
from broker_operator.kubectl_plugin.admin import BrokerAdmin, BrokerAdminError
from broker_operator.kubectl_plugin.admin_tls import AdminTls, VerifiedAsAdapter
from broker_operator.kubectl_plugin.errors import PluginError
from broker_operator.kubectl_plugin.kube import BrokerAddress
from broker_operator.pki import KeyPair
from broker_operator.tls_material import ClientTlsMaterial
from broker_simulators.local_processes import ProcessSet
from local_cluster.broker_certificates import CertificateFiles
from tests.integration.broker.helpers import heartbeat_envelope, reply_state
from tests.integration.broker.tls_helpers import (
    OPERATOR_TOKEN,
    SERVER_NAME,
    Pki,
    TlsBroker,
    client_ssl,
    make_pki,
    once,
    start_tls_broker,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NAMESPACE = "shop"
OWNER = {
    "apiVersion": f"{names.GROUP}/{names.VERSION}",
    "kind": names.KIND,
    "metadata": {"name": "orders", "namespace": NAMESPACE, "uid": "uid-orders"},
}
SOURCE = f"Secret {NAMESPACE}/orders-operator-client"
FAST_RETRIES = ["--retry-base-seconds", "0.02", "--retry-max-seconds", "0.1"]
POISONED = [("invoices-0000", 2), ("invoices-0001", 3)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


def material(
    pki: Pki, client: CertificateFiles | None = None, trust: Path | None = None
) -> ClientTlsMaterial:
    client = client or pki.operator
    return ClientTlsMaterial(
        certificate_pem=client.cert.read_bytes(),
        key_pem=client.key.read_bytes(),
        trust_bundle_pem=(trust or pki.operator_ca.cert).read_bytes(),
    )


def operator_client_secret(pki: Pki) -> dict[str, Any]:
    """``<name>-operator-client`` as the operator writes it and the API server returns it."""
    pair = KeyPair(pki.operator.cert.read_bytes(), pki.operator.key.read_bytes())
    data = shapes.operator_client_secret_data(pair, pki.operator_ca.cert.read_bytes())
    secret = shapes.build_operator_client_secret(OWNER, data)
    secret["metadata"]["resourceVersion"] = "1"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert all(base64.b64decode(v) for v in secret["data"].values())
    return secret


class PodKube:
    """The plugin's ``Kube`` calls for one BrokerCluster whose pod ``orders-0`` is ``broker``; the
    Secret reads go through the real rules of ``admin_tls.client_material``."""

    namespace = NAMESPACE

    def __init__(self, broker: TlsBroker, secrets: dict[str, dict[str, Any]]) -> None:
        self.url = f"https://{broker.host}:{broker.admin_port}/soap"
        self.secrets = secrets
        self.secret_reads: list[str] = []

    def broker_addresses(self, body: Any) -> list[BrokerAddress]:
        return [BrokerAddress("orders-0", self.url, SERVER_NAME)]

    def operator_token(self, body: Any) -> str:
        return OPERATOR_TOKEN

    def client_tls(self, body: Any) -> tuple[ClientTlsMaterial, str]:
        return admin_tls.client_material(body, NAMESPACE, "Operator", None, self.read)

    def read(self, secret: str, advice: str) -> dict[str, Any] | None:
        self.secret_reads.append(secret)
        return self.secrets.get(secret)


def cluster_body() -> dict[str, Any]:
    return {
        **OWNER,
        "spec": {"account": "acme", "company": "1000", "replicas": 1},
        "status": {"active": "orders-0"},
    }


def activate(broker: TlsBroker, pki: Pki) -> None:
    """One Heartbeat(active) over mutual TLS: renews the broker's lease."""
    context = client_ssl(pki.operator_ca.cert, pki.operator)
    status, body = once(
        broker.host, broker.admin_port, context, "POST", "/soap", heartbeat_envelope(True, 1), OPERATOR_TOKEN
    )
    assert status == 200 and reply_state(body)[0] == "Active", body[:300]


def held_keys(kube: PodKube, **options: Any) -> list[tuple[str, str, int]]:
    found = held.list_held(
        kube, cluster_body(), broker=None, all_brokers=False, url=None, stream=None, timeout=5, **options
    )  # type: ignore[arg-type]
    return sorted((m.direction, m.stream, m.seq) for _, m in found)


@pytest.fixture
def holding_broker(processes: ProcessSet, tmp_path: Path, pki: Pki) -> TlsBroker:
    """A TLS broker, Active, holding the two poisoned inbound messages."""
    cloud = processes.start_cloud_simulator(
        tmp_path,
        inbound_streams=2,
        inbound_messages_per_stream=4,
        poison=[f"{stream}:{seq}:always" for stream, seq in POISONED],
    )
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    broker = start_tls_broker(
        processes, tmp_path, pki, backend_url=backend.url, cloud_url=cloud.url, extra_args=tuple(FAST_RETRIES)
    )
    kube = PodKube(broker, {"orders-operator-client": operator_client_secret(pki)})
    deadline = time.monotonic() + 60
    while held_keys(kube) != sorted(("inbound", s, q) for s, q in POISONED):
        assert time.monotonic() < deadline, f"not held in time: {held_keys(kube)}"
        activate(broker, pki)  # keeps the lease while the broker delivers and holds
        time.sleep(0.3)
    return broker


def test_held_list_replay_and_discard_over_mutual_tls(holding_broker: TlsBroker, pki: Pki) -> None:
    broker = holding_broker
    kube = PodKube(broker, {"orders-operator-client": operator_client_secret(pki)})
    found = held.list_held(
        kube,
        cluster_body(),
        broker=None,
        all_brokers=False,
        url=None,
        stream=None,
        timeout=5,  # type: ignore[arg-type]
    )
    assert sorted((b, m.stream, m.seq) for b, m in found) == [("orders-0", s, q) for s, q in POISONED]
    assert kube.secret_reads == ["orders-operator-client"]  # the one Secret; never <name>-ca

    activate(broker, pki)
    replayed = held.release_held(
        kube, cluster_body(), action="replay", direction="inbound", stream="invoices-0000", seq=2,
        broker=None, url=None, timeout=5,
    )  # type: ignore[arg-type]  # fmt: skip
    assert replayed[0] == "orders-0"
    activate(broker, pki)
    # Through --url (a port-forward's address): still verified as the pod's DNS name.
    discarded = held.release_held(
        kube, cluster_body(), action="discard", direction="inbound", stream="invoices-0001", seq=3,
        broker="orders-0", url=kube.url, timeout=5,
    )  # type: ignore[arg-type]  # fmt: skip
    assert discarded[0] == "orders-0"
    # The discarded one is gone for good; the replayed one is tried again (and held again, as
    # the backend always rejects it), never the discarded one.
    activate(broker, pki)
    assert ("inbound", "invoices-0001", 3) not in held_keys(kube)
    with pytest.raises(BrokerAdminError, match="NOT_FOUND"):
        held.release_held(
            kube, cluster_body(), action="discard", direction="inbound", stream="invoices-0001", seq=3,
            broker=None, url=None, timeout=5,
        )  # type: ignore[arg-type]  # fmt: skip

    # The held counts of `kubectl broker status` take the same path.
    counts = held.held_counts(kube, cluster_body())  # type: ignore[arg-type]
    assert counts["orders-0"].count is not None and counts["orders-0"].error is None


def test_what_the_broker_refuses_or_the_plugin_does_not_trust_is_a_clear_error(
    processes: ProcessSet, tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    url = f"https://{broker.host}:{broker.admin_port}/soap"
    good = BrokerAdmin("orders-0", url, OPERATOR_TOKEN, 5, tls=AdminTls(material(pki), SERVER_NAME, SOURCE))
    assert good.list_held() == []  # the same broker, the operator's certificate: answered

    # No client certificate at all: the admin port refuses the handshake.
    bare = client_ssl(pki.operator_ca.cert)  # trust only, nothing to present
    session = requests.Session()
    session.mount("https://", VerifiedAsAdapter(bare, SERVER_NAME))
    with pytest.raises(requests.exceptions.ConnectionError):
        session.post(url, data=heartbeat_envelope(False, 0), timeout=5).raise_for_status()
    session.close()

    # requests' own CA bundle from the environment names the right CA: not trusted all the same.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pki.operator_ca.cert))
    cases = {
        "a client certificate from a CA the broker does not trust": (
            material(pki, pki.rogue),
            SERVER_NAME,
            "its admin port must accept the client certificate of " + SOURCE,
        ),
        "a bundle without the broker's CA": (
            material(pki, trust=pki.rogue_ca.cert),
            SERVER_NAME,
            "certificate verify failed",
        ),
        "a name the certificate does not carry": (
            material(pki),
            "orders-9.orders-brokers.shop.svc.cluster.local",
            "Hostname mismatch",
        ),
    }
    for case, (each, server_name, words) in cases.items():
        admin = BrokerAdmin("orders-0", url, OPERATOR_TOKEN, 5, tls=AdminTls(each, server_name, SOURCE))
        started = time.monotonic()
        with pytest.raises(BrokerAdminError) as refused:
            admin.list_held()
        message = str(refused.value)
        assert words in message, (case, message)
        assert "orders-0" in message and time.monotonic() - started < 5, (case, message)
        assert "BEGIN" not in message and "PRIVATE" not in message


def test_no_client_certificate_secret_or_a_foreign_one_is_said_before_any_call(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    kube = PodKube(broker, {})
    with pytest.raises(PluginError) as missing:
        held_keys(kube)
    assert "Secret shop/orders-operator-client does not exist yet" in str(missing.value)
    assert "orders-ca" in str(missing.value) and "never reads" in str(missing.value)
    foreign = operator_client_secret(pki)
    foreign["metadata"]["ownerReferences"] = []  # made by someone else, not the operator
    kube = PodKube(broker, {"orders-operator-client": foreign})
    with pytest.raises(PluginError, match="is not recorded as the operator's"):
        held_keys(kube)
