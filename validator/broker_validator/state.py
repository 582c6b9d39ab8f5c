"""What one run carries to the next: per-stream cursors, pending messages, terms, findings so far.

The checks are incremental: a run reads only new segments and folds what it finds into this
state, which the checkpoint keeps. Everything here is plain Python and JSON (no Spark), small
next to the log: per stream a few integers and its *holes* (seq ranges below its highest
delivered seq that have no delivery evidence yet), the messages accepted but not yet delivered,
one entry per broker term and per epoch, and capped examples.

Two kinds of findings, which is why a full run and a chain of incremental runs agree:

* event findings (duplicate-delivery, out-of-order, held, discarded, deduplicated, malformed)
  happen at one record and are counted once, when that record is read;
* state findings (lost, in-flight, gap, split-brain, crashed-term) are derived afresh at every
  run from the state as it now is: a hole filled later stops being a gap, an accepted message
  delivered later stops being in flight.

Timestamps are integer microseconds since the Unix epoch (UTC) throughout.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from broker_validator.report_schema import MAX_EXAMPLES, Example, SegmentProblem

StreamKey = tuple[str, str, str]
"""``(cluster, direction, stream)``."""


Hole = list[Any]
"""``[lo, hi, ts_us, broker, epoch, seq]``: seqs lo..hi lack evidence; the rest is the delivery that
skipped them (its time, broker, epoch and seq), the record that proves the hole."""


@dataclass
class StreamState:
    max_seq: int = 0  # highest seq with delivery evidence
    holes: list[Hole] = field(default_factory=list)  # disjoint ranges below max_seq, by lo
    held: set[int] = field(default_factory=set)  # ever held (exempt from gap, lost and out-of-order)
    discarded: set[int] = field(default_factory=set)
    # Evidenced only by `deduplicated` so far: a later `delivered` for one of these is the first.
    dedup_only: set[int] = field(default_factory=set)

    def has_evidence(self, seq: int) -> bool:
        """Whether an earlier run saw delivery evidence for ``seq``."""
        return seq <= self.max_seq and not self.in_hole(seq)

    def in_hole(self, seq: int) -> bool:
        return any(hole[0] <= seq <= hole[1] for hole in self.holes)

    def fill(self, seqs: set[int]) -> None:
        """Remove ``seqs`` (now evidenced) from the holes, splitting ranges where needed."""
        if not seqs or not self.holes:
            return
        remaining: list[Hole] = []
        for lo, hi, *proof in self.holes:
            start = lo
            for seq in sorted(s for s in seqs if lo <= s <= hi):
                if seq > start:
                    remaining.append([start, seq - 1, *proof])
                start = seq + 1
            if start <= hi:
                remaining.append([start, hi, *proof])
        self.holes = remaining

    def missing(self) -> int:
        return sum(hole[1] - hole[0] + 1 for hole in self.holes)


@dataclass
class Pending:
    """A message accepted and not (yet) delivered."""

    accepted_us: int
    broker: str
    epoch: int


@dataclass
class TermState:
    start_us: int | None = None  # first `activated`
    deactivated_us: int | None = None  # last `deactivated`
    last_us: int = 0  # last record of this broker with this epoch


@dataclass
class EpochState:
    activations: dict[str, int] = field(default_factory=dict)  # broker -> first `activated` ts
    last_effect_us: int | None = None  # the epoch's last accepted/delivered/deduplicated/confirmed
    last_effect: Example | None = None
    first_evidence_us: int | None = None
    last_evidence_us: int | None = None


@dataclass
class ClusterState:
    newest_us: int = 0
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # event findings
    examples: dict[str, list[Example]] = field(default_factory=lambda: defaultdict(list))
    terms: dict[tuple[str, int], TermState] = field(default_factory=dict)
    epochs: dict[int, EpochState] = field(default_factory=dict)
    latency: dict[str, dict[int, int]] = field(default_factory=dict)  # direction -> bucket -> count
    worst_lag_ms: float = -1.0
    worst_lag: Example | None = None
    rate: dict[int, int] = field(default_factory=dict)  # second -> deliveries

    def add_example(self, anomaly: str, example: Example) -> None:
        kept = self.examples[anomaly]
        if len(kept) < MAX_EXAMPLES:
            kept.append(example)


@dataclass
class ValidatorState:
    processed: dict[str, int] = field(default_factory=dict)  # segment path -> size when read
    streams: dict[StreamKey, StreamState] = field(default_factory=dict)
    pending: dict[StreamKey, dict[int, Pending]] = field(default_factory=dict)
    clusters: dict[str, ClusterState] = field(default_factory=dict)
    problems: list[SegmentProblem] = field(default_factory=list)

    def cluster(self, name: str) -> ClusterState:
        found = self.clusters.get(name)
        if found is None:
            found = self.clusters[name] = ClusterState()
        return found

    def stream(self, key: StreamKey) -> StreamState:
        found = self.streams.get(key)
        if found is None:
            found = self.streams[key] = StreamState()
        return found

    # -- checkpoint form ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "processed": self.processed,
            "streams": [
                [*key, s.max_seq, s.holes, sorted(s.held), sorted(s.discarded), sorted(s.dedup_only)]
                for key, s in self.streams.items()
            ],
            "pending": [
                [*key, seq, p.accepted_us, p.broker, p.epoch]
                for key, by_seq in self.pending.items()
                for seq, p in by_seq.items()
            ],
            "clusters": {name: _cluster_to_json(c) for name, c in self.clusters.items()},
            "problems": self.problems,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidatorState:
        state = cls(processed=dict(data["processed"]), problems=list(data["problems"]))
        for cluster, direction, stream, max_seq, holes, held, discarded, dedup_only in data["streams"]:
            state.streams[(cluster, direction, stream)] = StreamState(
                int(max_seq), [list(h) for h in holes], set(held), set(discarded), set(dedup_only)
            )
        for cluster, direction, stream, seq, accepted_us, broker, epoch in data["pending"]:
            state.pending.setdefault((cluster, direction, stream), {})[int(seq)] = Pending(
                int(accepted_us), broker, int(epoch)
            )
        for name, raw in data["clusters"].items():
            state.clusters[name] = _cluster_from_json(raw)
        return state


def _cluster_to_json(c: ClusterState) -> dict[str, Any]:
    return {
        "newest": c.newest_us,
        "counts": dict(c.counts),
        "examples": dict(c.examples),
        "terms": [[b, e, t.start_us, t.deactivated_us, t.last_us] for (b, e), t in c.terms.items()],
        "epochs": [
            [e, s.activations, s.last_effect_us, s.last_effect, s.first_evidence_us, s.last_evidence_us]
            for e, s in c.epochs.items()
        ],
        "latency": {d: {str(b): n for b, n in buckets.items()} for d, buckets in c.latency.items()},
        "worstLagMs": c.worst_lag_ms,
        "worstLag": c.worst_lag,
        "rate": {str(second): n for second, n in c.rate.items()},
    }


def _cluster_from_json(raw: dict[str, Any]) -> ClusterState:
    c = ClusterState(
        newest_us=int(raw["newest"]), worst_lag_ms=float(raw["worstLagMs"]), worst_lag=raw["worstLag"]
    )
    c.counts.update(raw["counts"])
    for anomaly, examples in raw["examples"].items():
        c.examples[anomaly] = list(examples)
    for broker, epoch, start, deactivated, last in raw["terms"]:
        c.terms[(broker, int(epoch))] = TermState(start, deactivated, int(last))
    for epoch, activations, last_effect_us, last_effect, first_ev, last_ev in raw["epochs"]:
        c.epochs[int(epoch)] = EpochState(dict(activations), last_effect_us, last_effect, first_ev, last_ev)
    c.latency = {d: {int(b): int(n) for b, n in buckets.items()} for d, buckets in raw["latency"].items()}
    c.rate = {int(second): int(n) for second, n in raw["rate"].items()}
    return c
