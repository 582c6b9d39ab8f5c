"""The Spark side of the checks: read new segments once, compute what the state needs, collect it.

One pass parses the new segments (JSON Lines read as text with an explicit schema built from
:data:`broker_contracts.message_log.FIELDS`, no inference) into a cached table; every later step
is an aggregation or a window over that cache whose result is small enough to collect (per term,
per epoch, per second, the rare out-of-place deliveries), and :mod:`broker_validator.fold` folds
those results into the carried :class:`~broker_validator.state.ValidatorState` in plain Python.

Why this shape: the checks are sequential per stream (a gap or a reordering is only visible in
target order), but almost every record is unremarkable. A window over each stream's delivery
evidence, ordered by ``(epoch, ts, position in the segment)`` and seeded with the carried
``max_seq``, finds the few records that jump ahead (holes) or fall behind (candidates for
duplicate or out-of-order); only those leave the JVM. A per-message aggregation pairs each
``accepted`` with its first delivery evidence for latency and for what is still pending.

``forwarded`` records (a quarter of the log, one per attempt) are not parsed: no check reads them.
They are only recognised by their fixed prefix, and a line that is not whole still gets parsed and
counted as malformed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812  # Spark's own convention
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker_contracts.message_log import FIELDS, LIFECYCLE_EVENTS, Direction, Event

TS_LENGTH: Final = len("2026-11-22T12:00:00.123456Z")
LATENCY_BUCKET_BASE: Final = 1.05
"""Latency histogram buckets grow by 5 %: percentiles merge across runs within that precision."""

EVIDENCE: Final = (Event.DELIVERED.value, Event.DEDUPLICATED.value)
EFFECTFUL: Final = (*EVIDENCE, Event.ACCEPTED.value, Event.CONFIRMED.value)
SIDE_EVENTS: Final = (Event.HELD.value, Event.DISCARDED.value, Event.REPLAYED.value)
_FORWARDED_PREFIX: Final = '{"event":"forwarded",'
KEY: Final = ("cluster", "direction", "stream")


def record_schema() -> StructType:
    kinds = {str: StringType(), int: LongType()}
    return StructType([StructField(name, kinds[kind], nullable=True) for name, kind, _ in FIELDS])


def _fits_schema() -> Column:
    message_fields = (
        F.col("direction").isin([d.value for d in Direction])
        & F.col("stream").isNotNull()
        & F.col("seq").isNotNull()
        & (F.col("seq") >= 1)
        & F.col("msgId").isNotNull()
    )
    required = [F.col(name).isNotNull() for name, _, nullable in FIELDS if not nullable]
    fits = F.col("event").isin([e.value for e in Event]) & F.col("ts_us").isNotNull()
    for column in required:
        fits = fits & column
    return fits & (F.col("event").isin([e.value for e in LIFECYCLE_EVENTS]) | message_fields)


@dataclass
class Batch:
    """The new segments, parsed and cached, with the malformed lines counted per file."""

    cached: DataFrame  # every parsed line, cached
    records: DataFrame  # the valid records of it
    malformed: list[tuple[str, int, str]]  # (file URI, bad lines, first bad line)
    count: int  # valid records

    def release(self) -> None:
        self.cached.unpersist()


def read_batch(spark: SparkSession, paths: list[str]) -> Batch:
    text = spark.read.text(paths).select(
        "value",
        F.col("_metadata.file_path").alias("file"),
        F.monotonically_increasing_id().alias("pos"),  # increases with the line within each file
    )
    text = text.filter(~(F.col("value").startswith(_FORWARDED_PREFIX) & F.col("value").endswith("}")))
    parsed = text.select("file", "pos", "value", F.from_json("value", record_schema()).alias("r")).select(
        "file",
        "pos",
        "value",
        "r.*",
    )
    # A cast reads the contract's ISO 8601 text at a third of the cost of a pattern; the length and
    # the "Z" keep other spellings of a time (which a cast would take) out as malformed.
    strict_ts = (F.length("ts") == TS_LENGTH) & F.col("ts").endswith("Z")
    parsed = parsed.withColumn(
        "ts_us", F.when(strict_ts, F.unix_micros(F.col("ts").cast("timestamp")))
    ).withColumn("valid", F.coalesce(_fits_schema(), F.lit(False)))
    table = parsed.select(
        F.when(~F.col("valid"), F.col("file")).alias("bad_file"),  # only bad rows keep their file
        F.when(~F.col("valid"), F.substring("value", 1, 200)).alias("bad"),
        "pos",
        "cluster",
        "broker",
        "epoch",
        "event",
        "direction",
        "stream",
        "seq",
        "ts_us",
    ).cache()
    summary = (
        table.groupBy("bad_file")
        .agg(F.count(F.lit(1)).alias("lines"), F.first("bad", ignorenulls=True).alias("example"))
        .collect()
    )
    malformed = [(row.bad_file, int(row.lines), row.example or "") for row in summary if row.bad_file]
    count = sum(int(row.lines) for row in summary if row.bad_file is None)
    return Batch(table, table.filter(F.col("bad_file").isNull()).drop("bad_file", "bad"), malformed, count)


@dataclass
class PriorState:
    """The carried state the Spark side needs, as small lookup rows."""

    stream_max: list[tuple[str, str, str, int]]  # (cluster, direction, stream, max_seq)
    pending: list[tuple[str, str, str, int, int]]  # (cluster, direction, stream, seq, accepted_us)
    holes: list[tuple[str, str, str, int, int]]  # (cluster, direction, stream, lo, hi)


@dataclass
class BatchFindings:
    """Everything the fold needs from one batch, collected."""

    terms: list[Any] = field(default_factory=list)  # per (cluster, broker, epoch), with side records and rate
    stream_max: list[Any] = field(default_factory=list)  # per stream key, its last row: batch_max
    jumps: list[Any] = field(default_factory=list)  # deliveries more than one above the max before them
    behind: list[Any] = field(default_factory=list)  # `delivered` at or below the max before it
    earlier: dict[tuple[str, str, str, int, int], int] = field(default_factory=dict)  # evidence before each
    filled: list[Any] = field(default_factory=list)  # (key, seq) with evidence inside a hole range
    messages: list[Any] = field(default_factory=list)  # per (key, seq): pending or repeated deliveries
    latency: list[Any] = field(default_factory=list)  # (cluster, direction, bucket, n, worst_ms)
    worst: list[Any] = field(default_factory=list)  # per (cluster, direction) the slowest message


def _rows(spark: SparkSession, rows: Iterable[tuple[Any, ...]], schema: str) -> DataFrame:
    """A small lookup table from Python rows (``schema``: ``"name string, other long"``).

    Built from an Arrow table: a list of tuples would go through Python worker processes on every
    job that reads it, which measured twice as slow per job (``make bench-validator``)."""
    columns = [part.split() for part in schema.split(",")]
    listed = list(rows)
    values = list(zip(*listed, strict=True)) if listed else [() for _ in columns]
    kinds = {"string": pa.string(), "long": pa.int64(), "double": pa.float64()}
    table = pa.table(
        {name: pa.array(list(v), kinds[kind]) for (name, kind), v in zip(columns, values, strict=True)}
    )
    return spark.createDataFrame(table)


def find(spark: SparkSession, batch: Batch, prior: PriorState) -> BatchFindings:
    records = batch.records
    findings = BatchFindings()
    is_evidence = F.col("event").isin(*EVIDENCE)

    findings.terms = _terms(records)

    # Target order per stream, seeded with the carried max: what jumps ahead, what falls behind.
    evidence = records.filter(is_evidence)
    stream_max = _rows(spark, prior.stream_max, "cluster string, direction string, stream string, smax long")
    ordered = evidence.join(F.broadcast(stream_max), list(KEY), "left")
    in_order = Window.partitionBy(*KEY).orderBy("epoch", "ts_us", "pos")
    before = in_order.rowsBetween(Window.unboundedPreceding, -1)
    ordered = ordered.select(
        "*",
        F.greatest(F.coalesce("smax", F.lit(0)), F.coalesce(F.max("seq").over(before), F.lit(0))).alias(
            "prevmax"
        ),
        F.lead("seq").over(in_order).isNull().alias("last_of_stream"),
        F.max("seq").over(Window.partitionBy(*KEY)).alias("batch_max"),
    )
    unusual = ordered.filter(
        (F.col("seq") > F.col("prevmax") + 1)
        | ((F.col("event") == Event.DELIVERED.value) & (F.col("seq") <= F.col("prevmax")))
        | F.col("last_of_stream")
    ).collect()
    findings.jumps = [row for row in unusual if row.seq > row.prevmax + 1]
    findings.behind = [
        row for row in unusual if row.seq <= row.prevmax and row.event == Event.DELIVERED.value
    ]
    findings.stream_max = [row for row in unusual if row.last_of_stream]
    if findings.behind:  # how much evidence for the same message came before each of them
        behind = _rows(
            spark,
            [(*_key(r), r.seq, r.epoch, r.ts_us, r.pos) for r in findings.behind],
            "cluster string, direction string, stream string, seq long, b_epoch long, b_ts long, b_pos long",
        )
        earlier = F.struct("epoch", "ts_us", "pos") < F.struct("b_epoch", "b_ts", "b_pos")
        findings.earlier = {
            (*_key(r), r.seq, r.b_pos): int(r.n)
            for r in evidence.join(F.broadcast(behind), [*KEY, "seq"])
            .groupBy(*KEY, "seq", "b_pos")
            .agg(F.sum(earlier.cast("long")).alias("n"))
            .collect()
        }

    # Evidence that lands inside a hole (a carried one, or one this batch's jumps opened).
    ranges = list(prior.holes) + [(*_key(r), r.prevmax + 1, r.seq - 1) for r in findings.jumps]
    if ranges:
        holes = _rows(spark, ranges, "cluster string, direction string, stream string, lo long, hi long")
        findings.filled = (
            evidence.join(F.broadcast(holes), list(KEY))
            .filter((F.col("seq") >= F.col("lo")) & (F.col("seq") <= F.col("hi")))
            .select(*KEY, "seq")
            .distinct()
            .collect()
        )

    # Per message: first acceptance, first evidence, how many `delivered`. Times only (longs): who
    # accepted or delivered is fetched afterwards for the few messages a finding names.
    pending = _rows(
        spark, prior.pending, "cluster string, direction string, stream string, seq long, pending_us long"
    )
    carried_max = F.coalesce("smax", F.lit(0))
    per_message = (
        records.filter(F.col("event").isin(Event.ACCEPTED.value, *EVIDENCE))
        .groupBy(*KEY, "seq")
        .agg(
            F.min(F.when(F.col("event") == Event.ACCEPTED.value, F.col("ts_us"))).alias("acc_us"),
            F.min(F.when(is_evidence, F.col("ts_us"))).alias("ev_us"),
            F.sum((F.col("event") == Event.DELIVERED.value).cast("long")).alias("delivered"),
        )
        .join(F.broadcast(stream_max), list(KEY), "left")
        .join(F.broadcast(pending), [*KEY, "seq"], "left")
        .withColumn("accepted_us", F.coalesce("pending_us", "acc_us"))
        # Latency only for a message whose first evidence is new (above the carried max, or pending).
        .withColumn(
            "lag_ms",
            F.when(
                F.col("ev_us").isNotNull()
                & F.col("accepted_us").isNotNull()
                & ((F.col("seq") > carried_max) | F.col("pending_us").isNotNull()),
                F.greatest((F.col("ev_us") - F.col("accepted_us")) / 1000.0, F.lit(0.0)),
            ),
        )
        .cache()
    )
    messages = per_message.filter(
        (F.col("ev_us").isNull() & F.col("acc_us").isNotNull())
        | F.col("pending_us").isNotNull()
        | (F.col("delivered") >= 2)
        | ((F.col("delivered") >= 1) & (F.col("seq") <= carried_max))
        | (F.col("ev_us").isNotNull() & (F.col("delivered") == 0))
    ).collect()
    buckets = (
        per_message.filter(F.col("lag_ms").isNotNull())
        .groupBy(
            "cluster",
            "direction",
            F.floor(F.log(F.greatest("lag_ms", F.lit(0.01))) / math.log(LATENCY_BUCKET_BASE)).alias("bucket"),
        )
        .agg(F.count(F.lit(1)).alias("n"), F.max("lag_ms").alias("worst_ms"))
        .collect()
    )
    worst: dict[tuple[str, str], float] = {}
    for row in buckets:
        worst[(row.cluster, row.direction)] = max(worst.get((row.cluster, row.direction), 0.0), row.worst_ms)
    worst_rows = []
    if worst:
        maxima = _rows(
            spark, [(*k, v) for k, v in worst.items()], "cluster string, direction string, worst_ms double"
        )
        worst_rows = (
            per_message.join(F.broadcast(maxima), ["cluster", "direction"])
            .filter(F.col("lag_ms") == F.col("worst_ms"))
            .select(*KEY, "seq", "ev_us", "lag_ms")
            .collect()
        )
    per_message.unpersist()
    who = _who(spark, records, messages, worst_rows)
    findings.messages = [_Message(row, who) for row in messages]
    findings.latency = buckets
    findings.worst = [_Message(row, who) for row in worst_rows]
    return findings


def _terms(records: DataFrame) -> list[Any]:
    """Per (cluster, broker, epoch): its times, its last effectful record, its held/discarded/replayed
    records and its deliveries per second; one job (per second first, then per term)."""
    event = F.col("event")
    is_evidence = event.isin(*EVIDENCE)
    per_second = records.groupBy(
        "cluster", "broker", "epoch", F.floor(F.col("ts_us") / 1_000_000).alias("second")
    ).agg(
        F.min(F.when(event == Event.ACTIVATED.value, F.col("ts_us"))).alias("start"),
        F.max(F.when(event == Event.DEACTIVATED.value, F.col("ts_us"))).alias("deactivated"),
        F.max("ts_us").alias("last"),
        F.max(F.when(event.isin(*EFFECTFUL), F.struct("ts_us", "event", "direction", "stream", "seq"))).alias(
            "effect"
        ),
        F.min(F.when(is_evidence, F.col("ts_us"))).alias("first_evidence"),
        F.max(F.when(is_evidence, F.col("ts_us"))).alias("last_evidence"),
        F.sum(is_evidence.cast("long")).alias("deliveries"),
        F.sum((event == Event.DEDUPLICATED.value).cast("long")).alias("deduplicated"),
        F.collect_list(
            F.when(event.isin(*SIDE_EVENTS), F.struct("event", "direction", "stream", "seq", "ts_us"))
        ).alias("side"),
    )
    return (
        per_second.groupBy("cluster", "broker", "epoch")
        .agg(
            F.min("start").alias("start"),
            F.max("deactivated").alias("deactivated"),
            F.max("last").alias("last"),
            F.max("effect").alias("effect"),
            F.min("first_evidence").alias("first_evidence"),
            F.max("last_evidence").alias("last_evidence"),
            F.sum("deduplicated").alias("deduplicated"),
            F.collect_list(F.when(F.col("deliveries") > 0, F.struct("second", "deliveries"))).alias("rate"),
            F.flatten(F.collect_list("side")).alias("side"),
        )
        .collect()
    )


class _Stamp(NamedTuple):
    ts_us: int
    broker: str | None
    epoch: int | None


class _Message:
    """A collected per-message row with who accepted it (``acc``) and who delivered it first (``ev``)."""

    def __init__(self, row: Any, who: dict[tuple[str, str, str, int, int], tuple[str, int]]) -> None:
        self.cluster, self.direction, self.stream, self.seq = row.cluster, row.direction, row.stream, row.seq
        fields = row.asDict()
        self.delivered = int(fields.get("delivered") or 0)
        self.pending_us = fields.get("pending_us")
        self.lag_ms = fields.get("lag_ms")
        self.acc = self._stamp(fields.get("acc_us"), who)
        self.ev = self._stamp(fields.get("ev_us"), who)

    def _stamp(
        self, ts_us: int | None, who: dict[tuple[str, str, str, int, int], tuple[str, int]]
    ) -> _Stamp | None:
        if ts_us is None:
            return None
        broker, epoch = who.get((self.cluster, self.direction, self.stream, self.seq, ts_us), (None, None))
        return _Stamp(ts_us, broker, epoch)


def _who(
    spark: SparkSession, records: DataFrame, *row_lists: list[Any]
) -> dict[tuple[str, str, str, int, int], tuple[str, int]]:
    """Broker and epoch of the records at ``(key, seq, ts)`` for the rows collected: one small join."""
    wanted = {
        (row.cluster, row.direction, row.stream, row.seq, ts)
        for rows in row_lists
        for row in rows
        for ts in (row.asDict().get("acc_us"), row.asDict().get("ev_us"))
        if ts is not None
    }
    if not wanted:
        return {}
    lookup = _rows(spark, wanted, "cluster string, direction string, stream string, seq long, ts_us long")
    return {
        (r.cluster, r.direction, r.stream, r.seq, r.ts_us): (r.broker, r.epoch)
        for r in records.join(F.broadcast(lookup), [*KEY, "seq", "ts_us"])
        .select(*KEY, "seq", "ts_us", "broker", "epoch")
        .collect()
    }


def _key(row: Any) -> tuple[str, str, str]:
    return (row.cluster, row.direction, row.stream)


def bucket_upper_ms(bucket: int) -> float:
    """The upper bound of a latency bucket, in milliseconds."""
    return float(math.pow(LATENCY_BUCKET_BASE, bucket + 1))


def segment_paths(store: Path, relative: Iterable[str]) -> list[str]:
    return [str(store / path) for path in relative]
