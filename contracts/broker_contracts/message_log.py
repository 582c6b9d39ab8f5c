"""The message-log record schema: what brokers write and the validator reads.

Format: JSON Lines, UTF-8, one record per line, one object per record with
exactly the fields of :data:`FIELDS`. A broker appends to an open segment in
its own directory and, on a size or time bound, closes it and moves it into
the shared log store with one atomic rename, as
``<store>/<cluster>/<broker>/<segment name>``. A closed segment is never
rewritten; the validator reads every closed segment in the store
(:data:`CLOSED_SEGMENT_GLOB`) and ignores open ones. A closed segment's name
carries the sha256 of its bytes (:func:`sealed_segment_name`); the validator
checks it and takes no record from a segment whose bytes do not match. A record
is evidence only for the cluster whose directory holds it (its ``cluster``
field must name that directory): a broker's pod mounts its own cluster's
directory and nothing else of the store.

Why JSON Lines rather than Parquet: brokers append record by record and must
be able to close a segment at any moment, a torn last line is easy to spot,
and a person can read a segment with ``less``. Spark reads it with an explicit
schema (built from :data:`FIELDS`), so no inference pass is needed.

This module only encodes and checks records; writing segments is the
broker's job, reading them the validator's.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final, TypedDict


class Event(StrEnum):
    # ts: when the broker acted, never after its term (docs/contracts.md, "The message log")
    ACCEPTED = "accepted"  # journaled by the broker and acknowledged to the source
    FORWARDED = "forwarded"  # sent to the target (one record per attempt)
    DELIVERED = "delivered"  # the target took it (outbound: the cloud; inbound: the backend)
    # The target answered that it already had this (stream, seq): it took it earlier, in a delivery
    # whose `delivered` record a crash or a lost reply kept out of the log. The validator counts it
    # as delivery evidence, so a kill -9 between the target's answer and the log write is no loss.
    DEDUPLICATED = "deduplicated"
    CONFIRMED = "confirmed"  # the confirmation went back to the source
    HELD = "held"  # parked after maxDeliveries under the onPoison policy
    REPLAYED = "replayed"  # an operator released a held message for delivery
    DISCARDED = "discarded"  # an operator dropped a held message on purpose
    ACTIVATED = "activated"  # the broker became Active with this epoch
    DEACTIVATED = "deactivated"  # the broker stopped being Active


class Direction(StrEnum):
    OUTBOUND = "outbound"  # backend to cloud
    INBOUND = "inbound"  # cloud to backend


class MessageLogRecord(TypedDict):
    event: str
    ts: str
    cluster: str
    broker: str
    epoch: int
    direction: str | None
    account: str
    company: str
    stream: str | None
    seq: int | None
    msgId: str | None
    attempt: int | None


# (field name, JSON type, nullable). The validator derives its Spark schema
# from this tuple, so adding a field here is the whole schema change.
FIELDS: Final[tuple[tuple[str, type, bool], ...]] = (
    ("event", str, False),
    ("ts", str, False),
    ("cluster", str, False),
    ("broker", str, False),
    ("epoch", int, False),
    ("direction", str, True),
    ("account", str, False),
    ("company", str, False),
    ("stream", str, True),
    ("seq", int, True),
    ("msgId", str, True),
    ("attempt", int, True),
)
FIELD_NAMES: Final = tuple(name for name, _, _ in FIELDS)

# Lifecycle events carry no message; every other event names exactly one.
LIFECYCLE_EVENTS: Final = frozenset({Event.ACTIVATED, Event.DEACTIVATED})

TS_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
"""Timestamps are UTC with microseconds, e.g. ``2026-11-22T12:00:00.123456Z``."""

OPEN_SEGMENT_SUFFIX: Final = ".jsonl.open"
CLOSED_SEGMENT_SUFFIX: Final = ".jsonl"
CLOSED_SEGMENT_GLOB: Final = "*/*/*" + CLOSED_SEGMENT_SUFFIX


class MessageLogError(ValueError):
    """A record that does not follow the schema."""


def format_ts(moment: datetime | None = None) -> str:
    """The schema's timestamp text for ``moment`` (default: now), in UTC."""
    moment = moment or datetime.now(UTC)
    if moment.tzinfo is None:
        raise MessageLogError(f"timestamp {moment!r} has no time zone; message-log times are UTC")
    return moment.astimezone(UTC).strftime(TS_FORMAT)


def parse_ts(text: str) -> datetime:
    try:
        return datetime.strptime(text, TS_FORMAT).replace(tzinfo=UTC)
    except ValueError as error:
        raise MessageLogError(f"ts {text!r} is not UTC with microseconds ({TS_FORMAT})") from error


def segment_name(broker: str, opened_at: datetime, index: int) -> str:
    """Closed-segment file name; sorts by opening time within one broker."""
    stamp = opened_at.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{index:06d}-{broker}{CLOSED_SEGMENT_SUFFIX}"


SHA256_HEX_LENGTH: Final = 64
_HEX: Final = frozenset("0123456789abcdef")


def sealed_segment_name(stem: str, sha256_hex: str) -> str:
    """The closed segment's name: ``<stem>.<sha256 of its bytes, lowercase hex>.jsonl``.

    The checksum is part of the name so that closing a segment publishes it with the same atomic
    rename (no sidecar that could be missing or stale), the validator can tell bytes altered after
    closing from the bytes the broker wrote, and an object store's object name can be a pure function
    of the segment and a confirmed checksum (a retried upload writes the same name and bytes).
    """
    if len(sha256_hex) != SHA256_HEX_LENGTH or not set(sha256_hex) <= _HEX:
        raise MessageLogError(f"segment checksum {sha256_hex!r} is not a lowercase hex sha256")
    return f"{stem}.{sha256_hex}{CLOSED_SEGMENT_SUFFIX}"


def segment_sha256(name: str) -> str | None:
    """The sha256 a closed segment's name carries, or None (not a sealed name: written before
    checksums, or not a segment at all)."""
    if not name.endswith(CLOSED_SEGMENT_SUFFIX):
        return None
    body = name.removesuffix(CLOSED_SEGMENT_SUFFIX)
    digest = body[-SHA256_HEX_LENGTH:]
    if len(body) <= SHA256_HEX_LENGTH + 1 or body[-SHA256_HEX_LENGTH - 1] != "." or not set(digest) <= _HEX:
        return None
    return digest


def segment_stem(name: str) -> str:
    """A segment's name without its checksum and suffix (open, closed or sealed)."""
    if name.endswith(OPEN_SEGMENT_SUFFIX):
        return name.removesuffix(OPEN_SEGMENT_SUFFIX)
    if segment_sha256(name) is not None:
        return name[: -len(CLOSED_SEGMENT_SUFFIX) - SHA256_HEX_LENGTH - 1]
    return name.removesuffix(CLOSED_SEGMENT_SUFFIX)


def validate(record: object) -> MessageLogRecord:
    """Check one decoded record against the schema; return it typed or raise."""
    if not isinstance(record, dict):
        raise MessageLogError(f"a message-log record is a JSON object, not {type(record).__name__}")
    extra = set(record) - set(FIELD_NAMES)
    if extra:
        raise MessageLogError(f"unknown message-log fields {sorted(extra)}")
    for name, kind, nullable in FIELDS:
        if name not in record:
            raise MessageLogError(f"message-log record lacks field {name!r}")
        value = record[name]
        if value is None:
            if not nullable:
                raise MessageLogError(f"message-log field {name!r} must not be null")
            continue
        # bool is an int in Python; a JSON true is never a valid seq or epoch.
        if not isinstance(value, kind) or isinstance(value, bool):
            raise MessageLogError(f"message-log field {name!r} must be {kind.__name__}, got {value!r}")
    event = record["event"]
    if event not in Event.__members__.values():
        raise MessageLogError(f"unknown message-log event {event!r}; one of {[e.value for e in Event]}")
    parse_ts(record["ts"])
    if event not in LIFECYCLE_EVENTS:
        for name in ("direction", "stream", "seq", "msgId"):
            if record[name] is None:
                raise MessageLogError(f"a {event!r} record needs field {name!r}")
        if record["direction"] not in Direction.__members__.values():
            raise MessageLogError(f"direction {record['direction']!r} is not inbound or outbound")
    return record  # type: ignore[return-value]  # checked field by field above


def encode(record: MessageLogRecord) -> bytes:
    """One JSON line, newline included, fields in schema order."""
    ordered = {name: record[name] for name in FIELD_NAMES}  # type: ignore[literal-required]
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes | str) -> MessageLogRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as error:
        raise MessageLogError(f"message-log line is not JSON: {error}") from error
    return validate(obj)
