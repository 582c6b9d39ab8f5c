"""Heartbeats over mutual TLS against real brokers (``--tls-dir``) on loopback (issue 41).

The real :class:`HeartbeatClient` with a real :class:`TlsClient` calls ``broker-service``
processes whose admin port requires the operator's client certificate; the certificates are
made with openssl (``tests/integration/broker/tls_helpers.py``: the operator's CA, a rogue CA).
The brokers listen on ``127.x.y.z`` and their certificate names ``SERVER_NAME``, which the client
verifies as it will verify a pod's DNS name while dialling the pod's IP.

What is proven: keep-alive (one handshake for many heartbeats, the serial recorded once), a
fresh handshake per rotation and per period (and with it a rotated serving certificate seen),
TLS failures classified as ``tls_error`` (a CA or name that does not verify, the operator's
certificate refused under TLS 1.3 and 1.2), a real engine failing nothing over while TLS fails,
and kill -9 still read as a dead broker, idle or in the middle of a handshake.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_contracts.tls import certificate_serial
from broker_operator.broker_watch import BrokerWatches
from broker_operator.core import Observation, ProcessGone
from broker_operator.core.model import BrokerTarget
from broker_operator.engine import ClusterLoop, HeartbeatClient, HeartbeatError
from broker_operator.local_runner import StateFile
from broker_operator.tls_client import TlsClient
from broker_operator.tls_material import ClientTlsMaterial
from broker_simulators.local_processes import ProcessSet
from local_cluster.broker_certificates import CertificateFiles, tls_secret, write_secret_volume
from tests.integration.broker.tls_helpers import (
    OPERATOR_TOKEN,
    SERVER_NAME,
    Pki,
    TlsBroker,
    make_pki,
    start_tls_broker,
)
from tests.integration.operator.conftest import SETTINGS, ProcessShell, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


def material(
    pki: Pki, client: CertificateFiles | None = None, *, trust: tuple[Path, ...] = ()
) -> ClientTlsMaterial:
    client = client or pki.operator
    return ClientTlsMaterial(
        certificate_pem=client.cert.read_bytes(),
        key_pem=client.key.read_bytes(),
        trust_bundle_pem=b"".join(path.read_bytes() for path in trust or (pki.operator_ca.cert,)),
    )


def target(
    broker: TlsBroker, name: str = "b0", priority: int = 0, server_name: str = SERVER_NAME
) -> BrokerTarget:
    return BrokerTarget(name, f"https://{broker.host}:{broker.admin_port}/soap", priority, server_name)


def serial_of(files: CertificateFiles) -> str:
    return certificate_serial(files.cert.read_text()).lower()


async def failure(client: HeartbeatClient, to: BrokerTarget) -> HeartbeatError:
    try:
        reply = await client.heartbeat(to, False, 0)
    except HeartbeatError as error:
        return error
    raise AssertionError(f"answered: {reply}")


async def test_heartbeats_keep_one_connection_and_record_the_served_serial(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    tls = TlsClient(material(pki))
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=tls)
    try:
        for _ in range(10):
            reply = await client.heartbeat(target(broker), False, 0)
            assert reply.state == "Inactive"
        assert tls.handshakes == 1  # keep-alive: one full handshake for ten heartbeats
        assert client.served_serials() == {"b0": serial_of(pki.server)}
        assert client.tls_problems() == {}
    finally:
        await client.close()


async def test_rotation_and_the_fresh_handshake_period_open_new_connections(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    now = [0.0]
    tls = TlsClient(material(pki), fresh_handshake_seconds=300, clock=lambda: now[0])
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=tls)
    try:
        await client.heartbeat(target(broker), False, 0)
        assert tls.handshakes == 1

        # The broker's serving certificate is rotated (the kubelet swaps the Secret volume; the
        # broker reloads). The open connection goes on with the old one: that is keep-alive.
        rotated = pki.issue_server("rotated")
        pki.write_tls_dir(broker.tls_dir.path, rotated)
        await asyncio.sleep(1.0)  # the broker reads its files every 0.2 s
        await client.heartbeat(target(broker), False, 0)
        assert tls.handshakes == 1 and client.served_serials()["b0"] == serial_of(pki.server)

        # The period passes: a fresh context, a new connection, the new certificate seen.
        now[0] = 300.0
        assert (await client.heartbeat(target(broker), False, 0)).state == "Inactive"
        assert tls.handshakes == 2 and client.served_serials()["b0"] == serial_of(rotated)

        # The operator's material rotates: a new client certificate and a wider trust (a CA key
        # replacement's first phase). The next call uses a new context, and succeeds.
        renewed = pki.operator_ca.issue_client(
            "operator-renewed", "/O=broker-failover/CN=broker-failover-operator"
        )
        assert tls.update(material(pki, renewed, trust=(pki.operator_ca.cert, pki.rogue_ca.cert)))
        assert (await client.heartbeat(target(broker), False, 0)).state == "Inactive"
        assert tls.handshakes == 3

        # A client certificate from a second CA, once the broker trusts both (its ca.crt): the
        # phase in which the operator's certificate comes from the new CA.
        write_secret_volume(
            broker.tls_dir.path, tls_secret(rotated, [pki.operator_ca.cert, pki.rogue_ca.cert])
        )
        await asyncio.sleep(1.0)
        assert tls.update(material(pki, pki.rogue, trust=(pki.operator_ca.cert, pki.rogue_ca.cert)))
        assert (await client.heartbeat(target(broker), False, 0)).state == "Inactive"
        assert tls.handshakes == 4
    finally:
        await client.close()


@pytest.mark.parametrize("tls_version", [None, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
async def test_what_does_not_verify_or_is_refused_is_a_tls_error(
    processes: ProcessSet, tmp_path: Path, pki: Pki, tls_version: ssl.TLSVersion | None
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    cases = {
        "wrong CA": (material(pki, trust=(pki.rogue_ca.cert,)), SERVER_NAME, "certificate verify failed"),
        "wrong name": (material(pki), "acme-1000-1.acme-1000.erp.svc", "Hostname mismatch"),
        # A client certificate the broker does not trust: under TLS 1.3 the refusal comes after the
        # client's side of the handshake, under 1.2 as a reset in it; either reads like a crash.
        "refused": (material(pki, pki.rogue), SERVER_NAME, "refused the TLS handshake"),
    }
    for case, (each, server_name, words) in cases.items():
        tls = TlsClient(each)
        if tls_version is not None:
            tls.context().maximum_version = tls_version
        client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=tls)
        try:
            error = await failure(client, target(broker, server_name=server_name))
        finally:
            await client.close()
        assert error.tls_error, (case, str(error))
        assert words in error.reason, (case, error.reason)
        assert server_name in error.reason, (case, error.reason)
    # The broker is fine all along: a good client is answered.
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=TlsClient(material(pki)))
    try:
        assert (await client.heartbeat(target(broker), False, 0)).state == "Inactive"
    finally:
        await client.close()


async def test_kill_9_of_an_idle_tls_broker_is_a_refused_connection_not_a_tls_error(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=TlsClient(material(pki)))
    try:
        await client.heartbeat(target(broker), False, 0)  # a pooled keep-alive connection
        await asyncio.to_thread(broker.main.kill, signal.SIGKILL)
        error = await failure(client, target(broker))
    finally:
        await client.close()
    # As over plain HTTP: the dead process's port refuses, so the call surely never arrived.
    assert not error.tls_error and not error.reached, str(error)
    assert "Connect call failed" in error.reason or "refused" in error.reason.lower(), error.reason


async def test_kill_9_during_the_handshake_is_a_broken_connection_not_a_tls_error(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=TlsClient(material(pki)))
    try:
        # Stopped, its kernel still takes the connection (the listen queue), and the ClientHello
        # waits; killed, the kernel resets what the queue held: mid-handshake.
        await asyncio.to_thread(broker.main.kill, signal.SIGSTOP)
        call = asyncio.create_task(failure(client, target(broker)))
        await asyncio.sleep(0.5)
        assert not call.done()
        await asyncio.to_thread(broker.main.kill, signal.SIGKILL)
        error = await asyncio.wait_for(call, 5)
    finally:
        await client.close()
    assert not error.tls_error, str(error)
    assert not error.timed_out, str(error)
    # The handshake never completed, so the request was never sent: as a failed connect.
    assert not error.reached, str(error)


async def test_the_engine_fails_nothing_over_while_tls_fails(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    cloud = processes.start_cloud_simulator()
    backend = processes.start_backend_simulator()
    brokers = {
        name: start_tls_broker(
            processes, tmp_path, pki, name=name, backend_url=backend.url, cloud_url=cloud.url
        )
        for name in ("b0", "b1")
    }
    targets = [target(broker, name, priority) for priority, (name, broker) in enumerate(brokers.items())]
    state = StateFile(tmp_path / "state.json")
    _epoch, status = state.load()
    shell = ProcessShell(state, {name: broker.main for name, broker in brokers.items()}, pods=False)
    now = [0.0]
    tls = TlsClient(material(pki), fresh_handshake_seconds=300, clock=lambda: now[0])
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", SETTINGS.timeout_seconds, tls=tls)
    loop = ClusterLoop("acme-1000", targets, SETTINGS, shell, client, status, None)
    task = asyncio.create_task(loop.run())
    try:
        await eventually(lambda: shell.reasons().count("Activated") == 1, 20, "b0 activated over TLS")
        assert shell.statuses[-1].active == "b0"
        # The operator's trust is replaced by a bundle that verifies no broker (a botched CA
        # rotation), and a fresh context is due: every heartbeat now fails in TLS.
        tls.update(material(pki, trust=(pki.rogue_ca.cert,)))
        await asyncio.sleep(4 * SETTINGS.failure_threshold * SETTINGS.interval_seconds)
        assert client.tls_problems().keys() == {"b0", "b1"}
        assert "Failover" not in shell.reasons() and shell.reasons().count("Activated") == 1
        assert shell.statuses[-1].active == "b0" and shell.statuses[-1].epoch == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def watch_signals(
    client: HeartbeatClient, to: BrokerTarget, broker: TlsBroker, *, kill: bool
) -> tuple[bool, list[Observation]]:
    """Watch ``to`` over TLS for two seconds (killing the broker after one, with ``kill``): whether
    a stream was held, and what the watch signalled."""
    signals: list[Observation] = []
    watches = BrokerWatches(client, signals.append)
    watches.follow([to])
    try:
        held = False
        for _ in range(20):
            await asyncio.sleep(0.1)
            held = held or watches.holding(to.name)
        if kill:
            await asyncio.to_thread(broker.main.kill, signal.SIGKILL)
            await eventually(lambda: bool(signals), 10, "a signal from the watch")
        else:
            await asyncio.sleep(1.0)
    finally:
        await watches.close()
    return held, signals


async def test_the_watch_holds_its_stream_over_tls_and_proves_a_kill_9(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=TlsClient(material(pki)))
    try:
        held, signals = await watch_signals(client, target(broker), broker, kill=True)
    finally:
        await client.close()
    assert held
    assert isinstance(signals[0], ProcessGone), signals


@pytest.mark.parametrize("tls_version", [None, ssl.TLSVersion.TLSv1_2], ids=["tls1.3", "tls1.2"])
async def test_a_watch_whose_certificate_is_refused_signals_nothing(
    processes: ProcessSet, tmp_path: Path, pki: Pki, tls_version: ssl.TLSVersion | None
) -> None:
    # Each refusal must not read as a lost connection: counted as a failed heartbeat of the active
    # once a second, it would fail a healthy broker over.
    broker = start_tls_broker(processes, tmp_path, pki)
    tls = TlsClient(material(pki, pki.rogue))
    if tls_version is not None:
        tls.context().maximum_version = tls_version
    client = HeartbeatClient(OPERATOR_TOKEN, "tls-test", 5.0, tls=tls)
    try:
        held, signals = await watch_signals(client, target(broker), broker, kill=False)
    finally:
        await client.close()
    assert not held and signals == []
