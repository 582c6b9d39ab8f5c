"""Replacing the CA's key with real brokers, real handshakes and the real heartbeat client (issue 41).

The certificates controller's pass (``ensure_certificates``, the real one, over the in-memory
Secret store of the unit tests) runs the replacement; the rest is real: two ``broker-service``
processes on loopback serve TLS from directories written as the kubelet writes a Secret volume
(``write_secret_volume``: one atomic swap of ``..data``), the second broker one pass late, as a
kubelet that syncs later would; the real :class:`HeartbeatClient` with a real :class:`TlsClient`
heartbeats both every 0.1 s (the active with ``active=true``, the standby with ``active=false``),
takes each new client material from ``<name>-operator-client`` as the daemon does, and its view
(the bundle each broker names, the serial each serves, the certificate it presents) is what the
controller's passes observe, as the daemon publishes it. Meanwhile an SAP stand-in sends
``SendMessages`` to the active's main port on a new connection each time, verifying the broker
as the ``-active`` Service's name against the trust the SAP admin holds: the old CA, then the old
and the new one once imported (before the person confirms), then the new one alone after Done.

Asserted: the phases come in order (Trusting, Reissuing, Retiring, Done), no heartbeat and no
SAP request fails at any point, the operator sees no TLS problem; and the ordering matters: once
the leaves are the new CA's, a client holding the old CA alone (what SAP would still have held had
the leaves been issued before Trusting was confirmed) is refused.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import kopf
import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from broker_contracts.tls import bundle_version, client_context
from broker_operator.controller import names
from broker_operator.controller.context import ControllerContext
from broker_operator.core.model import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from broker_operator.pki import bundle_certificates, certificate_info
from broker_operator.tls_client import TlsClient
from broker_operator.tls_material import ClientTlsMaterial
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet, RunningProcess, free_port, loopback_host
from local_cluster.broker_certificates import write_secret_volume
from tests.integration.broker.tls_helpers import BACKEND_TOKEN, OPERATOR_TOKEN, TlsConnection, call, once
from tests.unit.controller.certificate_passes import SecretStore, body, context_for, reconcile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CLUSTER, NAMESPACE = "orders", "shop"
ACTIVE_NAME = f"{names.active_service_name(CLUSTER)}.{NAMESPACE}.svc.cluster.local"
BROKER_KEYS = ("tls.crt", "tls.key", "ca.crt")
ANNOTATION = "broker.failover.dev/replace-ca-key"
PHASES = ["Trusting", "Reissuing", "Retiring", "Done"]


def pod_dns_name(ordinal: int) -> str:
    pod, headless = names.pod_name(CLUSTER, ordinal), names.headless_service_name(CLUSTER)
    return f"{pod}.{headless}.{NAMESPACE}.svc.cluster.local"


def secret(store: SecretStore, name: str) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in store.secrets[name]["data"].items()}


def phase(store: SecretStore) -> str:
    return secret(store, "orders-ca").get("replacement.phase", b"Done").decode()


def trust(*pems: bytes) -> ssl.SSLContext:
    """What a client holding ``pems`` verifies with (the chain and the name; TLS 1.2 floor)."""
    context = ssl.create_default_context(cadata=b"".join(pems).decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def cas(bundle: bytes) -> list[bytes]:
    return [c.public_bytes(encoding=Encoding.PEM) for c in bundle_certificates(bundle)]


@dataclass
class Broker:
    ordinal: int
    process: RunningProcess
    admin_port: int
    tls_dir: Path

    @property
    def target(self) -> BrokerTarget:
        url = f"https://{self.process.host}:{self.admin_port}/soap"
        return BrokerTarget(
            names.pod_name(CLUSTER, self.ordinal), url, self.ordinal, pod_dns_name(self.ordinal)
        )


def start_broker(
    processes: ProcessSet, tmp_path: Path, ordinal: int, files: dict[str, bytes], **urls: str
) -> Broker:
    tls_dir = tmp_path / f"orders-{ordinal}-tls"
    write_secret_volume(tls_dir, {key: files[key] for key in BROKER_KEYS})
    (tmp_path / "ready-ca.crt").write_bytes(files["ca.crt"])
    ready = client_context(ca_file=tmp_path / "ready-ca.crt")
    ready.check_hostname = False  # readiness only: the chain is checked, the name is the test's
    host = loopback_host()
    admin_port = free_port(host)
    process = processes.start_broker(
        tmp_path,
        name=f"orders-{ordinal}",
        host=host,
        extra_args=[
            "--admin-port",
            str(admin_port),
            "--tls-dir",
            str(tls_dir),
            "--tls-reload-seconds",
            "0.1",
        ],
        ready_context=ready,
        **urls,
    )
    return Broker(ordinal, process, admin_port, tls_dir)


@dataclass
class SapSender:
    """The backend: SendMessages to the active's main port, a new connection (a full handshake) each
    time, verified against what ``trusted`` holds now (the SAP admin's STRUST)."""

    host: str
    port: int
    trusted: ssl.SSLContext
    ok: int = 0
    failures: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        seq = 0
        while not stop.is_set() and len(self.failures) < 20:
            seq += 1
            connection = TlsConnection(self.host, self.port, self.trusted, server_name=ACTIVE_NAME)
            envelope = build_envelope("acme", "1000", [("ca-replacement", seq, f"car-{seq}", "x" * 100)])
            try:
                status, reply = call(connection, "POST", "/soap", envelope, BACKEND_TOKEN)
                if status == 200 and b"Accepted" in reply:
                    self.ok += 1
                else:
                    self.failures.append(f"seq {seq}: HTTP {status}: {reply[:200]!r}")
            except OSError as error:  # ssl.SSLError included: a refused handshake
                self.failures.append(f"seq {seq}: {error.__class__.__name__}: {error}")
            finally:
                connection.close()
            time.sleep(0.02)


@dataclass
class Heartbeats:
    """The operator's heartbeats to both brokers every 0.1 s, counting every failed one."""

    client: HeartbeatClient
    brokers: list[Broker]
    sent: int = 0
    failures: list[str] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            for broker in self.brokers:
                active = broker.ordinal == 0
                try:
                    reply = await self.client.heartbeat(broker.target, active, 1)
                    if reply.state.value != ("Active" if active else "Inactive"):
                        self.failures.append(f"{broker.target.name}: {reply}")
                except HeartbeatError as error:
                    self.failures.append(str(error))
                self.sent += 1
            await asyncio.sleep(0.1)


def material(store: SecretStore) -> ClientTlsMaterial:
    held = secret(store, "orders-operator-client")
    return ClientTlsMaterial(held["tls.crt"], held["tls.key"], held["ca.crt"])


async def test_the_ca_key_is_replaced_in_phases_with_no_failed_heartbeat_or_request(  # noqa: PLR0915
    processes: ProcessSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    posted: list[str] = []
    monkeypatch.setattr(kopf, "info", lambda body, *, reason, message: posted.append(reason))
    monkeypatch.setattr(kopf, "warn", lambda body, *, reason, message: posted.append(reason))
    store = SecretStore()
    context: ControllerContext = context_for(store)
    manifest = body()
    await reconcile(context, manifest, now=datetime.now(UTC))  # the CA and both leaves
    files = secret(store, "orders-tls")
    old_ca = files["ca.crt"]

    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    urls = {"backend_url": backend.url, "cloud_url": cloud.url}
    brokers = [start_broker(processes, tmp_path, ordinal, files, **urls) for ordinal in (0, 1)]
    tls = TlsClient(material(store), fresh_handshake_seconds=1.0)
    client = HeartbeatClient(OPERATOR_TOKEN, "ca-replacement-test", 5.0, tls=tls)
    observations = context.observations_for(NAMESPACE, CLUSTER)
    observations.pods = {names.pod_name(CLUSTER, b.ordinal): {} for b in brokers}  # type: ignore[misc]
    observations.loaded_bundles = client.loaded_bundles
    observations.served_serials = client.served_serials
    observations.presented_certificate = client.presented_certificate
    assert (await client.heartbeat(brokers[0].target, True, 1)).state.value == "Active"

    heartbeats = Heartbeats(client, brokers)
    sap = SapSender(brokers[0].process.host, brokers[0].process.port, trust(old_ca))
    stop = threading.Event()
    sender = threading.Thread(target=sap.run, args=(stop,), name="sap", daemon=True)
    beating = asyncio.create_task(heartbeats.run())
    sender.start()
    lagging: dict[str, bytes] | None = None  # what orders-1's kubelet has not written yet

    def kubelet_and_daemon() -> None:
        """After a pass: orders-0's volume now, orders-1's one pass late; the heartbeats' material."""
        nonlocal lagging
        current = {key: secret(store, "orders-tls")[key] for key in BROKER_KEYS}
        write_secret_volume(brokers[0].tls_dir, current)
        if lagging is not None:
            write_secret_volume(brokers[1].tls_dir, lagging)
        lagging = current
        tls.update(material(store))

    seen: list[str] = []
    refused_old_only: list[str] = []
    try:
        await asyncio.sleep(0.5)
        manifest["metadata"]["annotations"] = {ANNOTATION: "rekey-1"}
        for _ in range(80):
            await reconcile(context, manifest, now=datetime.now(UTC))
            now_phase = phase(store)
            if not seen or seen[-1] != now_phase:
                seen.append(now_phase)
            kubelet_and_daemon()
            if now_phase == "Trusting" and f"{ANNOTATION}-trusted" not in manifest["metadata"]["annotations"]:
                status = manifest["status"]["tls"]["caReplacement"]
                waiting = status["message"].startswith("waiting for")
                if waiting and "to load" not in status["message"]:  # brokers trust both: the person's turn
                    assert f"{ANNOTATION}-trusted=rekey-1" in status["message"]
                    # The SAP admin imports the new CA (kubectl broker ca prints both), then confirms.
                    sap.trusted = trust(*cas(secret(store, "orders-tls")["ca.crt"]))
                    manifest["metadata"]["annotations"][f"{ANNOTATION}-trusted"] = "rekey-1"
            if now_phase == "Reissuing" and not refused_old_only:
                # The ordering matters: a client that held the old CA alone is refused by the new leaf.
                new_serial = certificate_info(secret(store, "orders-tls")["tls.crt"]).serial
                both = trust(*cas(secret(store, "orders-tls")["ca.crt"]))
                await _wait_served(brokers[0], both, new_serial)
                with pytest.raises(ssl.SSLCertVerificationError) as refused:
                    once(brokers[0].process.host, brokers[0].process.port, trust(old_ca), "GET", "/healthz",
                         server_name=ACTIVE_NAME)  # fmt: skip
                refused_old_only.append(str(refused.value))
            if now_phase == "Done":
                break
            await asyncio.sleep(0.4)
        new_ca = secret(store, "orders-ca")["ca.crt"]
        sap.trusted = trust(new_ca)  # after Done the SAP admin may drop the old CA
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        sender.join(timeout=30)
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await client.close()

    print(
        f"\nphases {seen}; heartbeats sent {heartbeats.sent}, failed {len(heartbeats.failures)}; "
        f"SendMessages accepted {sap.ok}, failed {len(sap.failures)}; client contexts {tls.contexts_built}"
    )
    assert seen == PHASES, seen
    assert heartbeats.failures == [], heartbeats.failures[:3]
    assert sap.failures == [], sap.failures[:3]
    assert client.tls_problems() == {}
    assert heartbeats.sent > 50 and sap.ok > 50
    assert refused_old_only and "certificate verify failed" in refused_old_only[0]
    assert [r for r in posted if r.startswith("CAReplacement")] == [f"CAReplacement{p}" for p in PHASES]
    assert new_ca != old_ca and cas(secret(store, "orders-tls")["ca.crt"]) == [new_ca]
    # Both brokers serve the new CA's leaf and trust the new CA alone; the operator presents its client.
    assert client.loaded_bundles() == dict.fromkeys(("orders-0", "orders-1"), bundle_version(new_ca))
    serial = certificate_info(secret(store, "orders-tls")["tls.crt"]).serial
    assert {format(int(s, 16), "x") for s in client.served_serials().values()} == {serial}
    for broker in brokers:  # and the metric says the same, as a scraper reads it from the main port
        status, page = once(broker.process.host, broker.process.port, trust(new_ca), "GET", "/metrics",
                            server_name=ACTIVE_NAME)  # fmt: skip
        assert status == 200
        assert (
            f'broker_tls_trust_bundle{{listener="admin",version="{bundle_version(new_ca)}"}} 1.0'
            in page.decode()
        )


async def _wait_served(broker: Broker, context: ssl.SSLContext, serial: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        connection = TlsConnection(broker.process.host, broker.process.port, context, server_name=ACTIVE_NAME)
        try:
            connection.connect()
            served = format(int(connection.served_serial, 16), "x")
        finally:
            connection.close()
        if served == serial:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{broker.target.name} does not serve serial {serial} after {within}s")
