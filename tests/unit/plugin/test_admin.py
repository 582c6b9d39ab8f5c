"""The admin SOAP client against a stand-in HTTP server that answers with the broker's own renderers.

What the plugin sends (operation, credential) and how it reads what a broker answers: a list, a
done action, a fault with the broker's code, and a broker that is not there. The real brokers are
in tests/e2e/test_kubectl_plugin.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from broker_contracts.soap import FaultCode, HeldMessage
from broker_operator.kubectl_plugin.admin import BrokerAdmin, BrokerAdminError
from broker_service import soap_codec
from broker_service.soap_codec import SoapFaultError
from tests.loopback_http import serving


class CannedBroker(BaseHTTPRequestHandler):
    """Answers every POST with ``reply`` (HTTP ``status``) and records each request."""

    reply: ClassVar[bytes] = b""
    status: ClassVar[int] = 200
    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        CannedBroker.seen.append(
            (self.headers.get("SOAPAction", ""), self.headers.get("Authorization", ""), body)
        )
        self.send_response(CannedBroker.status)
        self.send_header("Content-Type", "text/xml; charset=utf-8")
        self.send_header("Content-Length", str(len(CannedBroker.reply)))
        self.end_headers()
        self.wfile.write(CannedBroker.reply)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def broker_url() -> Iterator[str]:
    CannedBroker.seen = []
    with serving(CannedBroker) as url:
        yield f"{url}/soap"


def answer(reply: bytes, status: int = 200) -> None:
    CannedBroker.reply, CannedBroker.status = reply, status


def test_list_held_sends_the_operator_token_and_reads_every_field(broker_url: str) -> None:
    view = HeldMessage(
        "inbound", "invoices-0000", 3, "invoices-0000-3", 2, "rejected", "2026-11-23T11:59:00Z"
    )
    answer(soap_codec.render_list_held([view]))
    held = BrokerAdmin("orders-0", broker_url, "secret-token").list_held("invoices-0000")
    assert held == [
        HeldMessage(
            "inbound", "invoices-0000", 3, "invoices-0000-3", 2, "rejected", "2026-11-23T11:59:00+00:00"
        )
    ]
    ((action, authorization, body),) = CannedBroker.seen
    assert action.strip('"').endswith("/ListHeld")
    assert authorization == "Bearer secret-token"
    assert b"invoices-0000" in body
    answer(soap_codec.render_list_held([]))
    assert BrokerAdmin("orders-0", broker_url, "t").list_held() == []


def test_replay_and_discard_return_the_brokers_message(broker_url: str) -> None:
    answer(soap_codec.render_held_action(True, "inbound stream 'a' seq 3 released for delivery"))
    assert BrokerAdmin("orders-0", broker_url, "t").replay("inbound", "a", 3) == (
        "inbound stream 'a' seq 3 released for delivery"
    )
    assert CannedBroker.seen[-1][0].strip('"').endswith("/ReplayHeld")
    BrokerAdmin("orders-0", broker_url, "t").discard("outbound", "a", 4)
    assert CannedBroker.seen[-1][0].strip('"').endswith("/DiscardHeld")


def test_a_fault_names_the_broker_and_its_code(broker_url: str) -> None:
    answer(soap_codec.render_fault(SoapFaultError(FaultCode.UNAUTHENTICATED, "operator token required")), 500)
    with pytest.raises(BrokerAdminError) as refused:
        BrokerAdmin("orders-1", broker_url, "stale").list_held()
    assert refused.value.code == "UNAUTHENTICATED"
    assert str(refused.value).startswith(
        f"ListHeld refused by broker orders-1 ({broker_url}): UNAUTHENTICATED: operator token required (the "
    )


def test_a_broker_that_is_not_there_says_how_to_reach_it() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/soap"
    with pytest.raises(BrokerAdminError) as unreachable:
        BrokerAdmin("orders-0", url, "t", timeout=2).list_held()
    message = str(unreachable.value)
    assert message.startswith(f"broker orders-0 unreachable at {url} (Connection refused)")
    assert "kubectl port-forward pod/BROKER 18081:8081" in message
    assert unreachable.value.exit_code == 1
