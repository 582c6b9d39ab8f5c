"""The validator's work on one segment, run inside a Spark task: two passes, each over one segment.

Why per segment: a segment is one broker's log of one term (or a few), already in the order the
broker saw the targets' answers. Everything a check needs from it is either a summary that merges
across segments (term times, per-stream seq ranges, per-second rates) or a linear scan seeded with
what the segments before it ended with. So no record ever crosses a shuffle: Spark hands whole
segments to tasks, numpy scans them, and only small results come back to the driver
(:mod:`broker_validator.checks`), which decides the order of segments and the seeds.

* Pass 1, :func:`summarize`: parse (:mod:`broker_validator.segment_reader`), keep a columnar copy
  in the task's scratch directory for pass 2, and summarise: each term's times, side records and
  rate; per *piece* (one term's records within the segment) and stream the seq ranges with
  delivery evidence; per stream the seq ranges of all message records.
* Pass 2, :func:`check`: per piece and stream, the running highest evidenced seq seeded with the
  driver's value finds the records that jump ahead or fall behind; per message, acceptance and
  first evidence are paired for latency and pending. Messages that also have records in another
  segment (the driver finds them from pass 1's ranges) go back as partial rows to be joined; every
  other message is judged here by :func:`broker_validator.messages.judge`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from broker_validator.columns import (
    ACCEPTED,
    ACTIVATED,
    DEACTIVATED,
    DEDUPLICATED,
    DELIVERED,
    EFFECTFUL,
    EVENTS,
    SIDE,
    Columns,
    StreamKey,
    TermKey,
    keep,
    load,
)
from broker_validator.messages import Judged, MessageRows, judge
from broker_validator.segment_reader import SegmentSource, read_source

Interval = tuple[int, int]


class Side(NamedTuple):
    event: str
    direction: str
    stream: str
    seq: int
    ts_us: int


class Effect(NamedTuple):
    """A term's last effectful record; compares as Spark compared the struct (time first)."""

    ts_us: int
    event: str
    direction: str
    stream: str
    seq: int


@dataclass
class TermPart:
    """One term's records within one segment, summarised; parts of one term merge by min/max/sum."""

    cluster: str
    broker: str
    epoch: int
    start: int | None
    deactivated: int | None
    last: int
    effect: Effect | None
    first_evidence: int | None
    last_evidence: int | None
    deduplicated: int
    rate: dict[int, int]  # second -> deliveries
    side: list[Side]

    def absorb(self, other: TermPart) -> None:
        """Merge the same term's part from another segment into this one."""
        self.start = min_known(self.start, other.start)
        self.deactivated = max_known(self.deactivated, other.deactivated)
        self.last = max(self.last, other.last)
        self.effect = max_known(self.effect, other.effect)
        self.first_evidence = min_known(self.first_evidence, other.first_evidence)
        self.last_evidence = max_known(self.last_evidence, other.last_evidence)
        self.deduplicated += other.deduplicated
        for second, n in other.rate.items():
            self.rate[second] = self.rate.get(second, 0) + n
        self.side += other.side


@dataclass
class Piece:
    """One term's delivery evidence within one segment, per stream ``(direction, stream)``."""

    term: TermKey
    first_ts: int
    evidence: dict[tuple[str, str], list[Interval]]  # seq ranges with evidence, ascending


@dataclass
class SegmentSummary:
    index: int
    source: SegmentSource
    lines: int
    malformed: int
    first_malformed: str
    refused: str  # the anomaly class of a segment not read at all; "" when read
    why: str
    records: int
    terms: list[TermPart]
    pieces: list[Piece]
    messages: dict[StreamKey, list[Interval]]  # seq ranges of accepted or evidenced messages


class OrderRow(NamedTuple):
    """A delivery evidence record that jumped ahead of, or fell behind, the highest seq before it."""

    cluster: str
    direction: str
    stream: str
    seq: int
    event: str
    broker: str
    epoch: int
    ts_us: int
    pos: int
    prevmax: int
    earlier: int  # evidence records for the same seq before it, within its piece


@dataclass
class SegmentPlan:
    """What the driver tells pass 2 about the segments before this one (and earlier runs)."""

    seeds: dict[tuple[TermKey, str, str], int] = field(default_factory=dict)  # (term, dir, stream) -> seed
    shared: dict[StreamKey, list[Interval]] = field(default_factory=dict)  # seqs also in other segments
    carried: dict[StreamKey, int] = field(default_factory=dict)  # highest seq of earlier runs
    pending: dict[tuple[str, str, str, int], int] = field(default_factory=dict)  # (key, seq) -> accepted_us


@dataclass
class SegmentFindings:
    order: list[OrderRow]
    judged: Judged
    partial: MessageRows  # messages with records in other segments too: joined by the driver


def summarize(index: int, source: SegmentSource, scratch: str) -> SegmentSummary:
    parsed = read_source(source)
    cols = Columns.of(parsed.table, index)
    keep(cols, scratch, index)
    terms = [_term_part(cols, t) for t in range(len(cols.terms))]
    pieces = []
    for t, term in enumerate(cols.terms):
        rows = np.flatnonzero((cols.term == t) & cols.evidence)
        if len(rows):
            ranges = _intervals(cols.key[rows], cols.seq[rows])
            evidence = {(cols.keys[k][1], cols.keys[k][2]): spans for k, spans in ranges.items()}
            pieces.append(Piece(term, int(cols.ts[cols.term == t].min()), evidence))
    rows = np.flatnonzero(cols.message)
    messages = {cols.keys[k]: spans for k, spans in _intervals(cols.key[rows], cols.seq[rows]).items()}
    return SegmentSummary(
        index=index,
        source=source,
        lines=parsed.lines,
        malformed=parsed.malformed,
        first_malformed=parsed.first_malformed,
        refused=parsed.refused,
        why=parsed.why,
        records=parsed.table.num_rows,
        terms=terms,
        pieces=pieces,
        messages=messages,
    )


def _term_part(cols: Columns, t: int) -> TermPart:
    cluster, broker, epoch = cols.terms[t]
    mine = cols.term == t
    ts, event = cols.ts[mine], cols.event[mine]
    evidence = cols.evidence[mine]
    activated, deactivated = ts[event == ACTIVATED], ts[event == DEACTIVATED]
    effect = None
    effectful = np.flatnonzero(mine & np.isin(cols.event, EFFECTFUL))
    if len(effectful):
        latest = effectful[cols.ts[effectful] == cols.ts[effectful].max()]
        effect = max(
            Effect(
                int(cols.ts[i]),
                EVENTS[cols.event[i]],
                cols.keys[cols.key[i]][1],
                cols.keys[cols.key[i]][2],
                int(cols.seq[i]),
            )
            for i in latest.tolist()
        )
    seconds, counts = np.unique(ts[evidence] // 1_000_000, return_counts=True)
    side_rows = np.flatnonzero(mine & np.isin(cols.event, SIDE))
    return TermPart(
        cluster=cluster,
        broker=broker,
        epoch=epoch,
        start=int(activated.min()) if len(activated) else None,
        deactivated=int(deactivated.max()) if len(deactivated) else None,
        last=int(ts.max()),
        effect=effect,
        first_evidence=int(ts[evidence].min()) if evidence.any() else None,
        last_evidence=int(ts[evidence].max()) if evidence.any() else None,
        deduplicated=int(np.count_nonzero(event == DEDUPLICATED)),
        rate=dict(zip(seconds.tolist(), counts.tolist(), strict=True)),
        side=[
            Side(
                EVENTS[cols.event[i]],
                cols.keys[cols.key[i]][1],
                cols.keys[cols.key[i]][2],
                int(cols.seq[i]),
                int(cols.ts[i]),
            )
            for i in side_rows.tolist()
        ],
    )


def _intervals(keys: np.ndarray, seqs: np.ndarray) -> dict[int, list[Interval]]:
    """Per key id, its distinct seqs as ascending runs of consecutive numbers."""
    order = np.lexsort((seqs, keys))
    k, s = keys[order], seqs[order]
    if len(k) == 0:
        return {}
    distinct = np.ones(len(k), dtype=bool)
    distinct[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
    k, s = k[distinct], s[distinct]
    start = np.ones(len(k), dtype=bool)
    start[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1] + 1)
    starts = np.flatnonzero(start)
    ends = np.append(starts[1:], len(k)) - 1
    runs: dict[int, list[Interval]] = defaultdict(list)
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        runs[int(k[a])].append((int(s[a]), int(s[b])))
    return runs


def check(index: int, source: SegmentSource, scratch: str, plan: SegmentPlan) -> SegmentFindings:
    cols = load(index, source, scratch)
    order: list[OrderRow] = []
    for t, term in enumerate(cols.terms):
        rows = np.flatnonzero((cols.term == t) & cols.evidence)
        if len(rows):
            order += _order(cols, rows, term, plan)
    judged, partial = _messages(cols, plan)
    return SegmentFindings(order, judged, partial)


def _order(cols: Columns, rows: np.ndarray, term: TermKey, plan: SegmentPlan) -> list[OrderRow]:
    """The evidence records of one piece that jump ahead or fall behind, in target order per stream."""
    rows = rows[np.lexsort((cols.pos[rows], cols.ts[rows], cols.key[rows]))]
    k, s = cols.key[rows], cols.seq[rows]
    seed = np.array([plan.seeds.get((term, *key[1:]), 0) for key in cols.keys], dtype=np.int64)[k]
    # The highest seq before each record within its stream: a running max over (stream, seq rank),
    # which never crosses streams because the streams are sorted and ranks are below `width`.
    distinct, rank = np.unique(s, return_inverse=True)
    width = len(distinct)
    running = np.maximum.accumulate(k * width + rank)
    same_stream = np.zeros(len(k), dtype=bool)
    same_stream[1:] = k[1:] == k[:-1]
    before = np.zeros(len(k), dtype=np.int64)
    before[1:] = distinct[np.where(same_stream[1:], running[:-1] - k[1:] * width, 0)]
    prevmax = np.maximum(seed, np.where(same_stream, before, 0))
    delivered = cols.event[rows] == DELIVERED
    # s - 1 > prevmax, not s > prevmax + 1: a hostile seq of 2**63 - 1 must not wrap around.
    unusual = np.flatnonzero((s - 1 > prevmax) | (delivered & (s <= prevmax)))
    if not len(unusual):
        return []
    # How many records of the same message come before each, within this piece (a repeat is not
    # out of order): its occurrence number among equal (stream, seq), in target order.
    by_message = np.lexsort((np.arange(len(k)), s, k))
    first = np.ones(len(k), dtype=bool)
    first[1:] = (k[by_message][1:] != k[by_message][:-1]) | (s[by_message][1:] != s[by_message][:-1])
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
    occurrence = np.empty(len(k), dtype=np.int64)
    occurrence[by_message] = np.arange(len(k)) - group_start
    found = []
    for i in unusual.tolist():
        cluster, direction, stream = cols.keys[k[i]]
        row = rows[i]
        found.append(
            OrderRow(
                cluster,
                direction,
                stream,
                int(s[i]),
                EVENTS[cols.event[row]],
                cols.brokers[cols.broker[row]],
                int(cols.epoch[row]),
                int(cols.ts[row]),
                int(cols.pos[row]),
                int(prevmax[i]),
                int(occurrence[i]),
            )
        )
    return found


def _messages(cols: Columns, plan: SegmentPlan) -> tuple[Judged, MessageRows]:
    """Per message in this segment: first acceptance, first evidence (with who), `delivered` count."""
    rows = np.flatnonzero(cols.message)
    rows = rows[np.lexsort((cols.pos[rows], cols.ts[rows], cols.seq[rows], cols.key[rows]))]
    k, s = cols.key[rows], cols.seq[rows]
    start = np.ones(len(rows), dtype=bool)
    start[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
    starts = np.flatnonzero(start)
    none = len(rows)

    def first_of(mask: np.ndarray) -> np.ndarray:
        """Per message, the index (into ``rows``) of its first record in ``mask``, or ``none``."""
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        return np.minimum.reduceat(np.where(mask, np.arange(len(rows)), none), starts)

    acc = first_of(cols.event[rows] == ACCEPTED)
    ev = first_of(cols.evidence[rows])
    delivered = (
        np.add.reduceat((cols.event[rows] == DELIVERED).astype(np.int64), starts)
        if len(rows)
        else np.zeros(0, dtype=np.int64)
    )
    padded = np.append(rows, 0)  # index `none` reads a dummy row; the masks say it is absent
    messages = MessageRows(
        keys=cols.keys,
        key=k[starts],
        seq=s[starts],
        brokers=cols.brokers,
        has_acc=acc < none,
        acc_us=cols.ts[padded[acc]],
        acc_pos=cols.pos[padded[acc]],
        acc_broker=cols.broker[padded[acc]],
        acc_epoch=cols.epoch[padded[acc]],
        has_ev=ev < none,
        ev_us=cols.ts[padded[ev]],
        ev_pos=cols.pos[padded[ev]],
        ev_broker=cols.broker[padded[ev]],
        ev_epoch=cols.epoch[padded[ev]],
        delivered=delivered,
    )
    shared = np.zeros(len(starts), dtype=bool)
    for key_id, key in enumerate(cols.keys):
        spans = plan.shared.get(key)
        if spans:
            lo, hi = np.searchsorted(messages.key, [key_id, key_id + 1])
            seqs = messages.seq[lo:hi]
            for a, b in spans:
                shared[lo + np.searchsorted(seqs, a) : lo + np.searchsorted(seqs, b, side="right")] = True
    return judge(messages.take(~shared), plan.carried, plan.pending), messages.take(shared)


def min_known(a: Any, b: Any) -> Any:
    """The smaller of two values where None means unknown (not smaller)."""
    return b if a is None else a if b is None else min(a, b)


def max_known(a: Any, b: Any) -> Any:
    """The larger of two values where None means unknown."""
    return b if a is None else a if b is None else max(a, b)
