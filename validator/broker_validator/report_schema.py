"""The validator's report contract: ``report.json``, versioned, and the anomaly classes.

``report.json`` is what scripts, the HTML report and ``status.ordering`` read; it is cumulative
over the whole store (an incremental run carries earlier runs' findings in its checkpoint), so a
violation found once stays in the verdict until the store is validated again with ``--full`` after
its cause is gone. :data:`SCHEMA_VERSION` grows when a field changes meaning or disappears, and
when an anomaly class is added (a script that reads ``anomalies`` by class must learn the new one);
adding a field does not change it. Version 2 added ``corrupt-segment`` and ``unverified-segment``.

Anomaly classes follow Jepsen's queue checker (lost, duplicate, nonmonotonic, skip, unseen) and
add what a broker's log allows: split brain from epochs, and the non-failures a person still wants
to see (held, discarded, crashes, deliveries the target had already taken).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, TypedDict

SCHEMA_VERSION: Final = 2


class Anomaly(StrEnum):
    # Violations: any one of these fails the run.
    LOST = "lost"  # accepted, never delivered/held/discarded, older than the settle horizon
    DUPLICATE_DELIVERY = "duplicate-delivery"  # one (cluster, direction, stream, seq) delivered twice
    OUT_OF_ORDER = "out-of-order"  # a lower seq delivered after a higher one of its stream
    GAP = "gap"  # a seq below delivered ones that nobody accepted, delivered, held or discarded
    SPLIT_BRAIN = "split-brain"  # work by an epoch after another broker took a higher one; or one epoch twice
    # Reported as what they are, never failures.
    IN_FLIGHT = "in-flight"  # accepted, not yet delivered, younger than the settle horizon
    HELD = "held"  # parked by onPoison after maxDeliveries
    DISCARDED = "discarded"  # dropped on purpose by an operator
    DEDUPLICATED = "deduplicated"  # the target already had it: a delivery a crash or lost reply left unlogged
    CRASHED_TERM = "crashed-term"  # a broker's active term ended without a `deactivated` record
    MALFORMED = "malformed"  # a line that does not parse or does not fit the schema
    # A store entry that is not a closed segment the validator reads: misplaced or misnamed, a
    # symbolic link, directory, FIFO, socket or device, or larger than --max-segment-bytes.
    FOREIGN_FILE = "foreign-file"
    # A closed segment whose bytes do not match the sha256 its name carries: none of its records is
    # taken. Not by itself a violation (the log is not fsynced, so a node that loses power can leave
    # one behind); a record it held that mattered shows up as what its absence means (lost, gap).
    CORRUPT_SEGMENT = "corrupt-segment"
    UNVERIFIED_SEGMENT = "unverified-segment"  # read, but named without a sha256 (an older broker)


VIOLATIONS: Final = frozenset(
    {Anomaly.LOST, Anomaly.DUPLICATE_DELIVERY, Anomaly.OUT_OF_ORDER, Anomaly.GAP, Anomaly.SPLIT_BRAIN}
)

Result = Literal["Passed", "Failed"]

EXIT_PASSED: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_COULD_NOT_VALIDATE: Final = 2

MAX_EXAMPLES: Final = 5
"""Examples kept per (cluster, anomaly class); the counts are always exact."""


class Example(TypedDict):
    """One anomaly with the record that proves it (and, where there is one, the record it clashes with)."""

    anomaly: str
    cluster: str
    direction: str | None
    stream: str | None
    seq: int | None
    broker: str | None
    epoch: int | None
    ts: str | None
    detail: str  # English, for people: what is wrong with which values


class Term(TypedDict):
    """One broker's active term: from its `activated` record to its end."""

    broker: str
    epoch: int
    start: str  # ts of `activated`
    end: str | None  # ts of `deactivated`, or of the term's last record after a crash; None while open
    ended: Literal["deactivated", "crashed", "open"]


class Failover(TypedDict):
    at: str  # ts of the new term's `activated`
    fromBroker: str | None
    fromEpoch: int | None
    toBroker: str
    toEpoch: int
    gapMs: float | None  # last delivery of the old epoch to the first of the new; None without both


class Latency(TypedDict):
    count: int
    p50: float
    p90: float
    p99: float
    max: float


class StreamSummary(TypedDict):
    direction: str
    stream: str
    delivered: int  # distinct seqs delivered (or deduplicated) so far
    lastSeq: int


class DeliveryRate(TypedDict):
    bucketSeconds: int
    start: str | None  # ts of the first bucket
    counts: list[int]  # deliveries per bucket, both directions


class SegmentProblem(TypedDict):
    segment: str  # path relative to the store
    lines: int  # malformed lines in it (0 for a foreign, corrupt or empty file)
    example: str  # the first bad line (cut to 200 characters), or why the file was not read


class ClusterReport(TypedDict):
    result: Result
    violations: int
    anomalies: dict[str, int]  # every Anomaly value, 0 included
    examples: dict[str, list[Example]]  # at most MAX_EXAMPLES per class
    messages: dict[str, int]  # direction -> distinct messages delivered
    streamCount: int
    streams: list[StreamSummary]  # the first 200 by (direction, stream); all counts are in streamCount
    terms: list[Term]
    failovers: list[Failover]
    latencyMs: dict[str, Latency]  # direction -> accepted-to-delivered latency
    worstLag: Example | None  # the message with the longest accepted-to-delivered time (anomaly "")
    deliveryRate: DeliveryRate
    firstTs: str | None
    lastTs: str | None


class RunInfo(TypedDict):
    mode: Literal["full", "incremental"]
    startedAt: str
    seconds: float
    segmentsRead: int  # new segments read by this run
    segmentsKnown: int  # already processed by earlier runs, skipped
    recordsRead: int
    bytesRead: int
    settleSeconds: float


class Report(TypedDict):
    schemaVersion: int
    generatedAt: str
    store: str
    result: Result
    violations: int
    anomalies: dict[str, int]  # summed over clusters
    run: RunInfo
    clusters: dict[str, ClusterReport]
    problems: list[SegmentProblem]  # malformed, foreign, corrupt and empty files (capped at 100)


def empty_anomalies() -> dict[str, int]:
    return {anomaly.value: 0 for anomaly in Anomaly}


def count_violations(anomalies: dict[str, int]) -> int:
    return sum(anomalies.get(anomaly.value, 0) for anomaly in VIOLATIONS)


def result_of(violations: int) -> Result:
    return "Failed" if violations else "Passed"
