"""The per-segment checks agree with a plain reference on random histories (no Spark, no JVM).

The checks split the work: per segment in tasks (:mod:`broker_validator.segment_pass`), with the
order of segments, the seeds and the messages that span segments decided on the driver
(:mod:`broker_validator.checks`). The reference below states the rules once over all records,
sorted the way targets see them (epoch, time, position), as the Spark SQL version of the checks
did; hypothesis writes random histories (several terms, several segments per term, ties of time,
repeats, gaps, seqs behind, carried state from an earlier run) and both must find the same.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_contracts.message_log import parse_ts
from broker_validator.checks import PriorState, find, in_process, read_batch_with
from broker_validator.messages import LATENCY_BUCKET_BASE
from broker_validator.segment_reader import SegmentSource
from tests.validator.logbuilder import History

STREAMS = (("outbound", "s1"), ("inbound", "i1"))
MESSAGE_EVENTS = ("accepted", "delivered", "deduplicated", "confirmed", "forwarded", "held", "replayed")
EVIDENCE = ("delivered", "deduplicated")


@dataclass(frozen=True)
class Rec:
    event: str
    ts_us: int
    broker: str
    epoch: int
    direction: str | None
    stream: str | None
    seq: int | None
    pos: tuple[int, int]  # (segment, line): the order of the files as written, then the line


record = st.tuples(
    st.sampled_from(MESSAGE_EVENTS), st.sampled_from(STREAMS), st.integers(1, 12), st.integers(0, 2)
)
segment = st.lists(record, min_size=0, max_size=25)
term = st.tuples(
    st.sampled_from(("b0", "b1", "b2")), st.lists(segment, min_size=1, max_size=3), st.booleans()
)
prior = st.tuples(
    st.dictionaries(st.sampled_from(STREAMS), st.integers(0, 6), max_size=2),  # carried highest seq
    st.dictionaries(
        st.tuples(st.sampled_from(STREAMS), st.integers(1, 12)), st.integers(0, 10**6), max_size=3
    ),
    st.lists(st.tuples(st.sampled_from(STREAMS), st.integers(1, 6), st.integers(0, 3)), max_size=2),  # holes
)


def write_history(store: Path, terms: list[Any]) -> tuple[list[str], list[Rec]]:
    """The segments, written as a broker writes them, and their records read back for the reference."""
    history = History(store)
    paths: list[Path] = []
    for epoch, (broker, segments, deactivates) in enumerate(terms, start=1):
        for n, entries in enumerate(segments):
            if n == 0:
                history.log("activated", broker, epoch)
            for event, (direction, stream), seq, ticks in entries:
                history.tick(ticks)  # 0: the same time as the record before
                history.log(
                    event, broker, epoch, direction, stream, seq, attempt=1 if event == "forwarded" else None
                )
            if n == len(segments) - 1 and deactivates:
                history.log("deactivated", broker, epoch)
            paths += history.close(broker)
            history.tick()
    records = []
    for index, path in enumerate(paths):
        for line, text in enumerate(path.read_text().splitlines()):
            r = json.loads(text)
            if r["event"] != "forwarded":  # no check reads them
                ts_us = (parse_ts(r["ts"]) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
                at = (index, line)
                records.append(
                    Rec(r["event"], ts_us, r["broker"], r["epoch"], r["direction"], r["stream"], r["seq"], at)
                )
    return [str(path) for path in paths], records


def reference(records: list[Rec], prior: PriorState) -> dict[str, Any]:
    """The rules over all records at once, in target order (epoch, time, position)."""
    carried = {(c, d, s): m for c, d, s, m in prior.stream_max}
    pending = {(c, d, s, q): us for c, d, s, q, us in prior.pending}
    evidence: dict[tuple[str, str, str], list[Rec]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.epoch, r.ts_us, r.pos)):
        if r.event in EVIDENCE:
            evidence[("c1", r.direction, r.stream)].append(r)  # type: ignore[index]
    jumps, behind, highest = set(), {}, {}
    for key, rows in evidence.items():
        top, seen = carried.get(key, 0), Counter[int]()
        for r in rows:
            assert r.seq is not None
            if r.seq > top + 1:
                jumps.add((*key, r.seq, top, r.pos))
            elif r.event == "delivered" and r.seq <= top:
                behind[(*key, r.seq, top, r.pos)] = seen[r.seq] > 0
            seen[r.seq] += 1
            top = max(top, r.seq)
        highest[key] = max(r.seq for r in rows if r.seq is not None)
    holes = [(c, d, s, lo, hi) for c, d, s, lo, hi in prior.holes]
    holes += [(c, d, s, top + 1, seq - 1) for c, d, s, seq, top, _ in jumps]
    filled = {
        (*key, r.seq)
        for key, rows in evidence.items()
        for r in rows
        for c, d, s, lo, hi in holes
        if (c, d, s) == key and r.seq is not None and lo <= r.seq <= hi
    }
    by_message: dict[tuple[str, str, str, int], list[Rec]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.ts_us, r.pos)):
        if r.event in ("accepted", *EVIDENCE):
            by_message[("c1", r.direction, r.stream, r.seq)].append(r)  # type: ignore[index]
    messages, buckets = set(), Counter[tuple[str, str, int]]()
    lags: dict[tuple[str, str], list[tuple[float, str, int]]] = defaultdict(list)
    for (c, d, s, seq), rows in by_message.items():
        acc = next((r for r in rows if r.event == "accepted"), None)
        ev = next((r for r in rows if r.event in EVIDENCE), None)
        delivered = sum(r.event == "delivered" for r in rows)
        top = carried.get((c, d, s), 0)
        waiting = pending.get((c, d, s, seq))
        accepted_us = waiting if waiting is not None else acc.ts_us if acc else None
        lag = None
        if ev and accepted_us is not None and (seq > top or waiting is not None):
            lag = max((ev.ts_us - accepted_us) / 1000.0, 0.0)
            bucket = math.floor(math.log(max(lag, 0.01)) / math.log(LATENCY_BUCKET_BASE))
            buckets[(c, d, bucket)] += 1
            lags[(c, d)].append((lag, s, seq))
        if (
            (ev is None and acc is not None)
            or waiting is not None
            or delivered >= 2
            or (delivered >= 1 and seq <= top)
            or (ev is not None and delivered == 0)
        ):
            stamps = tuple((r.ts_us, r.broker, r.epoch) if r else None for r in (acc, ev))
            messages.add((c, d, s, seq, delivered, waiting, lag, *stamps))
    return {
        "jumps": jumps,
        "behind": behind,
        "stream_max": highest,
        "filled": filled,
        "messages": messages,
        "buckets": dict(buckets),
        "slowest": {
            where: {(s, seq) for lag, s, seq in timed if lag == max(timed)[0]}
            for where, timed in lags.items()
        },
    }


def checked(paths: list[str], prior: PriorState, *, drop_copies: bool = False) -> dict[str, Any]:
    sources = [SegmentSource(path, path, None, None, Path(path).stat().st_size) for path in paths]
    batch = read_batch_with(in_process, 2, sources)
    assert len(list(Path(batch.scratch).glob("*.npz"))) == len(paths)  # pass 1's columnar copies
    if drop_copies:
        batch.release()  # as if pass 2 ran on other executors: each segment is parsed again
    try:
        found = find(batch, prior)
    finally:
        batch.release()
    position = {path: n for n, path in enumerate(paths)}
    by_index = {s.index: position[s.source.path] for s in batch.summaries}

    def pos(raw: int) -> tuple[int, int]:
        return (by_index[raw >> 32], raw & 0xFFFFFFFF)

    return {
        "jumps": {(r.cluster, r.direction, r.stream, r.seq, r.prevmax, pos(r.pos)) for r in found.jumps},
        "behind": {
            (r.cluster, r.direction, r.stream, r.seq, r.prevmax, pos(r.pos)): found.earlier[
                (r.cluster, r.direction, r.stream, r.seq, r.pos)
            ]
            > 0
            for r in found.behind
        },
        "stream_max": {(r.cluster, r.direction, r.stream): r.batch_max for r in found.stream_max},
        "filled": {(r.cluster, r.direction, r.stream, r.seq) for r in found.filled},
        "messages": {
            (
                m.cluster,
                m.direction,
                m.stream,
                m.seq,
                m.delivered,
                m.pending_us,
                m.lag_ms,
                tuple(m.acc) if m.acc else None,
                tuple(m.ev) if m.ev else None,
            )
            for m in found.messages
        },
        "buckets": {(b.cluster, b.direction, b.bucket): b.n for b in found.latency},
        "slowest": {
            (c, d): {(m.stream, m.seq) for m in found.worst if (m.cluster, m.direction) == (c, d)}
            for c, d in {(m.cluster, m.direction) for m in found.worst}
        },
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(terms=st.lists(term, min_size=1, max_size=4), carried=prior)
def test_the_split_checks_find_what_the_reference_finds(
    tmp_path_factory: Any, terms: Any, carried: Any
) -> None:
    store = tmp_path_factory.mktemp("store")
    paths, records = write_history(store, terms)
    stream_max, pending, holes = carried
    state = PriorState(
        stream_max=[("c1", d, s, m) for (d, s), m in stream_max.items()],
        pending=[("c1", d, s, seq, us) for ((d, s), seq), us in pending.items()],
        holes=[("c1", d, s, lo, lo + width) for (d, s), lo, width in holes],
    )
    if not paths:
        return
    assert checked(paths, state) == reference(records, state)


def test_without_the_columnar_copies_pass_2_parses_again_and_finds_the_same(tmp_path: Path) -> None:
    """On Kubernetes, pass 2 of a segment may run on an executor that did not run its pass 1."""
    out, into = STREAMS
    terms = [
        ("b0", [[("accepted", out, 1, 1), ("delivered", out, 1, 1), ("accepted", into, 3, 0)]] * 2, True),
        ("b1", [[("delivered", out, 3, 1), ("delivered", out, 2, 1), ("deduplicated", into, 3, 2)]], False),
    ]
    paths, records = write_history(tmp_path, terms)
    state = PriorState(stream_max=[], pending=[], holes=[])
    without_copies = checked(paths, state, drop_copies=True)
    assert without_copies == checked(paths, state) == reference(records, state)
    assert without_copies["jumps"] and without_copies["behind"] and without_copies["messages"]


def test_the_highest_seq_a_log_can_hold_does_not_wrap_around(tmp_path: Path) -> None:
    """A seq of 2**63 - 1 (hostile, or a source that counts down from the top) delivered twice is
    a repeat, not a jump: the running maximum plus one would not fit in 64 bits."""
    top = (1 << 63) - 1
    out = STREAMS[0]
    terms = [
        ("b0", [[("delivered", out, 1, 1), ("delivered", out, top, 1), ("delivered", out, top, 1)]], True)
    ]
    paths, records = write_history(tmp_path, terms)
    state = PriorState(stream_max=[], pending=[], holes=[])
    found = checked(paths, state)
    assert found == reference(records, state)
    assert [(seq, prevmax) for *_, seq, prevmax, _ in found["behind"]] == [(top, top)]
