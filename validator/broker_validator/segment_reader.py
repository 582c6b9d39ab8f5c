"""Parse one closed message-log segment into an Arrow table, in a Python worker, without Spark.

Why this exists: parsing the JSON Lines with Spark's ``from_json`` was the validator's bottleneck;
pyarrow's C++ JSON reader (explicit schema, one thread per task) does the same work about 3x faster.

Fast path: :func:`pyarrow.json.read_json` on the whole file, then vectorised checks. It only runs on
a file whose bytes show that row ``i`` is line ``i`` (the reader skips blank lines and reads
``{}{}`` as two rows) and that holds nothing RapidJSON takes but JSON does not. Any other file, and
any complaint of the reader, goes to the slow path: ``json.loads`` line by line under the same
rules (:func:`_record`); the tests hold both paths to the same answers. A torn last line (a broker
killed mid-write) sends only itself down the slow path.

What a segment may be is bounded before any parsing (issue 39): the file is opened without following
a symbolic link and without blocking (a FIFO), must be a regular file of at most
``max_segment_bytes`` (:class:`ReadLimits`), and when its name carries a sha256 its bytes must match
it; a file that fails any of these is *refused* (:attr:`ParsedSegment.refused` names the anomaly
class) and none of its bytes is taken as a record. A line longer than ``max_record_bytes`` is a
malformed line, never handed to a JSON parser; so is a record whose ``cluster`` is not the cluster
whose directory holds the segment: a broker writes only its own cluster's directory, and a record
there is evidence for that cluster alone.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from broker_contracts.message_log import FIELD_NAMES, FIELDS, LIFECYCLE_EVENTS, TS_FORMAT, Direction, Event
from broker_validator.limits import DEFAULT_LIMITS, ReadLimits

_S, _I = pa.string(), pa.int64()
_ROW: Final = ("event", "ts_us", "cluster", "broker", "epoch", "direction", "stream", "seq")
# ts_us: microseconds since 1970-01-01 UTC; line: 0-based line number in the file.
SCHEMA: Final = pa.schema([*zip(_ROW, (_S, _I, _S, _S, _I, _S, _S, _I), strict=True), ("line", _I)])
_READ_SCHEMA: Final = pa.schema([(name, {str: _S, int: _I}[kind]) for name, kind, _ in FIELDS])
_SLOW_LINES: Final = 64  # a piece this small is read line by line rather than cut again
_BLOCK_SIZE = 16 << 20  # measured fastest single-threaded; a module variable so tests can shrink it
_FIELD_NAMES: Final = frozenset(FIELD_NAMES)
_EVENTS: Final = frozenset(e.value for e in Event)
_LIFECYCLE: Final = frozenset(e.value for e in LIFECYCLE_EVENTS)
_DIRECTIONS: Final = frozenset(d.value for d in Direction)
_FORWARDED: Final = Event.FORWARDED.value  # validated, then dropped: no check reads it
_TS_SHAPE: Final = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z"  # TS_FORMAT, exactly
_TS_RE: Final = re.compile(_TS_SHAPE)
_MIN_TS_US: Final = -62135596800000000  # 0001-01-01: Arrow takes year 0, Python's datetime does not
_INT64: Final = range(-(1 << 63), 1 << 63)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


FOREIGN_FILE: Final = "foreign-file"  # report_schema.Anomaly's values, without importing the report side
CORRUPT_SEGMENT: Final = "corrupt-segment"


class Rules(NamedTuple):
    """What a line must also satisfy beyond the schema: its size, and the cluster it may name."""

    max_record_bytes: int
    cluster: str | None  # the directory's cluster; None: not checked (a file outside a store)


DEFAULT_RULES: Final = Rules(DEFAULT_LIMITS.max_record_bytes, None)


class SegmentSource(NamedTuple):
    """One closed segment as a task reads it: where it is and what it must be."""

    path: str  # absolute
    relative: str  # to the store, with forward slashes: what reports name
    cluster: str | None
    sha256: str | None  # from its name; None for a segment named before checksums
    size: int  # at the scan
    limits: ReadLimits = DEFAULT_LIMITS


@dataclass(frozen=True)
class ParsedSegment:
    table: pa.Table  # the valid records except `forwarded`, in SCHEMA
    lines: int  # lines in the file; a last line without a newline counts
    malformed: int  # lines that are not a valid record
    first_malformed: str  # the first of them, at most 200 characters; "" if none
    refused: str = ""  # the anomaly class of a file not read at all (FOREIGN_FILE, CORRUPT_SEGMENT)
    why: str = ""  # for people: why it was refused


def read_source(source: SegmentSource) -> ParsedSegment:
    return read_segment(source.path, cluster=source.cluster, sha256=source.sha256, limits=source.limits)


def read_segment(
    path: str | Path,
    *,
    cluster: str | None = None,
    sha256: str | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> ParsedSegment:
    """The segment at ``path`` parsed, or refused (see the module's docstring); never raises for
    what the file is or holds."""
    data = _bounded_bytes(Path(path), limits.max_segment_bytes)
    if isinstance(data, ParsedSegment):
        return data
    if sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            return refused(
                CORRUPT_SEGMENT,
                f"its bytes' sha256 is {actual}, not the {sha256} its name carries: changed after "
                "the broker closed it; none of its records is taken",
            )
    return _read(data, 0, Rules(limits.max_record_bytes, cluster))


def refused(anomaly: str, why: str) -> ParsedSegment:
    return ParsedSegment(SCHEMA.empty_table(), 0, 0, "", anomaly, why)


def _bounded_bytes(path: Path, limit: int) -> bytes | ParsedSegment:
    """The file's bytes, read through a descriptor that follows no link and blocks on no FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        link = error.errno == errno.ELOOP
        return refused(FOREIGN_FILE, _LINK if link else f"cannot open: {error.strerror}")
    why = ""
    with open(fd, "rb", closefd=True) as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            why = "not a regular file (a directory, FIFO, socket or device)"
        elif info.st_size > limit:
            why = _too_big(info.st_size, limit)
        else:
            try:
                data = file.read(limit + 1)
            except OSError as error:
                why = f"cannot read: {error.strerror}"
    if not why and len(data) > limit:  # it grew after the fstat: a closed segment never does
        why = _too_big(len(data), limit)
    return refused(FOREIGN_FILE, why) if why else data


_LINK: Final = "a symbolic link: segments are regular files; not followed"


def _too_big(size: int, limit: int) -> str:
    return f"{size} bytes, more than --max-segment-bytes ({limit}): not read"


def _read(data: bytes, first_line: int, rules: Rules = DEFAULT_RULES) -> ParsedSegment:
    """``data`` (whole lines) with line numbers from ``first_line``. A file the fast path declines is
    cut in two at a newline and each half tried again, so a few bad lines in a big segment cost a
    few fast reads of shrinking pieces, and only pieces of ``_SLOW_LINES`` lines or fewer go slow."""
    parsed = _read_fast(data, rules)
    if parsed is not None:
        return _renumbered(parsed, first_line)
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1  # where the last line begins
    if cut > 0 and (head := _read_fast(data[:cut], rules)) is not None:  # the common case: a torn last line
        return _joined(_renumbered(head, first_line), _read_slow(data[cut:], first_line + head.lines, rules))
    if data.count(b"\n", 0, len(data) - 1) < _SLOW_LINES:
        return _read_slow(data, first_line, rules)
    middle = data.find(b"\n", len(data) // 2, len(data) - 1) + 1 or data.rfind(b"\n", 0, len(data) // 2) + 1
    head = _read(data[:middle], first_line, rules)
    return _joined(head, _read(data[middle:], first_line + head.lines, rules))


def _renumbered(parsed: ParsedSegment, first_line: int) -> ParsedSegment:
    if not first_line:
        return parsed
    table = parsed.table
    lines = pc.add(table.column("line"), pa.scalar(first_line, _I))
    return ParsedSegment(
        table.set_column(len(_ROW), "line", lines), parsed.lines, parsed.malformed, parsed.first_malformed
    )


def _joined(head: ParsedSegment, tail: ParsedSegment) -> ParsedSegment:
    first = head.first_malformed if head.malformed else tail.first_malformed
    table = pa.concat_tables([head.table, tail.table])
    return ParsedSegment(table, head.lines + tail.lines, head.malformed + tail.malformed, first)


def _read_fast(data: bytes, rules: Rules = DEFAULT_RULES) -> ParsedSegment | None:
    """The whole file through pyarrow's reader, or None where only the slow path can be trusted."""
    if len(data) > rules.max_record_bytes and _longest_line(data) > rules.max_record_bytes:
        return None  # the slow path counts the long line malformed without parsing it
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    # Every newline but a final one sits between two objects: no blank line, "\r" or padding, and no
    # object across lines; with as many rows as lines, row i is line i. (A file that starts with a
    # top-level null crashes pyarrow 26's reader outright.)
    plain = data.startswith(b"{") and data.endswith((b"}", b"}\n")) and data.count(b"}\n{") == lines - 1
    plain = plain and (data.isascii() or _is_utf8(data))  # RapidJSON copies invalid UTF-8 into strings
    # Brokers write exactly FIELDS. Read first with an extra field an error, so every value is a
    # string, an integer or null; only a file with extras pays for the scans that make "ignore" safe:
    # no nesting deeper than Python's parser follows, none of RapidJSON's NaN and Inf[inity].
    for extra in ("error", "ignore"):
        if not plain or (extra == "ignore" and not _flat_and_standard(data, lines)):
            return None
        try:
            return _checked(data, lines, extra, rules)
        except Exception:  # any complaint of the reader (ArrowInvalid, a bad day): the next try decides
            continue
    return None


def _longest_line(data: bytes) -> int:
    """The longest line's length in bytes, without its newline (numpy: no object per line)."""
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    bounds = np.concatenate(([-1], newlines, [len(data)]))
    return int(np.diff(bounds).max()) - 1


def _flat_and_standard(data: bytes, lines: int) -> bool:
    return data.count(b"{") == lines and not any(token in data for token in (b"[", b"NaN", b"Inf"))


def _checked(data: bytes, lines: int, extra: str, rules: Rules) -> ParsedSegment:
    reading = pj.ReadOptions(use_threads=False, block_size=_BLOCK_SIZE)
    parsing = pj.ParseOptions(explicit_schema=_READ_SCHEMA, unexpected_field_behavior=extra)
    read = pj.read_json(pa.BufferReader(data), reading, parsing)
    if read.num_rows != lines:  # a line with two objects
        raise ValueError(f"{read.num_rows} rows from {lines} lines")
    col, ts, event = read.column, read.column("ts"), read.column("event")
    shaped = _all(pc.match_substring_regex(ts, f"^{_TS_SHAPE}$"))
    # Arrow's ISO cast checks the calendar (no Feb 30, no second 60) and raises on a bad day, which
    # sends the file to the slow path; rows of another shape get a harmless placeholder.
    text = pc.if_else(shaped, pc.utf8_slice_codeunits(ts, 0, 26), "1970-01-01T00:00:00.000000")
    ts_us = pc.cast(pc.cast(text, pa.timestamp("us")), _I)
    message = _all(
        pc.is_in(col("direction"), pa.array(sorted(_DIRECTIONS))),
        *(pc.is_valid(col(name)) for name in ("stream", "msgId")),
        pc.greater_equal(col("seq"), 1),
    )
    valid = _all(
        *(pc.is_valid(col(name)) for name, _, nullable in FIELDS if not nullable),
        pc.is_in(event, pa.array(sorted(_EVENTS))),
        shaped,
        pc.greater_equal(ts_us, _MIN_TS_US),
        pc.or_(pc.is_in(event, pa.array(sorted(_LIFECYCLE))), message),
        *([] if rules.cluster is None else [pc.equal(col("cluster"), rules.cluster)]),
    )
    keep = _all(valid, pc.not_equal(event, _FORWARDED))
    kept = pa.Table.from_arrays([ts_us if n == "ts_us" else col(n) for n in _ROW], names=_ROW).filter(keep)
    line = pc.cast(pc.indices_nonzero(keep), _I)  # row i is line i
    table = pa.Table.from_arrays([*kept.columns, line], schema=SCHEMA)
    malformed = lines - pc.sum(valid).as_py()
    if not malformed:
        return ParsedSegment(table, lines, 0, "")
    index = pc.index(valid, False).as_py()
    return ParsedSegment(table, lines, malformed, _excerpt(data.split(b"\n", index + 1)[index]))


def _all(*masks: Any) -> Any:
    return reduce(pc.and_, [pc.fill_null(mask, False) for mask in masks])  # null (absent) is not valid


def _excerpt(raw: bytes) -> str:
    return raw[:800].decode(errors="replace")[:200]  # 200 characters take at most 800 bytes


def _read_slow(data: bytes, first_line: int = 0, rules: Rules = DEFAULT_RULES) -> ParsedSegment:
    """Line by line with ``json.loads``: any file, the same rules and the same table as the fast path."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()  # the empty piece after the last newline is no line
    rows: list[tuple[Any, ...]] = []
    malformed, first = 0, ""
    for number, raw in enumerate(pieces, first_line):
        row = _record(raw) if len(raw) <= rules.max_record_bytes else None
        if row is not None and rules.cluster is not None and row[2] != rules.cluster:
            row = None  # another cluster's record: not evidence from this directory
        if row is None:
            malformed += 1
            first = _excerpt(raw) if malformed == 1 else first
        elif row[0] != _FORWARDED:
            rows.append((*row, number))
    columns = list(zip(*rows, strict=True)) or [()] * len(SCHEMA)
    arrays = [pa.array(values, type=kind) for values, kind in zip(columns, SCHEMA.types, strict=True)]
    return ParsedSegment(pa.Table.from_arrays(arrays, schema=SCHEMA), len(pieces), malformed, first)


class _Object(list[tuple[str, Any]]):
    """A decoded JSON object as its pairs: tells an object from an array and shows duplicates."""


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _record(raw: bytes) -> tuple[Any, ...] | None:
    """One line as a SCHEMA row without its line number, or None if it is not a valid record.

    Valid: a JSON object (strict UTF-8, no NaN/Infinity) naming no field of FIELDS twice; extra
    fields ignored, absent ones null; each non-null field of the JSON type of FIELDS (an int is a
    JSON integer within int64, not 5.0, true or "5"; a str is valid Unicode); the non-nullable ones
    present; a known event; ts exactly TS_FORMAT and a real time; and, unless the event is a
    lifecycle one, a known direction, stream, msgId and seq >= 1.
    """
    try:
        pairs = json.loads(raw.decode(), object_pairs_hook=_Object, parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(pairs, _Object):
        return None
    names = [name for name, _ in pairs if name in _FIELD_NAMES]
    if len(names) != len(set(names)):  # a field named twice is ambiguous
        return None
    record: dict[str, Any] = dict(pairs)
    if not all(_fits(record.get(name), kind, nullable) for name, kind, nullable in FIELDS):
        return None
    get = record.get
    event, ts_us, seq = record["event"], _ts_us(record["ts"]), get("seq") or 0  # absent: not >= 1
    message = get("direction") in _DIRECTIONS and get("stream") is not None and get("msgId") is not None
    if event not in _EVENTS or ts_us is None or not (event in _LIFECYCLE or (message and seq >= 1)):
        return None
    return (event, ts_us, *(get(name) for name in _ROW[2:]))


def _fits(value: Any, kind: type, nullable: bool) -> bool:
    if value is None:
        return nullable
    if kind is int:
        return type(value) is int and value in _INT64  # not a bool, a float or a string
    return type(value) is str and (value.isascii() or _is_utf8(value))


def _is_utf8(text: bytes | str) -> bool:
    try:
        text.decode() if isinstance(text, bytes) else text.encode()  # "\ud800" is no UTF-8
    except UnicodeError:
        return False
    return True


def _ts_us(text: str) -> int | None:
    if not _TS_RE.fullmatch(text):
        return None
    try:
        moment = datetime.strptime(text, TS_FORMAT).replace(tzinfo=UTC)
    except ValueError:  # not a real day or time
        return None
    return (moment - _EPOCH) // timedelta(microseconds=1)
