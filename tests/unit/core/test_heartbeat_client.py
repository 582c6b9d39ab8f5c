"""The heartbeat client's reply handling: zeep-built requests, hostile or broken replies refused.

These call the client's parsing directly with reply bytes, because a hostile
reply cannot be produced by our own broker; the integration tests exercise the
client against real brokers over HTTP.
"""

from __future__ import annotations

import pytest
from lxml import etree

from broker_contracts.soap import NAMESPACE, BrokerState
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError

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
    parsed = client._parse(TARGET, 200, reply(body), "text/xml")
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
        client._parse(TARGET, 500, reply(body), "text/xml")
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
        client._parse(TARGET, 200, content, "text/xml")
    assert error.value.reached  # it got there: an active=true may have renewed the lease


async def test_refused_connection_is_marked_not_reached(client: HeartbeatClient) -> None:
    # Port 9 (discard) on a loopback address nobody listens on: the connect is refused.
    try:
        with pytest.raises(HeartbeatError) as error:
            await client.heartbeat(BrokerTarget("b0", "http://127.0.0.1:9/soap", 0), True, 1)
        assert not error.value.reached
    finally:
        await client.close()
