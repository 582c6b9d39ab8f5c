"""The broker's SOAP codec against the shared WSDL: zeep builds what we parse and parses what we render."""

from __future__ import annotations

import pytest
import zeep
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from broker_contracts import wsdl_path
from broker_contracts.soap import AcceptStatus, FaultCode
from broker_service import soap_codec
from broker_service.soap_codec import HeartbeatRequest, SendMessagesRequest, SoapFaultError
from broker_simulators.backend import build_envelope

CLIENT = zeep.Client(str(wsdl_path()))
OPERATIONS = CLIENT.service._binding._operations  # zeep keeps the bound operations here


def zeep_request(operation: str, **values: object) -> bytes:
    return etree.tostring(CLIENT.create_message(CLIENT.service, operation, **values))


def test_heartbeat_built_by_zeep_is_parsed() -> None:
    parsed = soap_codec.parse_request(zeep_request("Heartbeat", active=False, epoch=12, operatorId="op-7"))
    assert parsed == HeartbeatRequest(active=False, epoch=12, operator_id="op-7")


@pytest.mark.parametrize(
    ("values", "renew"), [({}, True), ({"renewLease": False}, False), ({"renewLease": True}, True)]
)
def test_heartbeat_renew_lease_is_optional_and_true_when_absent(values: dict[str, bool], renew: bool) -> None:
    body = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", **values)
    assert (b"renewLease" in body) == bool(values)
    assert soap_codec.parse_request(body) == HeartbeatRequest(
        active=True, epoch=3, operator_id="op", renew_lease=renew
    )


@pytest.mark.parametrize("text", ["0", " false "])
def test_heartbeat_renew_lease_takes_every_xsd_boolean_form(text: str) -> None:
    body = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", renewLease=True)
    body = body.replace(b">true</ns0:renewLease>", f">{text}</ns0:renewLease>".encode())
    parsed = soap_codec.parse_request(body)
    assert isinstance(parsed, HeartbeatRequest) and parsed.renew_lease is False


def test_heartbeat_renew_lease_must_be_a_boolean() -> None:
    body = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", renewLease=True)
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(body.replace(b">true</ns0:renewLease>", b">later</ns0:renewLease>"))
    assert raised.value.code is FaultCode.MALFORMED_REQUEST


def test_heartbeat_lease_seconds_is_optional_after_renew_lease_and_absent_is_none() -> None:
    plain = soap_codec.parse_request(zeep_request("Heartbeat", active=True, epoch=3, operatorId="op"))
    assert isinstance(plain, HeartbeatRequest) and plain.lease_seconds is None
    body = zeep_request(
        "Heartbeat", active=True, epoch=3, operatorId="op", renewLease=True, leaseSeconds=30.0
    )
    assert soap_codec.parse_request(body) == HeartbeatRequest(
        active=True, epoch=3, operator_id="op", renew_lease=True, lease_seconds=30.0
    )
    alone = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", leaseSeconds=2.5)
    assert soap_codec.parse_request(alone) == HeartbeatRequest(
        active=True, epoch=3, operator_id="op", lease_seconds=2.5
    )


# Huge is a lease the broker caps at its --max-lease-seconds, not a hostile value.
@pytest.mark.parametrize(
    ("text", "seconds"), [("1e300", 1e300), (" 30 ", 30.0), ("0.25", 0.25), ("1E3", 1e3)]
)
def test_heartbeat_lease_seconds_takes_any_positive_finite_double(text: str, seconds: float) -> None:
    body = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", leaseSeconds=30.0)
    body = body.replace(b">30.0</ns0:leaseSeconds>", f">{text}</ns0:leaseSeconds>".encode())
    parsed = soap_codec.parse_request(body)
    assert isinstance(parsed, HeartbeatRequest) and parsed.lease_seconds == seconds


@pytest.mark.parametrize("text", ["NaN", "INF", "-INF", "1e400", "0", "-0", "-5", "-1e-300", "soon", ""])
def test_heartbeat_lease_seconds_that_is_no_positive_finite_number_is_a_client_fault(text: str) -> None:
    body = zeep_request("Heartbeat", active=True, epoch=3, operatorId="op", leaseSeconds=30.0)
    assert b">30.0</ns0:leaseSeconds>" in body
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(
            body.replace(b">30.0</ns0:leaseSeconds>", f">{text}</ns0:leaseSeconds>".encode())
        )
    assert raised.value.code is FaultCode.MALFORMED_REQUEST and raised.value.client


def test_heartbeat_lease_seconds_before_renew_lease_is_not_valid_against_the_wsdl() -> None:
    body = zeep_request(
        "Heartbeat", active=True, epoch=3, operatorId="op", renewLease=True, leaseSeconds=30.0
    )
    swapped = body.replace(
        b"<ns0:renewLease>true</ns0:renewLease><ns0:leaseSeconds>30.0</ns0:leaseSeconds>",
        b"<ns0:leaseSeconds>30.0</ns0:leaseSeconds><ns0:renewLease>true</ns0:renewLease>",
    )
    assert swapped != body
    with pytest.raises(SoapFaultError, match="not valid against the WSDL"):
        soap_codec.parse_request(swapped)


def test_send_messages_built_by_zeep_is_parsed_in_bundle_order() -> None:
    messages = [
        {"stream": "b", "seq": 4, "msgId": "m4", "payload": "<x>&amp;</x>"},
        {"stream": "a", "seq": 1, "msgId": "m1", "payload": ""},
    ]
    parsed = soap_codec.parse_request(
        zeep_request("SendMessages", account="acme", company="1000", message=messages)
    )
    assert parsed == SendMessagesRequest(
        "acme", "1000", ["b", "a"], [4, 1], ["m4", "m1"], ["<x>&amp;</x>", ""]
    )


def test_the_backend_simulators_envelope_is_what_zeep_would_send() -> None:
    ours = soap_codec.parse_request(
        build_envelope("acme", "1000", [("s", 1, "m1", "p1"), ("s", 2, "m2", "p2")])
    )
    theirs = soap_codec.parse_request(
        zeep_request(
            "SendMessages",
            account="acme",
            company="1000",
            message=[
                {"stream": "s", "seq": 1, "msgId": "m1", "payload": "p1"},
                {"stream": "s", "seq": 2, "msgId": "m2", "payload": "p2"},
            ],
        )
    )
    assert ours == theirs


def test_rendered_responses_are_read_by_zeep() -> None:
    heartbeat = OPERATIONS["Heartbeat"].process_reply(
        etree.fromstring(soap_codec.render_heartbeat("Unavailable", 4, "STALE_EPOCH", "epoch 3 < 4 & more"))
    )
    assert (heartbeat.state, heartbeat.epoch, heartbeat.unavailabilityCode) == (
        "Unavailable",
        4,
        "STALE_EPOCH",
    )
    assert heartbeat.unavailabilityMessage == "epoch 3 < 4 & more"
    sent = OPERATIONS["SendMessages"].process_reply(
        etree.fromstring(
            soap_codec.render_send_messages(
                9, [("s<1>", 1, AcceptStatus.ACCEPTED, None), ("s<1>", 3, AcceptStatus.GAP, 2)]
            )
        )
    )
    assert sent.epoch == 9
    assert [(r.stream, r.seq, r.status, r.expectedSeq) for r in sent.result] == [
        ("s<1>", 1, "Accepted", None),
        ("s<1>", 3, "Gap", 2),
    ]


def test_faults_are_read_by_zeep_with_the_broker_fault_detail() -> None:
    fault = SoapFaultError(FaultCode.BROKER_INACTIVE, "broker b is Inactive", client=False)
    with pytest.raises(zeep.exceptions.Fault) as raised:
        CLIENT.service._binding.process_error(
            etree.fromstring(soap_codec.render_fault(fault)), OPERATIONS["SendMessages"]
        )
    assert raised.value.message == "broker b is Inactive"
    assert raised.value.detail.find(".//{*}code").text == "BROKER_INACTIVE"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>', FaultCode.HOSTILE_XML),
        (b"<x><y></x>", FaultCode.MALFORMED_REQUEST),
        (b"", FaultCode.MALFORMED_REQUEST),
        (b"<Envelope/>", FaultCode.MALFORMED_REQUEST),
    ],
)
def test_hostile_and_malformed_bodies(body: bytes, code: FaultCode) -> None:
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(body)
    assert raised.value.code is code


_XML_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>'
_HEARTBEAT = _XML_DECLARATION + zeep_request("Heartbeat", active=True, epoch=1, operatorId="a")
_DTD = b'<!DOCTYPE x [<!ENTITY a "b">]>'


@pytest.mark.parametrize(
    "prolog",
    [
        b"",
        b"\n  ",
        b"<!-- a comment --> ",
        b"<?pi some data?>\n",
        b"<!-- one --><?pi?><!-- two -->",
        b"<!-- <root/> inside a comment -->",
    ],
)
def test_a_doctype_anywhere_in_the_prolog_is_hostile(prolog: bytes) -> None:
    # The scan that replaced the whole-body search must still see a DOCTYPE past comments and PIs.
    declaration, _, rest = _HEARTBEAT.partition(b"?>")
    for body in (declaration + b"?>" + prolog + _DTD + rest, b"\xef\xbb\xbf" + prolog + _DTD + rest):
        with pytest.raises(SoapFaultError) as raised:
            soap_codec.parse_request(body)
        assert raised.value.code is FaultCode.HOSTILE_XML, body[:80]


def test_a_comment_that_only_mentions_a_doctype_is_not_hostile() -> None:
    declaration, _, rest = _HEARTBEAT.partition(b"?>")
    parsed = soap_codec.parse_request(declaration + b"?><!-- no <!DOCTYPE here -->" + rest)
    assert parsed == HeartbeatRequest(active=True, epoch=1, operator_id="a")


def test_a_utf16_doctype_is_hostile_too() -> None:
    # Not starting with a '<' byte, it takes the whole-body search and the parsed doctype check.
    body = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>'
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(body.encode("utf-16"))
    assert raised.value.code is FaultCode.HOSTILE_XML


def test_markup_declarations_after_the_root_are_malformed_and_never_read() -> None:
    declaration, _, rest = _HEARTBEAT.partition(b"?>")
    at = rest.index(b"<ns0:epoch>")
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(declaration + b"?>" + rest[:at] + _DTD + rest[at:])
    assert raised.value.code is FaultCode.MALFORMED_REQUEST


def test_two_operations_in_one_body_are_refused() -> None:
    one = zeep_request("Heartbeat", active=True, epoch=1, operatorId="a")
    root = etree.fromstring(one)
    body = root[-1]
    body.append(etree.fromstring(etree.tostring(body[0])))
    with pytest.raises(SoapFaultError) as raised:
        soap_codec.parse_request(etree.tostring(root))
    assert raised.value.code is FaultCode.MALFORMED_REQUEST


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_anything_but_a_fault(body: bytes) -> None:
    try:
        soap_codec.parse_request(body)
    except SoapFaultError as fault:
        assert fault.code in FaultCode
