"""parse_request's bounds between the parse and the schema validation (issue 39 item 2)."""

from __future__ import annotations

import pytest

from broker_contracts.soap import FaultCode
from broker_service.soap_codec import (
    MAX_NAMESPACES_IN_SCOPE,
    SendMessagesRequest,
    SoapFaultError,
    parse_request,
)
from broker_simulators.backend import build_envelope

GOOD = build_envelope("acme", "1000", [("orders-0000", s, f"m-{s}", "p") for s in range(1, 4)])


def declared(count: int, tag: bytes = b"<soap:Envelope") -> bytes:
    names = " ".join(f'xmlns:n{i}="urn:n{i}"' for i in range(count)).encode()
    return GOOD.replace(tag, tag + b" " + names, 1)


@pytest.mark.parametrize("tag", [b"<soap:Envelope", b"<soap:Body"])
def test_namespace_declarations_over_the_bound_are_hostile(tag: bytes) -> None:
    with pytest.raises(SoapFaultError) as refused:
        parse_request(declared(MAX_NAMESPACES_IN_SCOPE, tag), max_namespaces=MAX_NAMESPACES_IN_SCOPE)
    assert refused.value.code == FaultCode.HOSTILE_XML
    assert f"limit is {MAX_NAMESPACES_IN_SCOPE} namespace declarations" in refused.value.message
    # A few more than SOAP needs are fine.
    parsed = parse_request(declared(MAX_NAMESPACES_IN_SCOPE - 4, tag), max_namespaces=MAX_NAMESPACES_IN_SCOPE)
    assert isinstance(parsed, SendMessagesRequest)


def test_bundle_over_the_message_count_is_hostile_and_replay_is_unbounded() -> None:
    with pytest.raises(SoapFaultError) as refused:
        parse_request(GOOD, max_messages=2)
    assert refused.value.code == FaultCode.HOSTILE_XML
    assert "limit is 2 messages" in refused.value.message
    assert len(parse_request(GOOD, max_messages=3).seqs) == 3  # type: ignore[union-attr]
    # The journal's replay passes no bounds: what this broker accepted replays as it was.
    assert len(parse_request(declared(100)).seqs) == 3  # type: ignore[union-attr]


def test_an_operation_outside_the_role_is_refused_before_validation() -> None:
    invalid = GOOD.replace(b"<t:seq>1</t:seq>", b"<t:seq>one</t:seq>")  # would fail the schema
    with pytest.raises(SoapFaultError) as refused:
        parse_request(invalid, operations=frozenset({"Heartbeat"}))
    assert refused.value.code == FaultCode.UNAUTHENTICATED
