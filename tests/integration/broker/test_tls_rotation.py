"""Certificate rotation on a running TLS broker (real process): no request fails, nothing restarts.

The TLS directory is rewritten the way the kubelet updates a Secret volume (new files in a fresh
directory, one atomic rename of ``..data``) while clients keep calling both ports, on new
connections and on kept-alive ones; and files that do not load leave the served certificate as
it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker_contracts.tls import certificate_serial
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.helpers import heartbeat_envelope, reply_state, wait_until
from tests.integration.broker.tls_helpers import (
    BACKEND_TOKEN,
    OPERATOR_TOKEN,
    Pki,
    TlsConnection,
    call,
    client_ssl,
    make_pki,
    metrics_text,
    once,
    sample,
    served_serial,
    start_tls_broker,
)

pytestmark = pytest.mark.integration

ROTATIONS = 6


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class Lane:
    """One client calling in a loop until told to stop, counting what it got."""

    name: str
    connect: Callable[[], TlsConnection]
    request: Callable[[int], tuple[str, str, bytes, str]]  # n -> (method, path, body, token)
    accepted: Callable[[int, bytes], bool]
    keep_alive: bool
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    connects: int = 0

    def run(self, stop: threading.Event) -> None:
        connection = self.connect()
        while not stop.is_set() and len(self.failures) < 20:
            if not self.keep_alive:
                connection = self.connect()
            method, path, body, token = self.request(self.ok + 1)
            try:
                status, reply = call(connection, method, path, body, token)
                if self.accepted(status, reply):
                    self.ok += 1
                else:
                    self.failures.append(f"HTTP {status}: {reply[:200]!r}")
            except OSError as error:  # ssl.SSLError and ConnectionError included
                self.failures.append(f"{error.__class__.__name__}: {error}")
                connection.close()
                connection = self.connect()
            finally:
                if not self.keep_alive:
                    self.connects += connection.connects
                    connection.close()
        if self.keep_alive:
            self.connects = connection.connects
            connection.close()


def test_rotating_the_files_under_load_fails_no_request_and_changes_the_served_serial(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    cloud = processes.start_cloud_simulator(tmp_path)
    backend = processes.start_backend_simulator(tmp_path, streams=0)
    broker = start_tls_broker(
        processes, tmp_path, pki, backend_url=backend.url, cloud_url=cloud.url, allowed_subjects=True
    )
    host = broker.host
    operator = client_ssl(pki.operator_ca.cert, pki.operator)
    sap = client_ssl(pki.operator_ca.cert, pki.backend)
    renew = heartbeat_envelope(True, 1)
    assert reply_state(
        once(host, broker.admin_port, operator, "POST", "/soap", renew, OPERATOR_TOKEN)[1]
    ) == (
        "Active",
        None,
    )
    # The new certificates are made before the load starts: openssl's key generation is no part
    # of what is measured.
    rotations = [pki.issue_server(f"rotated-{n}") for n in range(ROTATIONS)]
    serials = [certificate_serial(files.cert.read_text()) for files in rotations]

    def bundle_lane(name: str, keep_alive: bool) -> Lane:
        return Lane(
            name,
            lambda: TlsConnection(host, broker.main.port, sap),
            lambda seq: (
                "POST",
                "/soap",
                build_envelope("acme", "1000", [(name, seq, f"{name}-{seq}", "x" * 100)]),
                BACKEND_TOKEN,
            ),
            lambda status, reply: status == 200 and b"Accepted" in reply,
            keep_alive,
        )

    def heartbeat_lane(name: str, keep_alive: bool) -> Lane:
        return Lane(
            name,
            lambda: TlsConnection(host, broker.admin_port, operator),
            lambda _: ("POST", "/soap", renew, OPERATOR_TOKEN),
            lambda status, reply: status == 200 and reply_state(reply)[0] == "Active",
            keep_alive,
        )

    lanes = [
        bundle_lane("main-new", keep_alive=False),
        bundle_lane("main-kept", keep_alive=True),
        heartbeat_lane("admin-new", keep_alive=False),
        heartbeat_lane("admin-kept", keep_alive=True),
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=lane.run, args=(stop,), name=lane.name, daemon=True) for lane in lanes]
    anonymous = client_ssl(pki.operator_ca.cert)
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        for files, serial in zip(rotations, serials, strict=True):
            time.sleep(0.3)
            pki.write_tls_dir(broker.tls_dir.path, files)
            # Each rotation reaches both ports' new connections before the next one is written.
            for port in (broker.main.port, broker.admin_port):
                context = anonymous if port == broker.main.port else operator
                wait_until(lambda p=port, c=context, s=serial: served_serial(host, p, c) == s, 20, 0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    elapsed = time.monotonic() - started
    summary = {lane.name: (lane.ok, lane.connects, len(lane.failures)) for lane in lanes}
    print(
        f"\n{ROTATIONS} rotations in {elapsed:.1f}s; per lane (requests ok, connections, failures): {summary}"
    )
    for lane in lanes:
        assert not lane.failures, (lane.name, lane.failures[:3])
        assert lane.ok > ROTATIONS, (lane.name, lane.ok)
    # The kept-alive lanes held one connection throughout, across every rotation.
    assert [lane.connects for lane in lanes if lane.keep_alive] == [1, 1]
    assert min(lane.connects for lane in lanes if not lane.keep_alive) > ROTATIONS
    text = metrics_text(broker, pki)
    for listener in ("main", "admin"):
        assert (
            sample(text, f'broker_tls_serving_certificate{{listener="{listener}",serial="{serials[-1]}"}}')
            == 1
        )
        assert sample(text, f'broker_tls_reloads_total{{listener="{listener}"}}') == ROTATIONS
        assert sample(text, f'broker_tls_reload_failures_total{{listener="{listener}"}}') == 0


def test_a_half_written_or_garbage_certificate_keeps_the_served_one(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki, reload_seconds=0.1)
    host, port = broker.host, broker.main.port
    anonymous = client_ssl(pki.operator_ca.cert)
    first = served_serial(host, port, anonymous)
    assert first == certificate_serial(pki.server.cert.read_text())
    good = broker.tls_dir.cert.read_bytes()

    def warnings() -> int:
        return broker.main.log_text().count(f"main port {port}: the TLS files cannot be loaded")

    # Written in place (what the kubelet never does, a careless copy does): half of the file, then
    # bytes that are no PEM at all, then a whole certificate that is not the key's.
    other = pki.issue_server("not-the-keys")
    broken = [good[: len(good) // 2], b"\x00garbage\xff" * 100, other.cert.read_bytes()]
    for number, content in enumerate(broken, start=1):
        broker.tls_dir.cert.write_bytes(content)
        wait_until(lambda n=number: warnings() >= n, 20, 0.05, what=f"warning {number}")
        assert served_serial(host, port, anonymous) == first
        assert once(host, port, anonymous, "GET", "/healthz")[0] == 200
    time.sleep(0.5)  # several more checks of the same broken file: no more warnings
    assert warnings() == len(broken)
    log = broker.main.log_text()
    assert (
        log.count("tls.crt does not hold whole PEM blocks (half-written, or not PEM)") == 2 * 2
    )  # both ports
    assert "the key is not the certificate's" in log
    text = metrics_text(broker, pki)
    assert sample(text, 'broker_tls_reload_failures_total{listener="main"}') == len(broken)
    assert sample(text, f'broker_tls_serving_certificate{{listener="main",serial="{first}"}}') == 1

    # A proper rotation afterwards is served: the checks went on.
    rotated = pki.issue_server("after-the-garbage")
    pki.write_tls_dir(broker.tls_dir.path, rotated)
    wait_until(
        lambda: served_serial(host, port, anonymous) == certificate_serial(rotated.cert.read_text()), 20, 0.05
    )
