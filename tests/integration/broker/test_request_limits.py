"""Requests sized to stall the event loop are refused before the expensive work (issue 39 item 2).

A heartbeated Active broker receives, with the backend's own credential, bodies that are
well-formed and schema-valid but built to make parsing or validation slow: tens of thousands of
namespace declarations on the operation's ancestors (lxml copies them into the subtree it
validates, quadratic in their number), a bundle over the contract's message count, a body over
the bundle byte limit, and the operator's role sending more than a heartbeat needs. Each must be a
clear ``HOSTILE_XML`` fault naming the limit, and the broker must stay Active at the same epoch,
never having fenced itself: before the fix one such request stalled the loop for seconds, past
the lease margin, and the active fenced itself.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker_contracts import soap
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, DEFAULT_TOKEN, ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import Renewals, heartbeat, metric, post_raw, raw_fault_code

pytestmark = pytest.mark.integration

GOOD = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "payload")])


def declarations(count: int, prefix: str = "n") -> bytes:
    return " ".join(f'xmlns:{prefix}{i}="urn:x:{prefix}{i}"' for i in range(count)).encode()


def with_declarations(tag: bytes, count: int, prefix: str = "n", body: bytes = GOOD) -> bytes:
    assert tag in body
    return body.replace(tag, tag + b" " + declarations(count, prefix), 1)


ON_ENVELOPE = with_declarations(b"<soap:Envelope", 20_000)
ON_BODY = with_declarations(b"<soap:Body", 20_000)
SPLIT = with_declarations(b"<soap:Body", 10_000, "b", with_declarations(b"<soap:Envelope", 10_000, "e"))
TOO_MANY_MESSAGES = build_envelope(
    "acme", "1000", [("orders-0001", s, f"m-{s}", "") for s in range(1, soap.BUNDLE_MAX_MESSAGES + 2)]
)
TOO_LARGE = build_envelope(
    "acme", "1000", [("orders-0002", s, f"m-{s}", "p" * 10_000) for s in range(1, 300)]
)


def test_hostile_bodies_leave_the_active_in_its_term(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path, streams=0)
    broker = relay.broker
    assert heartbeat(broker, active=True, epoch=7).state == "Active"
    assert len(TOO_LARGE) > soap.BUNDLE_MAX_BYTES

    with Renewals(broker, epoch=7):
        for name, body, limit in [
            ("declarations on the Envelope", ON_ENVELOPE, "namespace declarations"),
            ("declarations on the Body", ON_BODY, "namespace declarations"),
            ("declarations split over both", SPLIT, "namespace declarations"),
            ("one message over the count", TOO_MANY_MESSAGES, f"{soap.BUNDLE_MAX_MESSAGES} messages"),
            ("over the byte limit", TOO_LARGE, f"{soap.BUNDLE_MAX_BYTES} bytes"),
        ]:
            status, reply = post_raw(broker.soap_url, body, token=DEFAULT_BACKEND_TOKEN)
            assert (status, raw_fault_code(reply)) == (500, "HOSTILE_XML"), (name, reply[:300])
            assert limit.encode() in reply, (name, reply[:300])
            # The operator's heartbeat still finds the same term after each one.
            reply_state = heartbeat(broker, active=True, epoch=7)
            assert (reply_state.state, reply_state.epoch) == ("Active", 7), name

        # The operator's role gets no more room than a heartbeat needs.
        padded = with_declarations(b"<soap:Envelope", 100, "p", body=_heartbeat_body(7)).replace(
            b"<soap:Body>",
            b"<soap:Header>" + b"h" * (soap.OPERATOR_REQUEST_MAX_BYTES) + b"</soap:Header><soap:Body>",
        )
        status, reply = post_raw(broker.soap_url, padded, token=DEFAULT_TOKEN)
        assert (status, raw_fault_code(reply)) == (500, "HOSTILE_XML")
        assert f"{soap.OPERATOR_REQUEST_MAX_BYTES} bytes".encode() in reply

    assert metric(broker, "broker_active") == 1
    assert metric(broker, "broker_epoch") == 7
    assert metric(broker, "broker_messages_accepted_total") == 0
    log = broker.log_path.read_text(errors="replace")
    assert "fencing itself" not in log
    assert "stalled" not in log
    # Still a working broker: the good bundle is accepted.
    status, reply = post_raw(broker.soap_url, GOOD, token=DEFAULT_BACKEND_TOKEN)
    assert status == 200 and b"<tns:status>Accepted</tns:status>" in reply


def _heartbeat_body(epoch: int) -> bytes:
    return (
        f'<?xml version="1.0"?><soap:Envelope xmlns:soap="{soap.SOAP_ENV_NAMESPACE}" '
        f'xmlns:t="{soap.NAMESPACE}"><soap:Body><t:Heartbeat><t:active>true</t:active>'
        f"<t:epoch>{epoch}</t:epoch><t:operatorId>x</t:operatorId></t:Heartbeat></soap:Body></soap:Envelope>"
    ).encode()


def test_many_hostile_bodies_at_once_leave_the_active_in_its_term(
    processes: ProcessSet, tmp_path: Path
) -> None:
    """Each body is under every limit and slow to parse; sent together, they are parsed one per loop
    iteration, with the lease watcher and the heartbeats in between, never back to back."""
    relay = start_relay(processes, tmp_path, streams=0)
    broker = relay.broker
    assert heartbeat(broker, active=True, epoch=4).state == "Active"
    # The slowest body the limits let through to the parse: the byte limit filled with
    # namespace declarations, refused only after the parse.
    room = soap.BUNDLE_MAX_BYTES - len(GOOD) - 100
    filler = b" ".join(b'xmlns:n%d="u"' % i for i in range(room // 14))[:room]
    slow = GOOD.replace(b"<soap:Envelope", b"<soap:Envelope " + filler[: filler.rfind(b" ")], 1)
    assert len(slow) <= soap.BUNDLE_MAX_BYTES

    with Renewals(broker, epoch=4), ThreadPoolExecutor(max_workers=16) as pool:
        replies = list(
            pool.map(lambda _: post_raw(broker.soap_url, slow, token=DEFAULT_BACKEND_TOKEN), range(16))
        )

    for status, reply in replies:
        assert (status, raw_fault_code(reply)) == (500, "HOSTILE_XML"), reply[:300]
        assert b"namespace declarations" in reply
    reply_state = heartbeat(broker, active=True, epoch=4)
    assert (reply_state.state, reply_state.epoch) == ("Active", 4)
    assert metric(broker, "broker_epoch") == 4
    assert "fencing itself" not in broker.log_path.read_text(errors="replace")
