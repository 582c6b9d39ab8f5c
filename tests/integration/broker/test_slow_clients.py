"""Slow clients (slowloris) are closed by the broker and never starve its heartbeats (issue 39 item 8).

A real broker, heartbeated Active, holds many connections that trickle their headers a line at a
time or their body a byte at a time, while the operator's renewals and the backend's bundles go
on. The broker must close every slow connection by itself after its deadline (the header
deadline, or the body deadline with a fault that names it), keep answering heartbeats, and stay
Active at its epoch. A second test fills the connection cap and checks that connections over it
are closed as they open, and that the cap frees again once they go.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from broker_contracts import soap
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, ProcessSet, RunningProcess
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import Renewals, heartbeat, metric, post_bundle, wait_until

pytestmark = pytest.mark.integration

DEADLINE_SECONDS = 2
LIMIT_ARGS = [
    "--header-timeout-seconds",
    str(DEADLINE_SECONDS),
    "--body-timeout-seconds",
    str(DEADLINE_SECONDS),
]


class SlowClient:
    """A raw connection that sent ``head`` and then sends ``trickle`` at every :meth:`step`."""

    def __init__(self, broker: RunningProcess, head: bytes, trickle: bytes) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=5)
        self.sock.sendall(head)
        self.trickle = trickle
        self.reply = b""
        self.closed = False

    def step(self) -> None:
        """Send one more piece, read what came back; notice when the server closed the connection."""
        if self.closed:
            return
        try:
            if self.trickle:
                self.sock.sendall(self.trickle)
            self.sock.settimeout(0.01)
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.closed = True
                    return
                self.reply += data
        except TimeoutError:
            return
        except OSError:  # reset or broken pipe: closed by the server
            self.closed = True

    def close(self) -> None:
        self.sock.close()


def header_trickler(broker: RunningProcess, index: int) -> SlowClient:
    return SlowClient(
        broker, b"POST /soap HTTP/1.1\r\nHost: broker\r\n", f"X-Slow-{index}: still coming\r\n".encode()
    )


def body_trickler(broker: RunningProcess) -> SlowClient:
    head = (
        "POST /soap HTTP/1.1\r\nHost: broker\r\nContent-Type: text/xml; charset=utf-8\r\n"
        f"{soap.AUTH_HEADER}: {soap.AUTH_SCHEME} {DEFAULT_BACKEND_TOKEN}\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    return SlowClient(broker, head, b"<")


def test_slow_connections_are_closed_while_heartbeats_and_bundles_go_on(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path, streams=0, broker_args={"extra_args": LIMIT_ARGS})
    broker = relay.broker
    assert heartbeat(broker, active=True, epoch=3).state == "Active"
    slow_headers = [header_trickler(broker, i) for i in range(40)]
    slow_bodies = [body_trickler(broker) for _ in range(20)]
    slow = slow_headers + slow_bodies
    seq = 0
    try:
        with Renewals(broker, epoch=3):
            # Bounded: the deadlines are 2 s; without them these connections live 75 s or more.
            end = time.monotonic() + 12 * DEADLINE_SECONDS
            while time.monotonic() < end and not all(client.closed for client in slow):
                for client in slow:
                    client.step()
                seq += 1
                bundle = build_envelope("acme", "1000", [("orders-0000", seq, f"m-{seq}", "payload")])
                status, reply = post_bundle(broker.soap_url, bundle)
                assert status == 200 and b"<tns:status>Accepted</tns:status>" in reply, reply[:300]
                time.sleep(0.2)
    finally:
        for client in slow:
            client.close()

    still_open = [i for i, client in enumerate(slow) if not client.closed]
    assert not still_open, f"the broker left {len(still_open)} slow connections open: {still_open}"
    for client in slow_bodies:
        assert b"HOSTILE_XML" in client.reply and b"--body-timeout-seconds" in client.reply, client.reply[
            :300
        ]
    assert seq >= 2 * DEADLINE_SECONDS  # traffic went on throughout
    reply = heartbeat(broker, active=True, epoch=3)
    assert (reply.state, reply.epoch) == ("Active", 3)
    assert metric(broker, "broker_messages_accepted_total") == seq
    assert "fencing itself" not in broker.log_path.read_text(errors="replace")


def test_connections_over_the_cap_are_closed_as_they_open(processes: ProcessSet, tmp_path: Path) -> None:
    cap = 20
    relay = start_relay(
        processes,
        tmp_path,
        streams=0,
        broker_args={"extra_args": ["--max-connections", str(cap), "--header-timeout-seconds", "60"]},
    )
    broker = relay.broker
    assert heartbeat(broker, active=True, epoch=1).state == "Active"
    idle = [SlowClient(broker, b"", b"") for _ in range(cap + 5)]
    try:
        end = time.monotonic() + 10  # bounded; the header deadline (60 s) is far away
        while time.monotonic() < end and sum(client.closed for client in idle) < 5:
            for client in idle:
                client.step()
            time.sleep(0.1)
        closed = [i for i, client in enumerate(idle) if client.closed]
        # Those over the cap went (a few more only if the broker had others open); the rest stay.
        assert 5 <= len(closed) < cap, closed
        assert all(i >= cap - 3 for i in closed), closed
        assert not any(client.reply for client in idle)
    finally:
        for client in idle:
            client.close()
    # The cap frees once they go (the broker notices the closes within a few loop iterations).
    reply = wait_until(
        lambda: _heartbeat_or_none(broker, 1), timeout=10, what="a heartbeat after the cap freed"
    )
    assert (reply.state, reply.epoch) == ("Active", 1)


def _heartbeat_or_none(broker: RunningProcess, epoch: int) -> object:
    try:
        return heartbeat(broker, active=True, epoch=epoch)
    except Exception:  # refused at the cap for a moment longer: try again
        return None
