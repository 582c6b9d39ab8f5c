"""Names and codes of the broker's SOAP contract (see ``wsdl/broker.wsdl``).

The WSDL is the authority; this module gives its names to Python so that
the broker, the operator and the simulators spell them the same way.
It does not parse or build SOAP envelopes: the broker parses with hardened
lxml, the clients use zeep.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

NAMESPACE: Final = "http://broker.failover.dev/soap/v1"
SOAP_ENV_NAMESPACE: Final = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP_PATH: Final = "/soap"
"""URL path of the SOAP endpoint on every broker; the WSDL is at ``/soap?wsdl``."""

AUTH_HEADER: Final = "Authorization"
AUTH_SCHEME: Final = "Bearer"
"""Credentials travel as ``Authorization: Bearer <token>`` on every operation: the backend's own
credential for ``SendMessages``, the operator's for ``Heartbeat`` and the admin operations."""

UNAVAILABILITY_CODE_MAX_LEN: Final = 30

# The contract's largest SendMessages bundle, and the most an operator's call may carry. Each
# request is parsed and validated on the broker's event loop, which also answers the operator's
# heartbeats, so these bound how long one request can hold it (docs/broker.md, "Request limits"):
# a bundle of BUNDLE_MAX_MESSAGES messages of 500 bytes parses in about 13 ms, and the slowest
# BUNDLE_MAX_BYTES body measured (the smallest messages) in about 60 ms, against a lease margin of
# at least 250 ms (bench/bench_request_bounds.py). A backend with more to send
# sends more bundles; the broker refuses a larger one with HOSTILE_XML naming the limit.
BUNDLE_MAX_MESSAGES: Final = 1000
BUNDLE_MAX_BYTES: Final = 1024 * 1024
OPERATOR_REQUEST_MAX_BYTES: Final = 64 * 1024  # a Heartbeat is under 1 KB; ListHeld et al. too


class BrokerState(StrEnum):
    """What a broker says it is in its Heartbeat reply."""

    ACTIVE = "Active"
    INACTIVE = "Inactive"
    UNAVAILABLE = "Unavailable"


@dataclass(frozen=True)
class HeartbeatReply:
    """A broker's answer to Heartbeat: the WSDL's ``HeartbeatResponse``, field for field, in its order.

    The broker builds it and renders it; the operator's client parses the response into it and
    the decision core reads it. Defined here so that the two sides cannot drift apart
    (``tests/unit/test_contracts.py`` checks it against the WSDL).
    """

    state: BrokerState
    unavailability_code: str | None  # at most UNAVAILABILITY_CODE_MAX_LEN characters
    unavailability_message: str | None  # English, for people
    epoch: int


@dataclass(frozen=True)
class HeldMessage:
    """One entry of ``ListHeld``: the WSDL's ``HeldMessage`` type, field for field, in its order.

    The broker renders its holds as these and the ``kubectl broker`` plugin parses the response
    into them (``tests/unit/test_contracts.py`` checks it against the WSDL)."""

    direction: str
    stream: str
    seq: int
    msg_id: str
    attempts: int
    last_error: str
    held_since: str  # xsd:dateTime text (RFC 3339)


class AcceptStatus(StrEnum):
    """Per-message result of SendMessages."""

    ACCEPTED = "Accepted"  # journaled durably; will be forwarded
    DUPLICATE = "Duplicate"  # an old seq, acknowledged again, not queued twice
    GAP = "Gap"  # refused; expectedSeq names the seq the stream needs next


class UnavailabilityCode(StrEnum):
    """Codes a broker puts in ``unavailabilityCode`` (at most 30 characters)."""

    STALE_EPOCH = "STALE_EPOCH"
    BACKEND_UNREACHABLE = "BACKEND_UNREACHABLE"
    CLOUD_UNREACHABLE = "CLOUD_UNREACHABLE"
    JOURNAL_ERROR = "JOURNAL_ERROR"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    # The broker fenced itself at its stored epoch (lease ran out, or its process was
    # paused longer than the lease margin); only a higher epoch activates it again.
    LEASE_EXPIRED = "LEASE_EXPIRED"
    # This call was handled right after the broker's event loop had been stalled longer than
    # the lease margin: it may be older than the operator's fence, so it was not acted on (an
    # Active broker fenced itself instead, and then needs a higher epoch like LEASE_EXPIRED).
    EVENT_LOOP_STALLED = "EVENT_LOOP_STALLED"


class FaultCode(StrEnum):
    """Codes in the ``BrokerFault`` detail of a SOAP fault."""

    # Missing or unknown credentials, or the other role's (the operator's token on SendMessages,
    # the backend's on anything else); nothing changed.
    UNAUTHENTICATED = "UNAUTHENTICATED"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"  # not well-formed or not valid against the WSDL
    HOSTILE_XML = "HOSTILE_XML"  # DTD, entity, or over the size cap
    UNKNOWN_OPERATION = "UNKNOWN_OPERATION"
    BROKER_INACTIVE = "BROKER_INACTIVE"  # SendMessages to a broker that is not Active
    WRONG_PAIR = "WRONG_PAIR"  # bundle for another (account, company)
    JOURNAL_ERROR = "JOURNAL_ERROR"
    NOT_FOUND = "NOT_FOUND"  # admin operation on a message that is not held
    # An operation sent to the other port of a broker that serves two (--admin-port): Heartbeat
    # and the admin operations on the admin port, SendMessages on the main one; nothing changed.
    WRONG_PORT = "WRONG_PORT"


# Codes are carried in a 30-character field; catch a too-long one at import time.
for _code in UnavailabilityCode:
    assert len(_code) <= UNAVAILABILITY_CODE_MAX_LEN, _code
