"""Hostile, malformed and unauthenticated requests get a SOAP fault and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import zeep

from broker_contracts import soap
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, DEFAULT_TOKEN, ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    backend_status,
    fault_code,
    get_json,
    get_text,
    heartbeat,
    metric,
    post_bundle,
    post_raw,
    raw_fault_code,
)

pytestmark = pytest.mark.integration

ENV = f'xmlns:soap="{soap.SOAP_ENV_NAMESPACE}" xmlns:t="{soap.NAMESPACE}"'


def heartbeat_body(epoch_text: str, prolog: str = "") -> bytes:
    return (
        f'<?xml version="1.0"?>{prolog}<soap:Envelope {ENV}><soap:Body><t:Heartbeat>'
        f"<t:active>true</t:active><t:epoch>{epoch_text}</t:epoch><t:operatorId>x</t:operatorId>"
        "</t:Heartbeat></soap:Body></soap:Envelope>"
    ).encode()


XXE = heartbeat_body("&xxe;", '<!DOCTYPE e [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>')
BILLION_LAUGHS = heartbeat_body(
    "&lol5;",
    '<!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 6)
    )
    + "]>",
)
EXTERNAL_DTD = heartbeat_body("50", '<!DOCTYPE e SYSTEM "http://127.0.0.1:1/evil.dtd">')
MALFORMED = heartbeat_body("50")[:-30]
NOT_SOAP = b'<?xml version="1.0"?><Heartbeat><active>true</active><epoch>50</epoch></Heartbeat>'
UNKNOWN_OPERATION = (
    f"<soap:Envelope {ENV}><soap:Body><t:BecomeActive><t:epoch>50</t:epoch></t:BecomeActive>"
    + "</soap:Body></soap:Envelope>"
).encode()
BAD_EPOCH = heartbeat_body("fifty")
OVERSIZED = heartbeat_body("50", "<!--" + "x" * 200_000 + "-->")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (XXE, "HOSTILE_XML"),
        (BILLION_LAUGHS, "HOSTILE_XML"),
        (EXTERNAL_DTD, "HOSTILE_XML"),
        (OVERSIZED, "HOSTILE_XML"),
        (MALFORMED, "MALFORMED_REQUEST"),
        (NOT_SOAP, "MALFORMED_REQUEST"),
        (UNKNOWN_OPERATION, "UNKNOWN_OPERATION"),
        (BAD_EPOCH, "MALFORMED_REQUEST"),
    ],
    ids=[
        "xxe",
        "billion-laughs",
        "external-dtd",
        "oversized",
        "malformed",
        "not-soap",
        "unknown-op",
        "bad-epoch",
    ],
)
def test_hostile_heartbeat_is_refused_and_changes_nothing(
    processes: ProcessSet, tmp_path: Path, body: bytes, code: str
) -> None:
    relay = start_relay(processes, tmp_path, broker_args={"extra_args": ["--body-limit-bytes", "65536"]})

    status, reply = post_raw(relay.broker.soap_url, body)

    assert status == 500
    assert raw_fault_code(reply) == code
    assert b"root:" not in reply  # no file content leaked into the fault
    assert metric(relay.broker, "broker_active") == 0
    assert metric(relay.broker, "broker_epoch") == 0
    assert backend_status(relay.backend)["resends"] == 0
    assert get_text(relay.broker.url + "/healthz")[0] == 200
    # Still a working broker afterwards.
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"


def test_hostile_bundles_to_an_active_broker_accept_nothing(processes: ProcessSet, tmp_path: Path) -> None:
    relay = start_relay(processes, tmp_path, broker_args={"extra_args": ["--body-limit-bytes", "65536"]})
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    good = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "payload")])
    doctype = good.replace(b"?>", b'?><!DOCTYPE e [<!ENTITY x SYSTEM "file:///etc/passwd">]>', 1)
    oversized = build_envelope(
        "acme", "1000", [("orders-0000", s, f"m-{s}", "p" * 1000) for s in range(1, 100)]
    )
    missing_seq = good.replace(b"<t:seq>1</t:seq>", b"")
    zero_seq = good.replace(b"<t:seq>1</t:seq>", b"<t:seq>0</t:seq>")
    wrong_pair = build_envelope("other", "2000", [("orders-0000", 1, "m-1", "payload")])

    for body, code in [
        (doctype, "HOSTILE_XML"),
        (oversized, "HOSTILE_XML"),
        (missing_seq, "MALFORMED_REQUEST"),
        (zero_seq, "MALFORMED_REQUEST"),
        (wrong_pair, "WRONG_PAIR"),
        (good[:-20], "MALFORMED_REQUEST"),
    ]:
        status, reply = post_bundle(relay.broker.soap_url, body)
        assert (status, raw_fault_code(reply)) == (500, code)

    # Nothing was accepted: the first good bundle starts the stream at seq 1.
    status, reply = post_bundle(relay.broker.soap_url, good)
    assert status == 200 and b"<tns:status>Accepted</tns:status>" in reply
    assert metric(relay.broker, "broker_messages_accepted_total") == 1
    assert get_json(relay.cloud.url + "/sim/status")["outboundTaken"] <= 1


def test_send_messages_needs_the_backends_credential_and_nothing_else(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path)
    assert heartbeat(relay.broker, active=True, epoch=1).state == "Active"
    bundle = build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "payload")])

    # No credential, a wrong one, and the operator's (a different role) are all refused.
    for token in (None, "wrong", DEFAULT_BACKEND_TOKEN + "x", DEFAULT_TOKEN):
        status, reply = post_raw(relay.broker.soap_url, bundle, token=token)
        assert (status, raw_fault_code(reply)) == (500, "UNAUTHENTICATED"), token
        assert b"backend" in reply  # the message says which credential SendMessages needs
    # Hostile XML from an unauthenticated caller is not even parsed.
    doctype = bundle.replace(b"?>", b'?><!DOCTYPE e [<!ENTITY x SYSTEM "file:///etc/passwd">]>', 1)
    assert raw_fault_code(post_raw(relay.broker.soap_url, doctype, token=None)[1]) == "UNAUTHENTICATED"
    assert metric(relay.broker, "broker_messages_accepted_total") == 0

    # The backend's credential opens SendMessages and nothing else.
    status, reply = post_raw(relay.broker.soap_url, bundle, token=DEFAULT_BACKEND_TOKEN)
    assert status == 200 and b"<tns:status>Accepted</tns:status>" in reply
    with pytest.raises(zeep.exceptions.Fault) as refused:
        heartbeat(relay.broker, active=True, epoch=2, token=DEFAULT_BACKEND_TOKEN)
    assert fault_code(refused.value) == "UNAUTHENTICATED"
    assert metric(relay.broker, "broker_epoch") == 1


@pytest.mark.parametrize("operation", ["ListHeld", "ReplayHeld", "DiscardHeld"])
def test_admin_operations_need_the_token(processes: ProcessSet, tmp_path: Path, operation: str) -> None:
    relay = start_relay(processes, tmp_path)
    ref = "<t:direction>outbound</t:direction><t:stream>s</t:stream><t:seq>1</t:seq>"
    inner = "<t:ListHeld/>" if operation == "ListHeld" else f"<t:{operation}>{ref}</t:{operation}>"
    body = f"<soap:Envelope {ENV}><soap:Body>{inner}</soap:Body></soap:Envelope>".encode()
    for token in (None, "wrong"):
        status, reply = post_raw(relay.broker.soap_url, body, token=token)
        assert (status, raw_fault_code(reply)) == (500, "UNAUTHENTICATED")
    status, reply = post_raw(relay.broker.soap_url, body)
    assert status == (200 if operation == "ListHeld" else 500)
