"""The segment reader: the pyarrow fast path and the json.loads slow path agree on every line.

No Spark here: the reader runs in plain Python workers. Each hostile line is put between clean
lines and read by both paths; the fast path may decline a file (None) but never answer differently.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_contracts import message_log
from broker_contracts.message_log import FIELDS, Direction, Event
from broker_validator import segment_reader
from broker_validator.limits import ReadLimits
from broker_validator.segment_reader import SCHEMA, ParsedSegment, read_segment
from broker_validator.synthetic import generate_store

ABSENT = object()
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def record(event: Event = Event.ACCEPTED, /, **fields: Any) -> dict[str, Any]:
    """A valid record as a broker writes it, with ``fields`` replaced (ABSENT drops a field)."""
    lifecycle = event in message_log.LIFECYCLE_EVENTS
    base: dict[str, Any] = {
        "event": event.value, "ts": "2026-11-22T12:00:00.123456Z", "cluster": "bc-000",
        "broker": "bc-000-2", "epoch": 6, "direction": None if lifecycle else "outbound",
        "account": "acme", "company": "1000", "stream": None if lifecycle else "orders-0165",
        "seq": None if lifecycle else 37, "msgId": None if lifecycle else "orders-0165-37",
        "attempt": 2 if event is Event.FORWARDED else None,
    }  # fmt: skip
    base.update(fields)
    return {name: value for name, value in base.items() if value is not ABSENT}


def dump(obj: Any) -> bytes:
    # surrogatepass: a lone surrogate from hypothesis becomes bytes that are not UTF-8, one more hostile case
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(errors="surrogatepass")


def with_extra(value: bytes) -> bytes:
    return dump(record())[:-1] + b',"x":' + value + b"}"


def broker_line(event: Event, **fields: Any) -> bytes:
    """A clean line exactly as the broker's encoder writes it, checked by the contract."""
    return message_log.encode(message_log.validate(record(event, **fields))).rstrip(b"\n")


CLEAN = [
    broker_line(Event.ACTIVATED),
    *(broker_line(e, seq=i) for i, e in enumerate(Event, 1) if e not in message_log.LIFECYCLE_EVENTS),
    broker_line(Event.ACCEPTED, direction="inbound", stream="i-7", seq=1, msgId="i-7-1"),
    broker_line(Event.DELIVERED, ts="2026-11-22T23:59:59.999999Z", epoch=-(1 << 63), seq=(1 << 63) - 1),
    broker_line(Event.DEACTIVATED),
]


def same(fast: ParsedSegment, slow: ParsedSegment) -> None:
    assert fast.table.schema == SCHEMA == slow.table.schema
    assert fast.table.combine_chunks().equals(slow.table.combine_chunks())
    assert (fast.lines, fast.malformed, fast.first_malformed) == (
        slow.lines,
        slow.malformed,
        slow.first_malformed,
    )


def read_all_ways(data: bytes, tmp_path: Path) -> tuple[ParsedSegment | None, ParsedSegment]:
    """Both paths, and the public reader checked against the slow path; the fast answer returned."""
    slow = segment_reader._read_slow(data)
    fast = segment_reader._read_fast(data)
    if fast is not None:
        same(fast, slow)
    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    same(read_segment(path), slow)
    return fast, slow


def wrong_types() -> list[tuple[str, bytes, bool, bool]]:
    """Every field with each JSON type it must not have; ints also out of int64."""
    cases = []
    for name, kind, _ in FIELDS:
        wrong: list[Any] = [True, [], {}, 5.0] + (["5"] if kind is int else [5])
        wrong += [1 << 63, -(1 << 63) - 1] if kind is int else []
        cases += [(f"{name}={value!r}", dump(record(**{name: value})), False, False) for value in wrong]
    return cases


# (id, line, valid, the fast path reads it itself rather than leaving it to the slow path)
HOSTILE: list[tuple[str, bytes, bool, bool]] = [
    ("not json", b"not json at all", False, False),
    ("torn", dump(record())[:40], False, False),
    ("array", b'[{"event":"accepted"}]', False, False),
    ("number", b"5", False, False),
    ("string", b'"accepted"', False, False),
    ("null", b"null", False, False),
    ("true", b"true", False, False),
    ("empty object", b"{}", False, True),
    ("object then null", dump(record()) + b"null", False, False),
    ("two objects", dump(record()) + dump(record()), False, False),
    ("blank", b"", False, False),
    ("whitespace", b" \t ", False, False),
    ("nul byte", dump(record()) + b"\x00", False, False),
    ("bom", b"\xef\xbb\xbf" + dump(record()), False, False),
    ("invalid utf-8", dump(record(stream="s")).replace(b'"s"', b'"\xff"'), False, False),
    ("lone surrogate", dump(record(stream="s")).replace(b'"s"', b'"\\ud800"'), False, False),
    ("lone surrogate, extra field", dump(record(x="s")).replace(b'"s"', b'"\\ud800"'), True, False),
    ("duplicate field", dump(record())[:-1] + b',"event":"delivered"}', False, False),
    ("duplicate extra field", dump(record())[:-1] + b',"x":1,"x":"y"}', True, True),
    ("NaN in extra field", with_extra(b"NaN"), False, False),
    ("Infinity in extra field", with_extra(b"-Infinity"), False, False),
    ("Inf in extra field", with_extra(b"Inf"), False, False),
    ("nested extra fields", with_extra(b'[{"a":' * 10 + b"1" + b"}]" * 10), True, False),
    # Deeper than Python's json.loads follows: malformed (a broker writes no nesting at all).
    ("deep extra array", with_extra(b"[" * 100_000 + b"]" * 100_000), False, False),
    ("deep extra object", with_extra(b'{"a":' * 100_000 + b"1" + b"}" * 100_000), False, False),
    ("extra fields", dump(record(x=1, y="z", z=None, w=1.5)), True, True),
    ("nested extra field", dump(record(x={"y": [1, {"z": None}]})), True, False),
    ("escaped key", dump(record()).replace(b'"event"', b'"ev\\u0065nt"'), True, True),
    ("unicode", dump(record(stream="заказы-😀", cluster="ß", msgId="\u2028")), True, True),
    ("escaped unicode", json.dumps(record(stream="é😀")).encode(), True, True),
    ("crlf", dump(record()) + b"\r", True, False),
    ("padded", b"  " + dump(record()) + b"  ", True, False),
    ("spaces inside", json.dumps(record()).encode(), True, True),
    # Over --max-record-bytes (64 KiB by default): malformed, and never parsed (issue 39).
    ("long line", dump(record(stream="s" * 300_000)), False, False),
    ("long extra field", dump(record(x="y" * 1_000_000)), False, False),
    ("just short enough", dump(record(stream="s" * 65_000)), True, True),
    ("unknown event", dump(record(event="exploded")), False, True),
    ("event case", dump(record(event="Accepted")), False, True),
    ("unknown direction", dump(record(direction="sideways")), False, True),
    ("seq 0", dump(record(seq=0)), False, True),
    ("seq negative", dump(record(seq=-3)), False, True),
    ("seq 1", dump(record(seq=1)), True, True),
    ("minus zero", dump(record(Event.ACTIVATED, epoch=0)).replace(b'"epoch":0', b'"epoch":-0'), True, True),
    ("forwarded", dump(record(Event.FORWARDED)), True, True),
    ("forwarded, seq 0", dump(record(Event.FORWARDED, seq=0)), False, True),
    ("forwarded, a float", dump(record(Event.FORWARDED, attempt=1.0)), False, False),
    ("lifecycle, message fields absent", dump(record(Event.DEACTIVATED, **dict.fromkeys(
        ("direction", "stream", "seq", "msgId", "attempt"), ABSENT))), True, True),
    ("lifecycle, odd message fields", dump(record(Event.ACTIVATED, direction="up", seq=0, stream="s")),
     True, True),
    ("attempt absent", dump(record(attempt=ABSENT)), True, True),
    *(
        (f"{name} null", dump(record(**{name: None})), False, True)
        for name, _, nullable in FIELDS if not nullable
    ),
    *(
        (f"{name} absent", dump(record(**{name: ABSENT})), False, True)
        for name, _, nullable in FIELDS if not nullable
    ),
    *(
        (f"{name} null on a message", dump(record(**{name: None})), False, True)
        for name in ("direction", "stream", "seq", "msgId")
    ),
    *wrong_types(),
    *(
        (f"ts {ts!r}", dump(record(ts=ts)), False, True)
        for ts in (
            "yesterday", "2026-11-22T12:00:00Z", "2026-11-22 12:00:00.123456Z",
            "2026-11-22T12:00:00.123456+00:00", "2026-11-22T12:00:00.123456",
            "2026-11-22T12:00:00.123456z", " 2026-11-22T12:00:00.12345Z", "2026-1-22T12:00:00.1234567Z",
            "0000-01-01T00:00:00.000000Z", "2026-11-22T12:00:00,123456Z", "2026-11-22T12:00:00.12345 Z",
            "\uff12\uff10\uff12\uff16-11-22T12:00:00.123456Z", "2026-11-22T12:00:00.123456Z\n", "",
        )
    ),
    # A well-shaped time that does not exist makes Arrow's cast raise: the slow path takes the file.
    *(
        (f"ts {ts!r}", dump(record(ts=ts)), False, False)
        for ts in (
            "2026-13-22T12:00:00.123456Z", "2026-02-29T12:00:00.000000Z", "2026-11-31T12:00:00.000000Z",
            "2026-11-22T24:00:00.000000Z", "2026-11-22T12:60:00.000000Z", "2026-11-22T12:00:60.000000Z",
            "2026-00-22T12:00:00.000000Z", "2026-11-00T12:00:00.000000Z",
        )
    ),
    *(
        (f"ts {ts!r}", dump(record(ts=ts)), True, True)
        for ts in (
            "2024-02-29T12:00:00.000000Z", "0001-01-01T00:00:00.000000Z", "9999-12-31T23:59:59.999999Z",
        )
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "valid", "fast_reads_it"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_a_hostile_line_among_clean_ones(
    line: bytes, valid: bool, fast_reads_it: bool, tmp_path: Path
) -> None:
    data = b"\n".join([*CLEAN[:3], line, *CLEAN[3:]]) + b"\n"
    fast, slow = read_all_ways(data, tmp_path)
    assert (fast is not None) == fast_reads_it
    assert slow.lines == len(CLEAN) + 1
    assert slow.malformed == (0 if valid else 1)
    assert slow.first_malformed == ("" if valid else line[:800].decode(errors="replace")[:200])
    forwarded = line.startswith(b'{"event":"forwarded"')
    assert (3 in slow.table.column("line").to_pylist()) == (valid and not forwarded)


@pytest.mark.parametrize(("line", "valid"), [c[1:3] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_line_alone_and_last(line: bytes, valid: bool, tmp_path: Path) -> None:
    _, slow = read_all_ways(line, tmp_path)
    assert (slow.lines, slow.malformed) == ((1, 0 if valid else 1) if line else (0, 0))  # b"" is empty
    _, slow = read_all_ways(line + b"\n", tmp_path)
    assert (slow.lines, slow.malformed) == (1, 0 if valid else 1)
    _, slow = read_all_ways(b"\n".join([*CLEAN, line]), tmp_path)  # last, without a newline
    assert slow.malformed == (0 if valid or not line else 1)


def test_clean_lines_take_the_fast_path_and_come_out_in_schema(tmp_path: Path) -> None:
    odd = broker_line(Event.CONFIRMED, stream='s"{[\\}\n{', msgId="}\n{")  # JSON's punctuation in strings
    lines = [*CLEAN, odd]
    fast, _ = read_all_ways(b"\n".join(lines) + b"\n", tmp_path)
    assert fast is not None and (fast.lines, fast.malformed, fast.first_malformed) == (len(lines), 0, "")
    rows = fast.table.to_pylist()
    assert [row["line"] for row in rows] == [i for i, raw in enumerate(lines) if b'"forwarded"' not in raw]
    ts_us = (message_log.parse_ts(json.loads(CLEAN[1])["ts"]) - EPOCH) // timedelta(microseconds=1)
    assert rows[1] == {
        "event": "accepted", "ts_us": ts_us, "cluster": "bc-000", "broker": "bc-000-2", "epoch": 6,
        "direction": Direction.OUTBOUND.value, "stream": "orders-0165", "seq": 1, "line": 1,
    }  # fmt: skip
    assert rows[0]["direction"] is rows[0]["stream"] is rows[0]["seq"] is None  # activated
    assert rows[-3]["epoch"] == -(1 << 63) and rows[-3]["seq"] == (1 << 63) - 1
    assert rows[-1]["stream"] == 's"{[\\}\n{' and rows[-1]["line"] == len(CLEAN)


@pytest.mark.parametrize(
    ("data", "lines", "malformed"),
    [
        (b"", 0, 0),
        (b"\n", 1, 1),
        (CLEAN[0], 1, 0),
        (CLEAN[0] + b"\n", 1, 0),
        (CLEAN[0] + b"\n\n", 2, 1),
        (CLEAN[0] + b"\n \n", 2, 1),
        (b"\n" + CLEAN[0], 2, 1),
        (CLEAN[0] + b"\n\n" + CLEAN[1], 3, 1),
    ],
)
def test_lines_count_a_last_line_without_newline_but_no_empty_tail(
    data: bytes, lines: int, malformed: int, tmp_path: Path
) -> None:
    _, slow = read_all_ways(data, tmp_path)
    assert (slow.lines, slow.malformed) == (lines, malformed)


def test_the_first_malformed_line_is_cut_to_200_characters_and_decoded(tmp_path: Path) -> None:
    bad = "é" * 300
    data = b"\n".join([CLEAN[0], bad.encode(), b"\xff" * 5, *CLEAN[1:]])
    _, slow = read_all_ways(data, tmp_path)
    assert (slow.malformed, slow.first_malformed) == (2, "é" * 200)
    _, slow = read_all_ways(b"\xffx\n" + data, tmp_path)
    assert slow.first_malformed == "\ufffdx"


def test_a_torn_last_line_alone_takes_the_slow_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torn = CLEAN[1][:30]
    data = b"\n".join([*CLEAN, torn])
    slow_inputs: list[bytes] = []
    slow_path = segment_reader._read_slow

    def spy(
        data: bytes, first_line: int = 0, rules: segment_reader.Rules = segment_reader.DEFAULT_RULES
    ) -> ParsedSegment:
        slow_inputs.append(data)
        return slow_path(data, first_line, rules)

    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(segment_reader, "_read_slow", spy)
    parsed = read_segment(path)
    assert slow_inputs == [torn]
    same(parsed, slow_path(data))
    assert (parsed.lines, parsed.malformed, parsed.first_malformed) == (len(CLEAN) + 1, 1, torn.decode())


def test_bad_lines_inside_a_big_segment_send_only_small_pieces_down_the_slow_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment is cut in halves until the pieces with bad lines are small: two bad lines among
    5,000 cost line-by-line parsing of at most two pieces of 64 lines, not of the whole file."""
    lines = [CLEAN[n % len(CLEAN)] for n in range(5000)]
    lines[1234] = b'{"event":"accepted","ts":"\xff"}'  # invalid UTF-8: the fast path declines the file
    lines[3777] = b"not json"
    data = b"\n".join(lines) + b"\n"
    slow_lines: list[int] = []
    slow_path = segment_reader._read_slow

    def spy(
        data: bytes, first_line: int = 0, rules: segment_reader.Rules = segment_reader.DEFAULT_RULES
    ) -> ParsedSegment:
        slow_lines.append(data.count(b"\n"))
        return slow_path(data, first_line, rules)

    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(segment_reader, "_read_slow", spy)
    parsed = read_segment(path)
    assert len(slow_lines) == 2 and max(slow_lines) <= 64
    same(parsed, slow_path(data))
    assert (parsed.lines, parsed.malformed) == (5000, 2)
    assert parsed.first_malformed == lines[1234].decode(errors="replace")


def test_small_blocks_and_a_line_longer_than_a_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment_reader, "_BLOCK_SIZE", 1024)
    data = b"\n".join(CLEAN * 20) + b"\n"
    fast, _ = read_all_ways(data, tmp_path)
    assert fast is not None and fast.table.column("event").num_chunks > 1
    long = dump(record(stream="s" * 5000))
    fast, slow = read_all_ways(data + long + b"\n" + data, tmp_path)  # the reader cannot take it
    assert fast is None and slow.malformed == 0


LINE = st.one_of(
    st.sampled_from(CLEAN),
    st.builds(
        lambda name, value, event: dump(record(event, **{name: value})),
        st.sampled_from([*message_log.FIELD_NAMES, "x"]),
        st.one_of(
            st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30),
            st.sampled_from([e.value for e in Event] + [d.value for d in Direction] + [ABSENT]),
            st.sampled_from(["2026-11-22T12:00:00.123456Z", "2026-11-22T12:00Z", "1999-02-29T00:00:00.0Z"]),
            st.lists(st.integers(), max_size=2),
        ),
        st.sampled_from(list(Event)),
    ),
    st.binary(max_size=20),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, min_size=1, max_size=8), newline=st.booleans())
def test_both_paths_agree_on_random_files(lines: list[bytes], newline: bool, tmp_path: Path) -> None:
    read_all_ways(b"\n".join(lines) + (b"\n" if newline else b""), tmp_path)


@pytest.fixture(scope="session")
def generated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store from the generator ``make bench-validator`` uses (its stream, broker and failover
    counts), 20,000 records: every segment holds more than the 2,000 lines read below."""
    root = tmp_path_factory.mktemp("segment-reader") / "store"
    generate_store(root, records=20_000, streams=200, brokers=3, failovers=6, crashes=2)
    return root


def test_a_generated_segment_reads_the_same_both_ways(generated_store: Path, tmp_path: Path) -> None:
    segment = min(generated_store.glob(message_log.CLOSED_SEGMENT_GLOB))
    with segment.open("rb") as file:
        head = b"".join(line for _, line in zip(range(2000), file, strict=False))
    fast, _ = read_all_ways(head, tmp_path)
    assert fast is not None and fast.lines == 2000 and fast.malformed == 0
    assert 0 < fast.table.num_rows < 2000  # forwarded records dropped
    assert pc.all(pc.greater(fast.table.column("ts_us"), 0)).as_py()


# -- bounds, links and checksums (issue 39) ----------------------------------------------------------


def test_a_symlink_or_a_fifo_is_refused_without_being_followed_or_blocking(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"\n".join(CLEAN) + b"\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(outside)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # opened for reading without O_NONBLOCK, this would wait for a writer forever
    for path in (link, fifo):
        parsed = read_segment(path)
        assert parsed.refused == "foreign-file", path
        assert parsed.table.num_rows == 0 and parsed.lines == 0


def test_a_segment_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "segment.jsonl"
    data = b"\n".join(CLEAN) + b"\n"
    path.write_bytes(data)
    parsed = read_segment(path, limits=ReadLimits(max_segment_bytes=len(data) - 1, max_record_bytes=4096))
    assert parsed.refused == "foreign-file" and "--max-segment-bytes" in parsed.why
    assert parsed.table.num_rows == 0
    assert read_segment(path, limits=ReadLimits(len(data), 4096)).table.num_rows > 0


def test_a_record_over_the_size_bound_is_malformed_on_both_paths(tmp_path: Path) -> None:
    long = dump(record(stream="s" * 3000))  # valid but for its size
    data = b"\n".join([*CLEAN, long, *CLEAN]) + b"\n"
    limits = ReadLimits(max_segment_bytes=1 << 20, max_record_bytes=2048)
    slow = segment_reader._read_slow(data, 0, segment_reader.Rules(limits.max_record_bytes, None))
    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    parsed = read_segment(path, limits=limits)
    same(parsed, slow)
    assert (parsed.lines, parsed.malformed) == (2 * len(CLEAN) + 1, 1)
    assert parsed.first_malformed == long[:200].decode()
    assert read_segment(path, limits=ReadLimits(1 << 20, 4096)).malformed == 0


def test_a_segment_whose_bytes_differ_from_its_checksum_is_corrupt_and_not_read(tmp_path: Path) -> None:
    data = b"\n".join(CLEAN) + b"\n"
    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    assert read_segment(path, sha256=good).refused == ""
    path.write_bytes(data.replace(b'"seq":3', b'"seq":4'))  # altered after closing
    parsed = read_segment(path, sha256=good)
    assert parsed.refused == "corrupt-segment" and good in parsed.why
    assert parsed.table.num_rows == 0 and parsed.malformed == 0


def test_a_record_naming_another_cluster_than_its_directory_is_malformed(tmp_path: Path) -> None:
    data = b"\n".join([broker_line(Event.ACTIVATED), broker_line(Event.ACCEPTED, cluster="other")]) + b"\n"
    path = tmp_path / "segment.jsonl"
    path.write_bytes(data)
    parsed = read_segment(path, cluster="bc-000")
    assert (parsed.lines, parsed.malformed, parsed.table.num_rows) == (2, 1, 1)
    assert '"cluster":"other"' in parsed.first_malformed
    rules = segment_reader.Rules(4096, "bc-000")
    same(parsed, segment_reader._read_slow(data, 0, rules))
    assert read_segment(path).malformed == 0  # no directory given: no such check
