"""The relay contract between a broker and its targets: the backend and the cloud.

ARCHITECTURE.md fixes SOAP only for the backend's ``SendMessages`` into the
broker. Everything the broker itself sends out, to the backend (resend
request, outbound confirmations, inbound deliveries) and to the cloud
(outbound bundles, polls, inbound confirmations), is JSON over HTTP, defined
here. JSON because it is cheap to build and parse in bulk (orjson, or the
C-accelerated ``json`` module without it: :func:`dumps`) and easy to read in
a test failure; HTTP because every part already speaks it through aiohttp.
The simulators serve this contract and a real backend or cloud adapter would
too.

Rules that hold for every endpoint below:

* Every broker-to-target call carries :data:`EPOCH_HEADER` (the broker's
  epoch, decimal) and :data:`BROKER_HEADER` (its name). A target remembers the
  highest epoch it has seen and answers a lower one with HTTP
  :data:`STALE_EPOCH_STATUS` and a :class:`StaleEpochReply`; the broker then
  fences itself (a newer broker is active).
* A message on the wire is a :data:`WireMessage`, a JSON array
  ``[stream, seq, msgId, payload]``: arrays, not objects, because a bundle
  carries thousands of them.
* A target takes each stream's messages of one request in order. Per message
  it answers a :class:`DeliveryStatus`; once it refuses one (``rejected``), it
  answers ``skipped`` for the rest of that stream in that request and stores
  none of them, so a refusal can never let a later ``seq`` overtake.
* Targets drop duplicates by ``(stream, seq)`` and answer ``duplicate``.

Endpoints served by the **backend** (the SAP side):

* ``POST`` :data:`BACKEND_RESEND_PATH`, body :class:`ResendRequest`, reply
  :class:`ResendReply`: sent by a broker while it activates. The backend
  resends (via SOAP ``SendMessages``) every message it has not had confirmed,
  and replies at once with the first unconfirmed ``seq`` of every stream it
  knows; the broker uses those as its accept cursors and drops journaled
  messages below them (another broker already delivered those).
* ``POST`` :data:`BACKEND_CONFIRM_PATH`, body :class:`ConfirmRequest`: the
  broker confirms outbound messages the cloud has taken, as a per-stream
  watermark (every ``seq`` up to and including it is done).
* ``POST`` :data:`BACKEND_INBOUND_PATH`, body :class:`DeliveryRequest`, reply
  :class:`DeliveryReply`: inbound messages (cloud to backend) delivered in
  order per stream.

Endpoints served by the **cloud**:

* ``POST`` :data:`CLOUD_OUTBOUND_PATH`, body :class:`DeliveryRequest`, reply
  :class:`DeliveryReply`: an outbound bundle, many streams, each in order.
* ``GET`` :data:`CLOUD_POLL_PATH` ``?max=N``, reply :class:`PollReply`: the
  unconfirmed inbound messages, at most ``N``, each stream in ``seq`` order
  and starting at its lowest unconfirmed ``seq`` (a poll may leave a stream
  out, never its first messages). The cloud answers with the same messages
  again until they are confirmed. A broker that held a message and sees its
  stream start above it knows another broker had it confirmed.
* ``POST`` :data:`CLOUD_CONFIRM_PATH`, body :class:`InboundConfirmRequest`:
  the broker confirms inbound messages the backend has taken.

Both serve ``GET`` :data:`HEALTH_PATH` (200 when ready); the broker probes it
while activating to tell ``CLOUD_UNREACHABLE`` from a working cloud.

This module holds names and shapes, and the one JSON codec both sides use
(:func:`dumps`, :func:`loads`); no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final, TypedDict

EPOCH_HEADER: Final = "X-Broker-Epoch"
BROKER_HEADER: Final = "X-Broker-Name"
STALE_EPOCH_STATUS: Final = 409
"""HTTP status of a target's refusal of an epoch lower than one it has seen."""

HEALTH_PATH: Final = "/healthz"

BACKEND_RESEND_PATH: Final = "/relay/resend"
BACKEND_CONFIRM_PATH: Final = "/relay/confirm"
BACKEND_INBOUND_PATH: Final = "/relay/inbound"

CLOUD_OUTBOUND_PATH: Final = "/relay/outbound"
CLOUD_POLL_PATH: Final = "/relay/poll"
CLOUD_CONFIRM_PATH: Final = "/relay/confirm"

WireMessage = list[object]
"""``[stream: str, seq: int, msgId: str, payload: str]`` as a JSON array."""


class DeliveryStatus(StrEnum):
    OK = "ok"  # taken for the first time
    DUPLICATE = "duplicate"  # already had this (stream, seq); counts as delivered
    REJECTED = "rejected"  # refused; the broker retries, then applies onPoison
    SKIPPED = "skipped"  # not looked at: an earlier message of its stream was rejected


class ResendRequest(TypedDict):
    account: str
    company: str
    broker: str
    epoch: int


class ResendReply(TypedDict):
    streams: dict[str, int]
    """Per stream, the first seq the backend has not had confirmed (1 for a fresh stream)."""


class ConfirmRequest(TypedDict):
    streams: dict[str, int]
    """Per stream, the highest seq now confirmed (all lower ones are too)."""


class DeliveryRequest(TypedDict):
    messages: list[WireMessage]


class DeliveryReply(TypedDict):
    results: list[str]
    """One :class:`DeliveryStatus` per message, in request order."""
    reasons: dict[str, str]
    """For rejected messages: request index (as text) to the target's reason."""


class PollReply(TypedDict):
    messages: list[WireMessage]


class InboundConfirmRequest(TypedDict):
    confirmed: list[list[object]]
    """``[stream, seq]`` pairs the backend has taken."""


class StaleEpochReply(TypedDict):
    error: str
    seenEpoch: int


# ---- the wire codec ----------------------------------------------------------------------------
# Compact UTF-8 JSON. orjson, when installed, writes the same text as the standard module does with
# separators=(",", ":") and ensure_ascii=False, about ten times faster for bundles of ~500-byte
# messages (JSON was 6% of the broker's CPU). Without it the standard module does the job: an
# image that lacks orjson is slower, never wrong. Chosen once at import, so neither path costs
# a check per call.


def _stdlib_dumps(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


dumps: Callable[[object], bytes] = _stdlib_dumps
"""``body`` as compact UTF-8 JSON bytes (dict keys may be ``str`` subclasses, as lxml's text results are)."""
loads: Callable[[bytes | str], Any] = json.loads
"""Decode JSON bytes; raises ``ValueError`` on anything that is not JSON."""
JSON_CODEC = "json"
"""Which codec is in use (``orjson`` or ``json``), for logs and the benchmark."""

try:
    import orjson
except ImportError:  # pragma: no cover - the development venv and the image install orjson
    pass
else:

    def _orjson_dumps(body: object) -> bytes:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)

    dumps = _orjson_dumps
    loads = orjson.loads
    JSON_CODEC = "orjson"
