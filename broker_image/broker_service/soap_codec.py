"""Hardened SOAP 1.1 parsing and response rendering for the broker's server side.

zeep is a client library; the server side of ``wsdl/broker.wsdl`` is ours. We
parse requests with lxml configured to refuse everything an attacker could use
(no DTD, no entity resolution, no network, no huge trees) and we refuse any
document that carries a DOCTYPE at all before lxml sees it: the broker has no
use for DTDs, so "external entity" and "billion laughs" never get parsed. The
body size cap is per role, checked before the body is read (see :mod:`broker_service.server`).

Every request is parsed on the event loop that also answers the operator's heartbeats, so
nothing here may take longer than a small part of the lease margin (docs/broker.md, "Request
limits"). libxml2 parses in time linear in the body, which the server bounds; what is not
linear is checked between the parse and the schema validation, in a few C calls: the namespace
declarations in scope at the operation element (lxml copies them into the subtree it validates,
quadratic in their number: 20,000 took 4 s), the operation against the caller's role, and a
bundle's message count.

Requests are decoded into small typed records (:class:`HeartbeatRequest`,
:class:`SendMessagesRequest`, ...). ``SendMessages`` is the hot path: it uses
compiled XPath to pull every message's fields out in a few C calls instead of a
Python loop over elements. Responses are rendered from string templates with
XML escaping; they are small and fixed in shape, which keeps rendering off the
profile.

This module does no I/O and knows nothing about broker state; a malformed or
hostile request becomes a :class:`SoapFaultError`, which renders to a SOAP fault
with the contract's ``BrokerFault`` detail.
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from lxml import etree

from broker_contracts import wsdl_path
from broker_contracts.soap import NAMESPACE, SOAP_ENV_NAMESPACE, AcceptStatus, FaultCode, HeldMessage

_ENV = f"{{{SOAP_ENV_NAMESPACE}}}"
_TNS = f"{{{NAMESPACE}}}"
_NS = {"t": NAMESPACE}

# Every operation the WSDL binds; anything else in the Body is UNKNOWN_OPERATION.
OPERATIONS = frozenset({"Heartbeat", "SendMessages", "ListHeld", "ReplayHeld", "DiscardHeld"})
# A SOAP request needs two (soap and the broker's namespace), a generated one a few more.
MAX_NAMESPACES_IN_SCOPE = 32


class SoapFaultError(Exception):
    """A request the broker refuses; rendered as a SOAP fault with a ``BrokerFault`` detail."""

    def __init__(
        self, code: FaultCode, message: str, *, client: bool = True, expected_seq: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.client = client  # soap:Client (caller's fault) or soap:Server (ours)
        self.expected_seq = expected_seq

    @property
    def http_status(self) -> int:
        # SOAP 1.1 over HTTP puts every fault on 500; clients (zeep) expect it there.
        return 500


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    active: bool
    epoch: int
    operator_id: str
    # WSDL ``renewLease`` (absent = true). With ``active=true``, false makes the call a pure
    # check that activates, stores and renews nothing; with ``active=false`` it is ignored.
    renew_lease: bool = True
    # WSDL ``leaseSeconds`` (absent = None: the broker's own lease): a handover renewal's lease,
    # finite and above 0 (else a fault); honoured and capped by the term rules, not here.
    lease_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SendMessagesRequest:
    account: str
    company: str
    # Parallel lists, one entry per message, in bundle order: cheaper than a tuple per message.
    streams: list[str]
    seqs: list[int]
    msg_ids: list[str]
    payloads: list[str]
    raw: bytes = field(default=b"", compare=False)  # the body as received; the journal stores it verbatim


@dataclass(frozen=True, slots=True)
class ListHeldRequest:
    stream: str | None


@dataclass(frozen=True, slots=True)
class HeldRefRequest:
    operation: str  # ReplayHeld or DiscardHeld
    direction: str
    stream: str
    seq: int


SoapRequest = HeartbeatRequest | SendMessagesRequest | ListHeldRequest | HeldRefRequest


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


_PARSER = _parser()
_X_MESSAGE_TEXTS = etree.XPath("t:message/*/text()", namespaces=_NS, smart_strings=False)
_X_MESSAGES = etree.XPath("t:message", namespaces=_NS)
_X_MESSAGE_COUNT = etree.XPath("count(t:message)", namespaces=_NS)  # a number, no element proxies


def _request_schema() -> etree.XMLSchema:
    """The WSDL's own XML Schema (the one copy), compiled once to validate every operation element."""
    wsdl = etree.parse(str(wsdl_path()), _parser())
    schema = wsdl.find(f".//{{{XSD_NAMESPACE}}}schema")
    assert schema is not None, "the WSDL has no xsd:schema"
    # Serialize and reparse so the schema is its own document, carrying the WSDL's namespace declarations.
    return etree.XMLSchema(etree.fromstring(etree.tostring(schema), _parser()))


XSD_NAMESPACE = "http://www.w3.org/2001/XMLSchema"
_SCHEMA = _request_schema()


_SPACE = re.compile(rb"[ \t\r\n]+")


def _past_space(body: bytes, at: int) -> int:
    space = _SPACE.match(body, at)
    return space.end() if space else at


def _declares_dtd(body: bytes) -> bool:
    """Whether the prolog (all before the root element) holds a ``<!`` that is not a comment.

    A DOCTYPE, and the ENTITY declarations inside it, may stand only there: after the root's
    start tag libxml2 refuses them as malformed without reading them. Scanning the prolog
    (comments and PIs skipped) rather than the whole body keeps a 60 KB bundle from costing
    two full searches (about 0.6 µs per message, docs/benchmarks.md). A body that does not
    start with ``<`` (UTF-16, or garbage) is searched whole, as before; ``parse_request`` also
    refuses any document lxml reports a doctype for.
    """
    at = _past_space(body, 3 if body.startswith(codecs.BOM_UTF8) else 0)
    while True:
        if body.startswith(b"<?", at):
            end, skip = body.find(b"?>", at + 2), 2
        elif body.startswith(b"<!--", at):
            end, skip = body.find(b"-->", at + 4), 3
        elif body.startswith(b"<", at):
            return body.startswith(b"<!", at)
        else:
            return b"<!DOCTYPE" in body or b"<!ENTITY" in body
        if end < 0:
            return False  # an unterminated PI or comment: everything after it is inside; malformed
        at = _past_space(body, end + skip)


def parse_request(
    body: bytes,
    *,
    operations: frozenset[str] = OPERATIONS,
    refused: Callable[[str], SoapFaultError] | None = None,
    max_namespaces: int | None = None,
    max_messages: int | None = None,
) -> SoapRequest:
    """Decode one SOAP request body into its operation's record, or raise :class:`SoapFaultError`.

    The server passes the bounds for a caller's request; the journal's replay of bundles this
    broker accepted itself passes none. ``operations`` are those the caller's role may call; any
    other known one is refused with the fault ``refused(name)`` gives (``UNAUTHENTICATED`` when
    none), before the schema validation, as are more than ``max_namespaces`` namespace prefixes
    in scope at the operation (:data:`MAX_NAMESPACES_IN_SCOPE` is the server's) and a
    SendMessages bundle of more than ``max_messages`` messages.
    """
    # Refuse DTDs outright: no legitimate SOAP 1.1 message has one (the spec forbids it).
    if _declares_dtd(body):
        raise SoapFaultError(
            FaultCode.HOSTILE_XML, "request carries a DOCTYPE or ENTITY declaration; SOAP forbids DTDs"
        )
    try:
        root = etree.fromstring(body, _PARSER)
    except etree.XMLSyntaxError as error:
        raise SoapFaultError(
            FaultCode.MALFORMED_REQUEST, f"request is not well-formed XML: {error}"
        ) from None
    if root.getroottree().docinfo.doctype:
        raise SoapFaultError(FaultCode.HOSTILE_XML, "request carries a document type declaration")
    if root.tag != _ENV + "Envelope":
        raise SoapFaultError(
            FaultCode.MALFORMED_REQUEST, f"root element is {root.tag!r}, not a SOAP 1.1 Envelope"
        )
    soap_body = root.find(_ENV + "Body")
    if soap_body is None or len(soap_body) != 1:
        raise SoapFaultError(FaultCode.MALFORMED_REQUEST, "SOAP Body must hold exactly one operation element")
    operation = soap_body[0]
    tag = operation.tag if isinstance(operation.tag, str) else ""
    if not tag.startswith(_TNS) or tag[len(_TNS) :] not in OPERATIONS:
        raise SoapFaultError(
            FaultCode.UNKNOWN_OPERATION,
            f"operation {tag!r} is not one of {sorted(OPERATIONS)} in {NAMESPACE}",
        )
    name = tag[len(_TNS) :]
    # Bounds before the validation, which is the expensive step (module docstring).
    _check_bounds(
        soap_body,
        operation,
        name,
        operations=operations,
        refused=refused,
        max_namespaces=max_namespaces,
        max_messages=max_messages,
    )
    # Validating against the WSDL's schema in C is both the strict check (element order, xsd:long,
    # xsd:boolean, required elements) and cheaper than checking the same in Python.
    if not _SCHEMA.validate(operation):
        last = _SCHEMA.error_log.last_error
        detail = last.message if last is not None else "invalid"
        raise SoapFaultError(FaultCode.MALFORMED_REQUEST, f"{name} is not valid against the WSDL: {detail}")
    if name == "SendMessages":
        return _send_messages(operation, body)
    if name == "Heartbeat":
        return HeartbeatRequest(
            active=_boolean(_required(operation, "active"), "active"),
            epoch=_long(_required(operation, "epoch"), "epoch"),
            operator_id=_text(operation, "operatorId") or "",
            renew_lease=_optional_boolean(operation, "renewLease", default=True),
            lease_seconds=_optional_lease(operation, "leaseSeconds"),
        )
    if name == "ListHeld":
        return ListHeldRequest(stream=_text(operation, "stream"))
    return HeldRefRequest(
        operation=name,
        direction=_required(operation, "direction"),
        stream=_required(operation, "stream"),
        seq=_long(_required(operation, "seq"), "seq"),
    )


def _check_bounds(
    soap_body: etree._Element,
    operation: etree._Element,
    name: str,
    *,
    operations: frozenset[str],
    refused: Callable[[str], SoapFaultError] | None,
    max_namespaces: int | None,
    max_messages: int | None,
) -> None:
    """:func:`parse_request`'s checks between the parse and the validation, each a C call or two."""
    # The Envelope's and the Body's declarations: no prefix twice on one element, so in scope at
    # the Body are at least half of all the operation's ancestors declare.
    if max_namespaces is not None and len(soap_body.nsmap) > max_namespaces:
        raise SoapFaultError(
            FaultCode.HOSTILE_XML,
            f"request declares {len(soap_body.nsmap)} namespace prefixes on the SOAP Envelope and Body; "
            f"the limit is {max_namespaces} namespace declarations in scope",
        )
    if name not in operations:
        if refused is not None:
            raise refused(name)
        raise SoapFaultError(FaultCode.UNAUTHENTICATED, f"{name} is not open to this caller's credential")
    if name == "SendMessages" and max_messages is not None:
        # The operation's children (account, company, then the messages) counted in C: under a
        # microsecond for 100 messages, where the XPath count took 20 µs. Any other child fails
        # the schema anyway.
        count = len(operation) - 2
        if count > max_messages:
            raise SoapFaultError(
                FaultCode.HOSTILE_XML,
                f"bundle holds {count} messages; the limit is {max_messages} messages per SendMessages "
                "(send the rest in further bundles)",
            )


def _send_messages(operation: etree._Element, body: bytes) -> SendMessagesRequest:
    # The schema guaranteed each message is exactly (stream, seq, msgId, payload). One XPath call
    # returns all their texts in document order; an empty element has no text node, so when the
    # count is short we take the slower per-element path.
    texts = _X_MESSAGE_TEXTS(operation)
    if len(texts) == 4 * int(_X_MESSAGE_COUNT(operation)):
        streams, seq_texts, msg_ids, payloads = texts[0::4], texts[1::4], texts[2::4], texts[3::4]
    else:
        fields = [[child.text or "" for child in message] for message in _X_MESSAGES(operation)]
        streams, seq_texts, msg_ids, payloads = ([f[i] for f in fields] for i in range(4))
        if not all(streams) or not all(msg_ids):
            raise SoapFaultError(
                FaultCode.MALFORMED_REQUEST, "every message needs a non-empty stream and msgId"
            )
    seqs = [int(text) for text in seq_texts]  # xsd:long, checked by the schema
    if min(seqs) < 1:
        raise SoapFaultError(
            FaultCode.MALFORMED_REQUEST, f"message seq {min(seqs)} is below 1; seq starts at 1"
        )
    return SendMessagesRequest(
        account=_required(operation, "account"),
        company=_required(operation, "company"),
        streams=streams,
        seqs=seqs,
        msg_ids=msg_ids,
        payloads=payloads,
        raw=body,
    )


def _text(parent: etree._Element, name: str) -> str | None:
    child = parent.find(_TNS + name)
    if child is None:
        return None
    return child.text or ""


def _required(parent: etree._Element, name: str) -> str:
    value = _text(parent, name)
    if value is None:
        local = etree.QName(parent).localname
        raise SoapFaultError(FaultCode.MALFORMED_REQUEST, f"{local} lacks the required element {name!r}")
    return value.strip()


def _boolean(text: str, name: str) -> bool:
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise SoapFaultError(
        FaultCode.MALFORMED_REQUEST, f"{name} = {text!r} is not an xsd:boolean (true/false/1/0)"
    )


def _optional_boolean(parent: etree._Element, name: str, *, default: bool) -> bool:
    text = _text(parent, name)
    return default if text is None else _boolean(text.strip(), name)


def _optional_lease(parent: etree._Element, name: str) -> float | None:
    """A positive finite xsd:double, or None when absent.

    The schema admits NaN and INF, and Python's float reads a too-large exponent as inf: each
    would make a lease that never runs out, so it is refused here with anything not above 0.
    A huge finite value is no danger: the term caps it at the broker's maximum lease.
    """
    text = _text(parent, name)
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SoapFaultError(
            FaultCode.MALFORMED_REQUEST,
            f"{name} = {text.strip()[:40]!r} is not a finite number of seconds above 0",
        )
    return value


def _long(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SoapFaultError(FaultCode.MALFORMED_REQUEST, f"{name} = {text!r} is not an xsd:long") from None
    if not -(2**63) <= value < 2**63:
        raise SoapFaultError(FaultCode.MALFORMED_REQUEST, f"{name} = {text!r} is out of the xsd:long range")
    return value


# ---- rendering -------------------------------------------------------------------------------

_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    f'<soap:Envelope xmlns:soap="{SOAP_ENV_NAMESPACE}" xmlns:tns="{NAMESPACE}"><soap:Body>'
)
_TAIL = "</soap:Body></soap:Envelope>"


def _wrap(inner: str) -> bytes:
    return (_HEAD + inner + _TAIL).encode("utf-8")


def render_heartbeat(state: str, epoch: int, code: str | None = None, message: str | None = None) -> bytes:
    parts = [f"<tns:HeartbeatResponse><tns:state>{state}</tns:state>"]
    if code:
        parts.append(f"<tns:unavailabilityCode>{escape(code)}</tns:unavailabilityCode>")
    if message:
        parts.append(f"<tns:unavailabilityMessage>{escape(message)}</tns:unavailabilityMessage>")
    parts.append(f"<tns:epoch>{epoch}</tns:epoch></tns:HeartbeatResponse>")
    return _wrap("".join(parts))


AcceptResult = tuple[str, int, AcceptStatus, int | None]
"""``(stream, seq, status, expectedSeq)``: one per message of a SendMessages bundle."""


# Per status, the result's text after the stream: formatting an enum member in an f-string runs
# Enum.__format__ in Python, which was most of the cost of rendering a result.
_STATUS_TAIL = {status: f"</tns:seq><tns:status>{status.value}</tns:status>" for status in AcceptStatus}


# Per stream name, the escaped start of its result: bundles repeat the same streams, so escaping
# (three str.replace calls) is done once per name, not once per name per bundle. Bounded: a flood
# of distinct names only refills it.
_RESULT_HEADS: dict[str, str] = {}
_RESULT_HEADS_MAX = 100_000


def _result_head(stream: str) -> str:
    if len(_RESULT_HEADS) >= _RESULT_HEADS_MAX:
        _RESULT_HEADS.clear()
    head = _RESULT_HEADS[stream] = f"<tns:result><tns:stream>{escape(stream)}</tns:stream><tns:seq>"
    return head


def render_send_messages(epoch: int, results: Iterable[AcceptResult]) -> bytes:
    parts = [f"<tns:SendMessagesResponse><tns:epoch>{epoch}</tns:epoch>"]
    append = parts.append
    heads = _RESULT_HEADS
    status_tail = _STATUS_TAIL
    for stream, seq, status, expected_seq in results:
        name = heads.get(stream) or _result_head(stream)
        if expected_seq is None:
            append(f"{name}{seq}{status_tail[status]}</tns:result>")
        else:
            append(
                f"{name}{seq}{status_tail[status]}<tns:expectedSeq>{expected_seq}</tns:expectedSeq></tns:result>"
            )
    append("</tns:SendMessagesResponse>")
    return _wrap("".join(parts))


def render_list_held(held: Sequence[HeldMessage]) -> bytes:
    parts = ["<tns:ListHeldResponse>"]
    for item in held:
        parts.append(
            f"<tns:held><tns:direction>{escape(item.direction)}</tns:direction>"
            f"<tns:stream>{escape(item.stream)}</tns:stream><tns:seq>{item.seq}</tns:seq>"
            f"<tns:msgId>{escape(item.msg_id)}</tns:msgId><tns:attempts>{item.attempts}</tns:attempts>"
            f"<tns:lastError>{escape(item.last_error)}</tns:lastError>"
            f"<tns:heldSince>{escape(item.held_since)}</tns:heldSince></tns:held>"
        )
    parts.append("</tns:ListHeldResponse>")
    return _wrap("".join(parts))


def render_held_action(done: bool, message: str) -> bytes:
    return _wrap(
        f"<tns:HeldActionResponse><tns:done>{'true' if done else 'false'}</tns:done>"
        f"<tns:message>{escape(message)}</tns:message></tns:HeldActionResponse>"
    )


def render_fault(fault: SoapFaultError) -> bytes:
    expected = (
        f"<tns:expectedSeq>{fault.expected_seq}</tns:expectedSeq>" if fault.expected_seq is not None else ""
    )
    side = "soap:Client" if fault.client else "soap:Server"
    return _wrap(
        f"<soap:Fault><faultcode>{side}</faultcode><faultstring>{escape(fault.message)}</faultstring>"
        f"<detail><tns:BrokerFault><tns:code>{fault.code.value}</tns:code>"
        f"<tns:message>{escape(fault.message)}</tns:message>{expected}</tns:BrokerFault></detail></soap:Fault>"
    )
