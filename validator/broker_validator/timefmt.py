"""Microseconds since the Unix epoch (how the checks keep time) to and from the message-log text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker_contracts.message_log import format_ts, parse_ts

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts_text(micros: int) -> str:
    """``2026-11-22T12:00:00.123456Z`` for ``micros``; exact (no float rounding)."""
    return format_ts(_EPOCH + timedelta(microseconds=micros))


def ts_micros(text: str) -> int:
    return (parse_ts(text) - _EPOCH) // timedelta(microseconds=1)
