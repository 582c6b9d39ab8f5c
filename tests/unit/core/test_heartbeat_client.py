"""The heartbeat client's reply handling: zeep-built requests, hostile or broken replies refused.

These call the client's parsing directly with reply bytes, because a hostile
reply cannot be produced by our own broker; the integration tests exercise the
client against real brokers over HTTP.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
from lxml import etree

from broker_contracts.soap import NAMESPACE, BrokerState
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from tests.loopback_http import serving

TARGET = BrokerTarget("b0", "http://127.0.0.1:9/soap", 0)
ENVELOPE = '<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>{}</soap:Body></soap:Envelope>'


SLEEPING = (
    f'<HeartbeatResponse xmlns="{NAMESPACE}"><state>Sleeping</state><epoch>1</epoch></HeartbeatResponse>'
)


def reply(body: str) -> bytes:
    return ENVELOPE.format(body).encode()


@pytest.fixture
def client() -> HeartbeatClient:
    return HeartbeatClient("token", "unit-test", 1.0)


def test_request_is_the_wsdl_heartbeat(client: HeartbeatClient) -> None:
    envelope = etree.fromstring(client._envelope(True, 42, True))
    heartbeat = envelope.find(f".//{{{NAMESPACE}}}Heartbeat")
    assert heartbeat is not None
    # A renewal leaves renewLease out (absent = true): the message of the first WSDL.
    assert [child.text for child in heartbeat] == ["true", "42", "unit-test"]


def test_a_check_carries_renew_lease_false(client: HeartbeatClient) -> None:
    envelope = etree.fromstring(client._envelope(True, 42, False))
    heartbeat = envelope.find(f".//{{{NAMESPACE}}}Heartbeat")
    assert heartbeat is not None
    assert [etree.QName(child).localname for child in heartbeat] == [
        "active",
        "epoch",
        "operatorId",
        "renewLease",
    ]
    assert [child.text for child in heartbeat] == ["true", "42", "unit-test", "false"]


def test_parses_a_reply_with_codes(client: HeartbeatClient) -> None:
    body = (
        f'<HeartbeatResponse xmlns="{NAMESPACE}"><state>Unavailable</state>'
        "<unavailabilityCode>STALE_EPOCH</unavailabilityCode><unavailabilityMessage>old</unavailabilityMessage>"
        "<epoch>9</epoch></HeartbeatResponse>"
    )
    parsed = client._reply(TARGET, 200, reply(body), "text/xml")
    assert parsed.state is BrokerState.UNAVAILABLE
    assert (parsed.unavailability_code, parsed.unavailability_message, parsed.epoch) == (
        "STALE_EPOCH",
        "old",
        9,
    )


def test_fault_names_the_broker_code(client: HeartbeatClient) -> None:
    body = (
        "<soap:Fault><faultcode>soap:Client</faultcode><faultstring>no token</faultstring><detail>"
        f'<BrokerFault xmlns="{NAMESPACE}"><code>UNAUTHENTICATED</code><message>no</message></BrokerFault>'
        "</detail></soap:Fault>"
    )
    with pytest.raises(HeartbeatError, match="UNAUTHENTICATED") as error:
        client._reply(TARGET, 500, reply(body), "text/xml")
    assert error.value.reached


@pytest.mark.parametrize(
    "content",
    [
        b"not xml at all",
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>',
        reply(SLEEPING),
        reply(f'<HeartbeatResponse xmlns="{NAMESPACE}"><state>Active</state></HeartbeatResponse>'),
        reply(f'<Other xmlns="{NAMESPACE}"/>'),
    ],
)
def test_hostile_or_broken_replies_are_errors(client: HeartbeatClient, content: bytes) -> None:
    with pytest.raises(HeartbeatError) as error:
        client._reply(TARGET, 200, content, "text/xml")
    assert error.value.reached  # it got there: an active=true may have renewed the lease


async def test_refused_connection_is_marked_not_reached(client: HeartbeatClient) -> None:
    # Port 9 (discard) on a loopback address nobody listens on: the connect is refused.
    try:
        with pytest.raises(HeartbeatError) as error:
            await client.heartbeat(BrokerTarget("b0", "http://127.0.0.1:9/soap", 0), True, 1)
        assert not error.value.reached
    finally:
        await client.close()


def test_lease_seconds_is_in_the_request_only_when_given(client: HeartbeatClient) -> None:
    assert b"leaseSeconds" not in client._envelope(True, 42, True, None)
    heartbeat = etree.fromstring(client._envelope(True, 42, True, 30.0)).find(f".//{{{NAMESPACE}}}Heartbeat")
    assert heartbeat is not None
    assert [etree.QName(child).localname for child in heartbeat] == [
        "active",
        "epoch",
        "operatorId",
        "leaseSeconds",
    ]
    assert float(heartbeat[3].text or "") == 30.0


ACTIVE_AT_4 = (
    f'<HeartbeatResponse xmlns="{NAMESPACE}"><state>Active</state><epoch>4</epoch></HeartbeatResponse>'
)


async def test_a_handover_renewal_sends_lease_seconds_over_the_wire_and_a_renewal_does_not() -> None:
    """Through a loopback HTTP server that records each body and answers as an Active broker."""
    bodies: list[bytes] = []

    class Broker(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            payload = reply(ACTIVE_AT_4)
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    client = HeartbeatClient("token", "unit-test", 5.0)
    try:
        with serving(Broker) as url:
            target = BrokerTarget("b0", url + "/soap", 0)
            assert (await client.heartbeat(target, True, 4)).state is BrokerState.ACTIVE
            assert (await client.heartbeat(target, True, 4, lease_seconds=30.0)).state is BrokerState.ACTIVE
            await client.heartbeat(target, True, 4)
    finally:
        await client.close()
    leases = [etree.fromstring(body).find(f".//{{{NAMESPACE}}}leaseSeconds") for body in bodies]
    assert [lease is not None and float(lease.text or "") for lease in leases] == [False, 30.0, False]
