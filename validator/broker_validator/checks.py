"""The Spark side of the checks: two passes of per-segment tasks, and the driver's part between them.

Spark distributes whole segments to tasks (:mod:`broker_validator.segment_pass` does the work in
each, with pyarrow's JSON reader and numpy); the driver sees only summaries and the few records
that need a decision across segments, and hands :mod:`broker_validator.fold` the same
:class:`BatchFindings` it folds into the carried state.

Target order: a stream's delivery evidence is ordered by epoch (targets refuse a lower epoch than
one they have seen), then by the broker's own log: a *piece* (one term's records in one segment)
after the pieces of the same epoch that began before it, and within a piece by time, then line.
The driver orders the pieces from pass 1's summaries and gives each piece, per stream, the highest
evidenced seq before it (the *seed*); pass 2 scans each piece from its seed. Two brokers logging
the same epoch (itself a split brain) are ordered piece by piece, by when each piece began.

Why not Spark SQL: the same checks as a window and aggregations over a parsed, cached table spent
most of their time in Spark's JSON parsing and in sorting every record by stream; measured with
``make bench-validator`` in docs/benchmarks.md.
"""

from __future__ import annotations

import heapq
import shutil
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from pyspark.sql import SparkSession

from broker_contracts.message_log import Event
from broker_validator.columns import POS_SHIFT, StreamKey, TermKey
from broker_validator.messages import Judged, join, judge
from broker_validator.report_schema import Anomaly
from broker_validator.segment_pass import (
    Interval,
    OrderRow,
    Piece,
    SegmentFindings,
    SegmentPlan,
    SegmentSummary,
    TermPart,
    check,
    summarize,
)
from broker_validator.segment_reader import SegmentSource

TASKS_PER_CORE = 1
"""Segments are grouped into tasks of about equal bytes, one per core: a Python task costs Spark
about 0.1 s to run even when it does nothing, and one per core measured fastest (1, 2 and 3 per
core: 12.0, 12.4 and 13.2 s for the full run of ``make bench-validator``, 1.7, 2.0, 2.2 s for its
incremental run)."""


class FileProblem(NamedTuple):
    """What pass 1 found wrong with one segment: malformed lines, or the whole file refused."""

    segment: str  # relative to the store
    anomaly: str  # malformed, foreign-file or corrupt-segment
    amount: int  # lines (malformed) or 1 (a refused file)
    example: str  # the first bad line, or why the file was refused


@dataclass
class Batch:
    """The new segments after pass 1: their summaries, and what was wrong with which file."""

    runner: Runner
    groups: list[list[int]]  # the segments (by index) of each task; pass 2 keeps pass 1's grouping
    summaries: list[SegmentSummary]
    scratch: str  # where pass 1 left columnar copies for pass 2 (on each machine that ran a task)
    problems: list[FileProblem]
    count: int  # valid records, `forwarded` ones not included

    def release(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)  # the driver's; executors' go with their pods


@dataclass
class PriorState:
    """The carried state the checks need."""

    stream_max: list[tuple[str, str, str, int]]  # (cluster, direction, stream, max_seq)
    pending: list[tuple[str, str, str, int, int]]  # (cluster, direction, stream, seq, accepted_us)
    holes: list[tuple[str, str, str, int, int]]  # (cluster, direction, stream, lo, hi)


class StreamMax(NamedTuple):
    cluster: str
    direction: str
    stream: str
    batch_max: int


class Filled(NamedTuple):
    cluster: str
    direction: str
    stream: str
    seq: int


@dataclass
class BatchFindings:
    """Everything the fold needs from one batch, collected."""

    terms: list[Any] = field(default_factory=list)  # TermPart per (cluster, broker, epoch), merged
    stream_max: list[Any] = field(default_factory=list)  # StreamMax per stream key
    jumps: list[Any] = field(default_factory=list)  # deliveries more than one above the max before them
    behind: list[Any] = field(default_factory=list)  # `delivered` at or below the max before it
    earlier: dict[tuple[str, str, str, int, int], int] = field(default_factory=dict)  # evidence before each
    filled: list[Any] = field(default_factory=list)  # (key, seq) with evidence inside a hole range
    messages: list[Any] = field(default_factory=list)  # per (key, seq): pending or repeated deliveries
    latency: list[Any] = field(default_factory=list)  # (cluster, direction, bucket, n, worst_ms)
    worst: list[Any] = field(default_factory=list)  # per (cluster, direction) the slowest message


def _groups(items: list[tuple[int, SegmentSource, int]], tasks: int) -> list[list[tuple[int, SegmentSource]]]:
    """``(index, source, size)`` into ``tasks`` groups of about equal size (largest first)."""
    heap: list[tuple[int, int, list[tuple[int, SegmentSource]]]] = [
        (0, n, []) for n in range(max(1, min(tasks, len(items))))
    ]
    groups: list[list[tuple[int, SegmentSource]]] = [group for _, _, group in heap]
    for index, path, size in sorted(items, key=lambda item: -item[2]):
        load, n, group = heapq.heappop(heap)
        group.append((index, path))
        heapq.heappush(heap, (load + size, n, group))
    return [sorted(group) for group in groups if group]


Runner = Callable[[list[list[tuple[Any, ...]]], Callable[..., Any]], list[Any]]
"""Runs ``task(*item)`` for every item of every group (a group is one task) and returns the results."""


def spark_runner(spark: SparkSession) -> Runner:
    """One Spark job per call: a task per group, results collected to the driver."""

    def run(groups: list[list[tuple[Any, ...]]], task: Callable[..., Any]) -> list[Any]:
        def each(partition: Iterable[list[tuple[Any, ...]]]) -> Iterator[Any]:
            for group in partition:
                for item in group:
                    yield task(*item)

        return spark.sparkContext.parallelize(groups, len(groups)).mapPartitions(each).collect()

    return run


def in_process(groups: list[list[tuple[Any, ...]]], task: Callable[..., Any]) -> list[Any]:
    """The same tasks in this process: for the checks' own tests, which need no JVM."""
    return [task(*item) for group in groups for item in group]


def read_batch(spark: SparkSession, sources: list[SegmentSource]) -> Batch:
    """Pass 1 over ``sources`` on Spark: parse, keep a columnar copy, summarise."""
    return read_batch_with(spark_runner(spark), spark.sparkContext.defaultParallelism, sources)


def read_batch_with(runner: Runner, cores: int, sources: list[SegmentSource]) -> Batch:
    scratch = str(Path(tempfile.gettempdir()) / f"broker-validator-{uuid.uuid4().hex}")
    tasks = max(1, cores) * TASKS_PER_CORE
    # Sizes from the scan's lstat: the driver opens and follows nothing in the store.
    items = [(i, source, source.size) for i, source in enumerate(sources)]
    grouped = _groups(items, tasks)
    groups = [[(i, source, scratch) for i, source in group] for group in grouped]
    summaries: list[SegmentSummary] = sorted(runner(groups, summarize), key=lambda s: s.index)
    problems = [
        FileProblem(s.source.relative, s.refused, 1, s.why)
        if s.refused
        else FileProblem(s.source.relative, Anomaly.MALFORMED, s.malformed, s.first_malformed)
        for s in summaries
        if s.refused or s.malformed
    ]
    indexes = [[i for i, _ in group] for group in grouped]
    return Batch(runner, indexes, summaries, scratch, problems, sum(s.records for s in summaries))


def find(batch: Batch, prior: PriorState) -> BatchFindings:
    """Pass 2 and the driver's decisions around it."""
    findings = BatchFindings(terms=_terms(batch.summaries))
    carried = {(c, d, s): m for c, d, s, m in prior.stream_max}
    pending = {(c, d, s, seq): us for c, d, s, seq, us in prior.pending}
    order = _piece_order(batch.summaries)
    plans = _plans(batch.summaries, order, carried, pending)
    by_index = {s.index: (s.index, s.source, batch.scratch, plans[s.index]) for s in batch.summaries}
    groups = [[by_index[i] for i in group] for group in batch.groups]
    results: list[SegmentFindings] = batch.runner(groups, check)

    rows = [row for result in results for row in result.order]
    findings.jumps = [row for row in rows if row.seq > row.prevmax + 1]
    findings.behind = [row for row in rows if row.seq <= row.prevmax and row.event == Event.DELIVERED.value]
    findings.earlier = _earlier(findings.behind, order)
    findings.stream_max = _stream_max(batch.summaries)
    holes = list(prior.holes) + [(*_key(r), r.prevmax + 1, r.seq - 1) for r in findings.jumps]
    findings.filled = _filled(holes, order)

    judged = Judged()
    for result in results:
        judged.merge(result.judged)
    shared = join([result.partial for result in results])
    if shared is not None:
        judged.merge(judge(shared, carried, pending))
    findings.messages = judged.messages
    findings.latency = judged.latency()
    findings.worst = [message for rows_ in judged.worst.values() for message in rows_]
    return findings


def _terms(summaries: list[SegmentSummary]) -> list[TermPart]:
    """Each term's parts from every segment, merged into one per (cluster, broker, epoch)."""
    merged: dict[TermKey, TermPart] = {}
    for summary in summaries:
        for part in summary.terms:
            key = (part.cluster, part.broker, part.epoch)
            if key in merged:
                merged[key].absorb(part)
            else:
                merged[key] = replace(part, rate=dict(part.rate), side=list(part.side))
    return list(merged.values())


@dataclass
class _Placed:
    """A piece in target order: its rank within its cluster, and its segment."""

    rank: int
    segment: SegmentSummary
    piece: Piece


def _piece_order(summaries: list[SegmentSummary]) -> dict[str, list[_Placed]]:
    by_cluster: dict[str, list[tuple[SegmentSummary, Piece]]] = defaultdict(list)
    for summary in summaries:
        for piece in summary.pieces:
            by_cluster[piece.term[0]].append((summary, piece))
    return {
        cluster: [
            _Placed(rank, segment, piece)
            for rank, (segment, piece) in enumerate(
                sorted(pieces, key=lambda sp: (sp[1].term[2], sp[1].first_ts, sp[0].source.path))
            )
        ]
        for cluster, pieces in by_cluster.items()
    }


def _plans(
    summaries: list[SegmentSummary],
    order: dict[str, list[_Placed]],
    carried: dict[StreamKey, int],
    pending: dict[tuple[str, str, str, int], int],
) -> dict[int, SegmentPlan]:
    plans = {s.index: SegmentPlan() for s in summaries}
    for cluster, placed in order.items():
        running: dict[StreamKey, int] = {}
        for p in placed:
            plan = plans[p.segment.index]
            for (direction, stream), spans in p.piece.evidence.items():
                key = (cluster, direction, stream)
                seed = running.get(key, carried.get(key, 0))
                plan.seeds[(p.piece.term, direction, stream)] = seed
                running[key] = max(seed, spans[-1][1])
    for key, shared in _shared(summaries).items():
        for index in shared:
            plans[index].shared[key] = shared[index]
    waiting: dict[StreamKey, dict[tuple[str, str, str, int], int]] = defaultdict(dict)
    for message, accepted_us in pending.items():  # by stream: each segment takes its streams' share
        waiting[message[:3]][message] = accepted_us
    for summary in summaries:
        plan = plans[summary.index]
        plan.carried = {key: carried[key] for key in summary.messages if key in carried}
        for key in summary.messages:
            plan.pending.update(waiting.get(key, {}))
    return plans


def _shared(summaries: list[SegmentSummary]) -> dict[StreamKey, dict[int, list[Interval]]]:
    """Per stream, the seq ranges that have message records in more than one segment, per segment."""
    spans: dict[StreamKey, list[tuple[int, int, int]]] = defaultdict(list)
    for summary in summaries:
        for key, ranges in summary.messages.items():
            spans[key] += [(lo, hi, summary.index) for lo, hi in ranges]
    shared: dict[StreamKey, dict[int, list[Interval]]] = defaultdict(lambda: defaultdict(list))
    for key, placed in spans.items():
        placed.sort()
        reach, reach_index = placed[0][1], placed[0][2]
        for lo, hi, index in placed[1:]:
            # Overlapping the furthest-reaching range so far (never one of the same segment: a
            # segment's own ranges are disjoint). A seq in several segments is marked in each of them.
            if lo <= reach:
                overlap = (lo, min(hi, reach))
                shared[key][index].append(overlap)
                shared[key][reach_index].append(overlap)
            if hi > reach:
                reach, reach_index = hi, index
    return shared


def _earlier(
    behind: list[OrderRow], order: dict[str, list[_Placed]]
) -> dict[tuple[str, str, str, int, int], int]:
    """For each `delivered` that fell behind: evidence for the same seq before it in target order."""
    earlier = {}
    for row in behind:
        count = row.earlier
        if not count:
            segment_index = row.pos >> POS_SHIFT
            term = (row.cluster, row.broker, row.epoch)
            for p in order[row.cluster]:
                if p.segment.index == segment_index and p.piece.term == term:
                    break
                spans = p.piece.evidence.get((row.direction, row.stream), [])
                count += sum(1 for lo, hi in spans if lo <= row.seq <= hi)
        earlier[(*_key(row), row.seq, row.pos)] = count
    return earlier


def _stream_max(summaries: list[SegmentSummary]) -> list[StreamMax]:
    highest: dict[StreamKey, int] = {}
    for summary in summaries:
        for piece in summary.pieces:
            for (direction, stream), spans in piece.evidence.items():
                key = (piece.term[0], direction, stream)
                highest[key] = max(highest.get(key, 0), spans[-1][1])
    return [StreamMax(*key, top) for key, top in highest.items()]


def _filled(holes: list[tuple[str, str, str, int, int]], order: dict[str, list[_Placed]]) -> list[Filled]:
    """Evidenced seqs inside the hole ranges (carried ones, and the ones this batch's jumps opened)."""
    wanted: dict[StreamKey, list[Interval]] = defaultdict(list)
    for cluster, direction, stream, lo, hi in holes:
        wanted[(cluster, direction, stream)].append((lo, hi))
    filled: set[Filled] = set()
    for cluster, placed in order.items():
        for p in placed:
            for (direction, stream), spans in p.piece.evidence.items():
                for lo, hi in wanted.get((cluster, direction, stream), ()):
                    for a, b in spans:
                        filled.update(
                            Filled(cluster, direction, stream, seq)
                            for seq in range(max(lo, a), min(hi, b) + 1)
                        )
    return sorted(filled)


def _key(row: Any) -> tuple[str, str, str]:
    return (row.cluster, row.direction, row.stream)
