"""Synthetic message-log stores: realistic broker histories with exactly known anomalies.

The validator's tests and ``make bench-validator`` need stores far larger than a real run produces
on one machine (ten million records), with a known verdict. :func:`generate_store` writes one:
per cluster, terms of its brokers (``activated`` / ``deactivated``), epochs rising by one per
failover, and per message in both directions the records a broker writes (``accepted``,
``forwarded`` attempt 1, ``delivered``, ``confirmed``), byte for byte as
:mod:`broker_service.message_log_writer` formats them (schema field order, no spaces), into
``<store>/<cluster>/<broker>/<segment>.jsonl`` named by
:func:`broker_contracts.message_log.segment_name`. It lives in the package, not in ``tests/``,
because ``bench/`` uses it too and must never import tests.

How the history looks, and why:

* Traffic comes in bursts separated by idle time, so a history of any size spans at least
  :data:`MIN_SPAN_SECONDS` (older than the settle horizon, where ``lost`` is judged) while each
  burst is short. A burst is a pipeline of bundles per direction: at each tick the broker logs
  ``accepted`` for bundle *k*, ``forwarded`` for *k-1*, ``delivered`` for *k-2* and ``confirmed``
  for *k-3*, one timestamp per logged bundle (a broker writes a bundle's records in one call),
  ticks milliseconds apart; every broker's file is in time order. A bundle carries
  :data:`PER_STREAM` consecutive seqs of each of up to 25 streams (bench-broker's shape).
* A planned failover drains the pipeline, logs ``deactivated``, and the next broker logs
  ``activated`` with the next epoch. A crash stops a burst in the middle without
  ``deactivated``: the bundle the broker had forwarded (the target took it, the ``delivered``
  record never made it to the log) and the unconfirmed ones are resent to the next active, which
  accepts them again; the target answers ``duplicate`` for what it already had, logged as
  ``deduplicated``, and takes the rest. So a clean store has ``crashed-term`` and
  ``deduplicated`` findings (both not violations) and no violation at all. ``deduplicated`` counts
  messages as the README defines it: a ``deduplicated`` record and no ``delivered`` record; the
  resent messages whose ``delivered`` record did reach the log are not counted.
* The history ends drained: nothing is in flight unless injected.

``inject`` adds exact numbers of anomalies, each instance producing one finding of its class and
nothing else, on distinct streams where there are enough, away from crashes (see
:data:`INJECTABLE` and :class:`InjectedAnomaly`). The returned :class:`GeneratedStore` is the
manifest: records, segments, messages per cluster and direction, failovers, the expected count of
every anomaly class (``expected``) and where each injected instance is. Save it beside the store,
never inside (the validator reports any other file in the store as ``foreign-file``).
:func:`extend_store` continues a history (same clusters, brokers and streams, later segments), for
incremental runs.

Speed: lines are built as the broker's writer builds them, a per-bundle ``head``/``tail`` around
cached per-message fragments joined in C, and written in blocks of about a megabyte; ten million
records (2.4 GB) take about 12 s on this project's machine, most of it the kernel writing. What it
deliberately does not model: payloads (the log has none), retries other than a poison message's,
replays of held messages, and clock skew between brokers.

CLI: ``python -m broker_validator.synthetic --store DIR --records N [--inject lost=2 ...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypedDict

from broker_contracts.message_log import Direction, Event, segment_name
from broker_validator.report_schema import Anomaly

PER_STREAM: Final = 4
"""Consecutive seqs of one stream in one bundle (bench-broker's ``per_stream_in_bundle``)."""
MAX_STREAMS_PER_BUNDLE: Final = 25  # bundles of at most 100 messages
MAX_DELIVERIES: Final = 5  # the CRD's delivery.maxDeliveries default: a poison message is held after 5
SLOTS_PER_BURST: Final = 200  # stream runs per direction in one burst: ~800 messages each way
MIN_SPAN_SECONDS: Final = 1200.0
"""Every part of a history spans at least this long, so ``lost`` instances sit well before the
settle horizon however few records there are."""
MESSAGES_PER_SECOND: Final = 2000.0  # per cluster, both directions; longer histories span longer
DEFAULT_START: Final = datetime(2026, 11, 22, tzinfo=UTC)  # fixed, so a seed gives the same bytes
SEGMENT_RECORDS: Final = 50_000

INJECTABLE: Final = (
    Anomaly.LOST.value,
    Anomaly.DUPLICATE_DELIVERY.value,
    Anomaly.OUT_OF_ORDER.value,
    Anomaly.GAP.value,
    Anomaly.SPLIT_BRAIN.value,
    Anomaly.IN_FLIGHT.value,
    Anomaly.HELD.value,
    Anomaly.DISCARDED.value,
    Anomaly.MALFORMED.value,
)
"""What ``inject`` takes, and what one instance of each writes:

* ``lost``: a message accepted and forwarded, never delivered, long before the end;
* ``duplicate-delivery``: a second ``forwarded`` (attempt 2) and ``delivered`` of a delivered
  message, one tick after the first delivery, same term;
* ``out-of-order``: the first seq of a stream's run in a bundle is delivered one tick after the
  next three (a later tick, so no tie-break by position is needed);
* ``gap``: a seq the source skipped: never accepted, while the seqs around it are delivered;
* ``split-brain``: alternately, the old broker logs a ``confirmed`` after the next epoch's
  ``activated`` (a zombie), or another broker logs ``activated`` and ``deactivated`` for an epoch
  that is already active (one epoch, two brokers; needs two brokers); one instance per epoch;
* ``in-flight``: like ``lost``, in the very last burst (younger than the settle horizon);
* ``held``: forwarded with attempts 1 to 5, then ``held``;
* ``discarded``: forwarded with attempts 1 to 5, then ``discarded``. A broker holds a message
  before an operator discards it; the ``held`` record is left out here so that the instance is one
  finding (inject ``held`` too for both);
* ``malformed``: one extra line in a segment, each in a different segment (the validator counts
  them per segment): alternately a torn record (not JSON) and a record with an unknown event.
"""

_DETAILS: Final = {
    Anomaly.LOST.value: "accepted and forwarded, never delivered",
    Anomaly.DUPLICATE_DELIVERY.value: "delivered again (forwarded attempt 2) one tick after its delivery",
    Anomaly.OUT_OF_ORDER.value: "delivered one tick after the next three seqs of its stream",
    Anomaly.GAP.value: "never accepted: the source skipped this seq",
    Anomaly.IN_FLIGHT.value: "accepted and forwarded in the last burst, not delivered yet",
    Anomaly.HELD.value: f"forwarded {MAX_DELIVERIES} times, then held",
    Anomaly.DISCARDED.value: f"forwarded {MAX_DELIVERIES} times, then discarded (no held record)",
}
_DIRECTIONS: Final = (Direction.OUTBOUND.value, Direction.INBOUND.value)
_STREAM_PREFIX: Final = {Direction.OUTBOUND.value: "orders-", Direction.INBOUND.value: "invoices-"}
_FRAGMENT_SEQ = re.compile(r'^"(?P<stream>[^"]*)","seq":(?P<seq>\d+),')
_UNIX = datetime(1970, 1, 1, tzinfo=UTC)

Group = tuple[str, int | None, list[str]]
"""(event, attempt, message fragments): the records one logging call writes, sharing one ts."""


class ClusterManifest(TypedDict):
    account: str
    company: str
    brokers: list[str]
    failovers: int
    crashes: int
    epoch: int  # the last epoch
    messages: dict[str, int]  # direction -> distinct messages with delivery evidence
    accepted: dict[str, int]  # direction -> distinct messages the source sent (seqs used)


@dataclass
class InjectedAnomaly:
    """Where one injected instance is: enough to find its record in the store or in a report."""

    anomaly: str
    cluster: str
    direction: str | None = None
    stream: str | None = None
    seq: int | None = None
    broker: str | None = None
    epoch: int | None = None
    segment: str | None = None  # malformed: the segment, relative to the store
    detail: str = ""


@dataclass
class GeneratedStore:
    """The manifest of a generated store (cumulative over :func:`extend_store` parts)."""

    root: Path
    records: int  # valid records written, every part
    malformed_lines: int
    segments: int
    bytes: int
    clusters: dict[str, ClusterManifest]
    expected: dict[str, int]  # every Anomaly value -> the count a correct validator reports
    injected: list[InjectedAnomaly]
    settle_seconds: float
    parameters: dict[str, Any]
    parts: int = 1
    part_records: int = 0  # valid records of the last part alone
    seconds: float = 0.0  # generation time of the last part
    first_ts: str = ""
    last_ts: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # where extend_store continues

    @property
    def failovers(self) -> int:
        return sum(c["failovers"] for c in self.clusters.values())

    @property
    def lines(self) -> int:
        return self.records + self.malformed_lines

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "records": self.records,
            "malformedLines": self.malformed_lines,
            "segments": self.segments,
            "bytes": self.bytes,
            "clusters": self.clusters,
            "expected": self.expected,
            "injected": [vars(item) for item in self.injected],
            "settleSeconds": self.settle_seconds,
            "parameters": self.parameters,
            "parts": self.parts,
            "partRecords": self.part_records,
            "seconds": self.seconds,
            "firstTs": self.first_ts,
            "lastTs": self.last_ts,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GeneratedStore:
        return cls(
            root=Path(data["root"]),
            records=data["records"],
            malformed_lines=data["malformedLines"],
            segments=data["segments"],
            bytes=data["bytes"],
            clusters=data["clusters"],
            expected=data["expected"],
            injected=[InjectedAnomaly(**item) for item in data["injected"]],
            settle_seconds=data["settleSeconds"],
            parameters=data["parameters"],
            parts=data["parts"],
            part_records=data["partRecords"],
            seconds=data["seconds"],
            first_ts=data["firstTs"],
            last_ts=data["lastTs"],
            state=data["state"],
        )

    def save(self, path: Path) -> None:
        """Write the manifest as JSON (atomically); keep it outside the store."""
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: Path) -> GeneratedStore:
        return cls.from_json(json.loads(path.read_text()))


# --- time ---------------------------------------------------------------------------------------


def _micros(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"start {moment!r} has no time zone; message-log times are UTC")
    delta = moment.astimezone(UTC) - _UNIX
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _moment(micros: int) -> datetime:
    return _UNIX + timedelta(microseconds=micros)


class _Clock:
    """Formats µs-since-epoch ints as the schema's ts, the date part once per second (as
    ``message_log_writer.now_ts`` does)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def text(self, micros: int) -> str:
        second, fraction = divmod(micros, 1_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{fraction:06d}Z"


# --- writing ------------------------------------------------------------------------------------


class _SegmentWriter:
    """One broker's segments: records go into a block, blocks into the open file; a segment is
    closed after ``segment_records`` records (only between bundles) and at the end of a term."""

    def __init__(self, store: _StoreWriter, cluster: str, broker: str, account: str, company: str) -> None:
        self.store = store
        self.broker = broker
        self.directory = store.root / cluster / broker
        self.static = f'"cluster":"{cluster}","broker":"{broker}",'
        self.pair = f'"account":"{account}","company":"{company}",'
        self.index = 0
        self.file: Any = None
        self.path: Path | None = None
        self.parts: list[str] = []
        self.segment_records = 0

    def _open(self, micros: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / segment_name(self.broker, _moment(micros), self.index)
        self.index += 1
        self.file = open(self.path, "wb")  # noqa: SIM115  # closed in close(), spans many calls
        self.segment_records = 0

    def messages(
        self, event: str, micros: int, epoch: int, direction: str, *, attempt: int | None, frags: list[str]
    ) -> None:
        if not frags:
            return
        if self.file is None:
            self._open(micros)
        head = (
            f'{{"event":"{event}","ts":"{self.store.clock.text(micros)}",{self.static}"epoch":{epoch},'
            f'"direction":"{direction}",{self.pair}"stream":'
        )
        tail = ',"attempt":null}\n' if attempt is None else f',"attempt":{attempt}}}\n'
        self.parts.append(head + (tail + head).join(frags) + tail)
        self.segment_records += len(frags)
        self.store.records += len(frags)
        if len(self.parts) >= 64:
            self.flush()

    def lifecycle(self, event: str, micros: int, epoch: int) -> None:
        if self.file is None:
            self._open(micros)
        self.parts.append(
            f'{{"event":"{event}","ts":"{self.store.clock.text(micros)}",{self.static}"epoch":{epoch},'
            f'"direction":null,{self.pair}"stream":null,"seq":null,"msgId":null,"attempt":null}}\n'
        )
        self.segment_records += 1
        self.store.records += 1

    def flush(self) -> None:
        if self.parts:
            blob = "".join(self.parts).encode()
            self.parts.clear()
            self.file.write(blob)
            self.store.bytes += len(blob)

    def close_if_full(self) -> None:
        if self.segment_records >= self.store.segment_records:
            self.close()

    def close(self) -> None:
        if self.file is None:
            return
        self.flush()
        self.file.close()
        self.file = None
        assert self.path is not None
        self.store.segments.append(self.path)
        self.path = None


@dataclass
class _StoreWriter:
    root: Path
    segment_records: int
    clock: _Clock = field(default_factory=_Clock)
    records: int = 0
    bytes: int = 0
    segments: list[Path] = field(default_factory=list)


# --- the plan -----------------------------------------------------------------------------------


@dataclass
class _BatchPlan:
    streams: int  # how many streams' runs the bundle carries
    cursor: int  # index of its first stream
    marks: list[tuple[str, int, int]] = field(default_factory=list)  # (anomaly, stream slot, instance)


@dataclass
class _Batch:
    """A built bundle: per pipeline stage (accepted, forwarded, delivered, confirmed) its groups."""

    stages: tuple[list[Group], list[Group], list[Group], list[Group]]
    fragments: list[str]  # every message it carries, in order: what a crash leaves to resend


@dataclass
class _BurstPlan:
    start: int  # µs
    tick: int  # µs between pipeline ticks
    batches: tuple[list[_BatchPlan], list[_BatchPlan]]  # outbound, inbound
    planned_failover_before: int | None = None  # failover number, when one happens before this burst
    crash: tuple[int, int] | None = None  # (failover number, tick after which the broker dies)


@dataclass
class _ClusterPlan:
    name: str
    account: str
    company: str
    brokers: list[str]
    bursts: list[_BurstPlan]
    failovers: int
    crashes: int


@dataclass
class _ClusterState:
    """What a later part continues from."""

    epoch: int = 0
    active: int = 0
    now: int = 0
    next_seq: list[list[int]] = field(default_factory=list)  # per direction, per stream
    cursor: list[int] = field(default_factory=lambda: [0, 0])
    segment_index: list[int] = field(default_factory=list)  # per broker
    messages: list[int] = field(default_factory=lambda: [0, 0])
    accepted: list[int] = field(default_factory=lambda: [0, 0])
    failovers: int = 0
    crashes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """``total`` as ``parts`` positive ints, each within ±25 % of the mean where possible."""
    if parts <= 0:
        return []
    weights = [rng.uniform(0.75, 1.25) for _ in range(parts)]
    scale = (total - parts) / sum(weights)
    sizes = [1 + int(w * scale) for w in weights]
    for index in range(total - sum(sizes)):
        sizes[index % parts] += 1
    return sizes


def _batches(slots: int, streams: int, cursor: int, rng: random.Random) -> tuple[list[_BatchPlan], int]:
    """A burst's stream runs cut into bundles of at most 25 streams, at least three bundles when
    there are enough runs (the pipeline then has something in every stage)."""
    widest = max(1, min(MAX_STREAMS_PER_BUNDLE, streams, slots // 3))
    plans: list[_BatchPlan] = []
    while slots > 0:
        count = min(slots, rng.randint(max(1, widest // 3), widest))
        plans.append(_BatchPlan(count, cursor))
        cursor = (cursor + count) % streams
        slots -= count
    return plans, cursor


def _plan_cluster(
    name: str,
    account: str,
    company: str,
    brokers: list[str],
    state: _ClusterState,
    *,
    records: int,
    streams: int,
    failovers: int,
    crashes: int,
    rng: random.Random,
) -> _ClusterPlan:
    messages = max(PER_STREAM, records // 4 // 2)  # four records a message, two directions
    slots = max(1, messages // PER_STREAM)
    minimum = 3 * (failovers + 1) + 2
    if slots < minimum:
        raise ValueError(
            f"{records} records per cluster are too few for {failovers} failovers: each direction needs "
            f"at least {minimum} runs of {PER_STREAM} messages ({minimum * PER_STREAM * 8} records)"
        )
    count = max(minimum, math.ceil(slots / SLOTS_PER_BURST))
    span = max(MIN_SPAN_SECONDS, 2 * messages / MESSAGES_PER_SECOND) * 1e6
    spacing = span / count
    begin = state.now + int(min(spacing, 5e6))
    sizes = (_split(slots, count, rng), _split(slots, count, rng))
    bursts: list[_BurstPlan] = []
    for index in range(count):
        outbound, state.cursor[0] = _batches(sizes[0][index], streams, state.cursor[0], rng)
        inbound, state.cursor[1] = _batches(sizes[1][index], streams, state.cursor[1], rng)
        bursts.append(
            _BurstPlan(
                start=begin + int(index * spacing + rng.uniform(0, spacing / 4)),
                tick=rng.randint(1_000, 5_000),
                batches=(outbound, inbound),
            )
        )
    # Failover i (1-based) starts term i at burst boundaries[i-1], terms about equally long; a crash
    # happens in the burst before that boundary, which the next term finishes.
    boundaries = [round(i * count / (failovers + 1)) for i in range(1, failovers + 1)]
    crashed = set(rng.sample(range(1, failovers + 1), crashes))
    for number, boundary in enumerate(boundaries, start=1):
        if number in crashed:
            burst = bursts[boundary - 1]
            ticks = max(len(burst.batches[0]), len(burst.batches[1]))
            burst.crash = (number, rng.randint(min(2, ticks - 1), ticks - 1))
        else:
            bursts[boundary].planned_failover_before = number
    return _ClusterPlan(name, account, company, brokers, bursts, failovers, crashes)


# --- injection ----------------------------------------------------------------------------------


@dataclass
class _Injections:
    """Injected instances in generation order; marks on bundles point into ``items``."""

    items: list[InjectedAnomaly] = field(default_factory=list)
    zombies: dict[tuple[str, int], int] = field(default_factory=dict)  # (cluster, failover no.) -> item
    second_activations: dict[tuple[str, int], int] = field(default_factory=dict)  # (cluster, epoch) -> item


_MESSAGE_KINDS: Final = (
    Anomaly.LOST.value,
    Anomaly.DUPLICATE_DELIVERY.value,
    Anomaly.OUT_OF_ORDER.value,
    Anomaly.GAP.value,
    Anomaly.IN_FLIGHT.value,
    Anomaly.HELD.value,
    Anomaly.DISCARDED.value,
)


def _place_injections(
    plans: list[_ClusterPlan],
    inject: Mapping[str, int],
    *,
    streams: int,
    settle_seconds: float,
    epochs: list[int],
    rng: random.Random,
) -> _Injections:
    """Choose where each instance goes; ``epochs[c]`` is cluster c's epoch before this part (0: none)."""
    unknown = set(inject) - set(INJECTABLE)
    if unknown:
        raise ValueError(f"cannot inject {sorted(unknown)}; injectable classes are {list(INJECTABLE)}")
    negative = {kind: n for kind, n in inject.items() if n < 0}
    if negative:
        raise ValueError(f"injection counts must not be negative: {negative}")
    found = _Injections()
    used_streams: set[tuple[int, int, int]] = set()  # (cluster, direction, stream)
    used_slots: set[tuple[int, int, int, int, int]] = set()  # (cluster, direction, burst, bundle, run)
    for kind in _MESSAGE_KINDS:
        wanted = inject.get(kind, 0)
        candidates = _candidates(plans, kind, settle_seconds) if wanted else []
        for _ in range(wanted):
            _place_message(
                found,
                plans,
                kind,
                candidates,
                streams=streams,
                used_streams=used_streams,
                used_slots=used_slots,
                rng=rng,
            )
    _place_split_brain(found, plans, inject.get(Anomaly.SPLIT_BRAIN.value, 0), epochs, rng)
    return found


def _candidates(plans: list[_ClusterPlan], kind: str, settle_seconds: float) -> list[tuple[int, int]]:
    """(cluster, burst) pairs that can take an instance of ``kind``: never a crashed burst (its
    resend would mix with the instance); in-flight in the last burst, everything else well before
    the settle horizon, with room for the drift failovers add to the clock."""
    candidates: list[tuple[int, int]] = []
    for c, plan in enumerate(plans):
        last = len(plan.bursts) - 1
        if kind == Anomaly.IN_FLIGHT.value:
            candidates.append((c, last))
            continue
        latest = plan.bursts[last].start - int((settle_seconds + 120 + 5 * plan.failovers) * 1e6)
        candidates += [
            (c, b)
            for b, burst in enumerate(plan.bursts[:last])
            if burst.crash is None and burst.start < latest
        ]
    if not candidates:
        raise ValueError(f"no burst can take a {kind!r} instance: the history is too short or too crowded")
    return candidates


def _place_message(
    found: _Injections,
    plans: list[_ClusterPlan],
    kind: str,
    candidates: list[tuple[int, int]],
    *,
    streams: int,
    used_streams: set[tuple[int, int, int]],
    used_slots: set[tuple[int, int, int, int, int]],
    rng: random.Random,
) -> None:
    """Mark one stream run of one bundle; a stream no other instance uses, while there are such."""
    for attempt in range(2000):
        c, b = rng.choice(candidates)
        d = rng.randrange(2)
        batches = plans[c].bursts[b].batches[d]
        if not batches:
            continue
        i = rng.randrange(len(batches))
        slot = rng.randrange(batches[i].streams)
        stream = (batches[i].cursor + slot) % streams
        if (c, d, b, i, slot) in used_slots or (attempt < 1000 and (c, d, stream) in used_streams):
            continue
        used_slots.add((c, d, b, i, slot))
        used_streams.add((c, d, stream))
        batches[i].marks.append((kind, slot, len(found.items)))
        found.items.append(InjectedAnomaly(kind, plans[c].name, _DIRECTIONS[d], detail=_DETAILS[kind]))
        return
    raise ValueError(f"could not place every {kind!r} instance: too few messages")


def _place_split_brain(
    found: _Injections, plans: list[_ClusterPlan], wanted: int, epochs: list[int], rng: random.Random
) -> None:
    """Zombie records (after failover n of this part, which ends epoch base + n - 1) and second
    activations, alternately, each on an epoch of its own: a zombie of epoch e and a second
    activation of e would both be findings of epoch e. Second activations take the top epoch
    first, which no zombie can use, so every epoch can carry one instance."""
    if not wanted:
        return
    zombies = [
        (c, number, max(epochs[c], 1) + number - 1)
        for c, plan in enumerate(plans)
        for number in range(1, plan.failovers + 1)
    ]
    rng.shuffle(zombies)
    doubles: list[tuple[int, int]] = []
    for c, plan in enumerate(plans):
        if len(plan.brokers) > 1:
            top = max(epochs[c], 1) + plan.failovers
            others = list(range(epochs[c] + 1, top))
            rng.shuffle(others)
            doubles += [(c, top), *((c, epoch) for epoch in others)]
    taken: set[tuple[int, int]] = set()
    for index in range(wanted):
        zombie = next(((c, n, e) for c, n, e in zombies if (c, e) not in taken), None)
        double = next(((c, e) for c, e in doubles if (c, e) not in taken), None)
        if zombie is not None and (double is None or index % 2 == 0):
            c, number, epoch = zombie
            found.zombies[(plans[c].name, number)] = len(found.items)
        elif double is not None:
            c, epoch = double
            found.second_activations[(plans[c].name, epoch)] = len(found.items)
        else:
            raise ValueError(
                f"cannot inject {wanted} split-brain instances: at most one per epoch (a zombie record "
                f"after a failover, or a second activation with two or more brokers); room for {index}"
            )
        taken.add((c, epoch))
        found.items.append(InjectedAnomaly(Anomaly.SPLIT_BRAIN.value, plans[c].name))


# --- generation ---------------------------------------------------------------------------------


class _ClusterGenerator:
    """Writes one cluster's part of the history from its plan."""

    def __init__(
        self,
        store: _StoreWriter,
        plan: _ClusterPlan,
        state: _ClusterState,
        *,
        injections: _Injections,
        expected: dict[str, int],
        streams: int,
        rng: random.Random,
    ) -> None:
        self.store = store
        self.plan = plan
        self.state = state
        self.injections = injections
        self.expected = expected
        self.rng = rng
        self.writers = [
            _SegmentWriter(store, plan.name, broker, plan.account, plan.company) for broker in plan.brokers
        ]
        for writer, index in zip(self.writers, state.segment_index, strict=True):
            writer.index = index
        self.names = [[f"{_STREAM_PREFIX[d]}{i:04d}" for i in range(streams)] for d in _DIRECTIONS]
        self.prefixes = [
            [(f'"{name}","seq":', f',"msgId":"{name}-') for name in names] for names in self.names
        ]
        self.last_confirmed: list[str] = ["", ""]  # per direction: a zombie record's message

    # -- lifecycle --

    @property
    def writer(self) -> _SegmentWriter:
        return self.writers[self.state.active]

    def activate(self, micros: int) -> None:
        """The next broker (another one where there is one) activates with the next epoch."""
        state = self.state
        brokers = len(self.writers)
        if state.epoch > 0 and brokers > 1:
            state.active = (state.active + self.rng.randrange(1, brokers)) % brokers
        state.epoch += 1
        state.now = micros
        self.writer.lifecycle(Event.ACTIVATED.value, micros, state.epoch)
        item = self.injections.second_activations.get((self.plan.name, state.epoch))
        if item is not None:  # another broker claims the same epoch and gives it up again
            other = self.writers[(state.active + 1) % brokers]
            other.lifecycle(Event.ACTIVATED.value, micros + 1_000, state.epoch)
            other.lifecycle(Event.DEACTIVATED.value, micros + 2_000, state.epoch)
            other.close()
            self._located(item, broker=other.broker, epoch=state.epoch, detail="a second activated record")
        state.now = micros + 3_000

    def fail_over(self, number: int, *, crashed: bool) -> None:
        state, writer = self.state, self.writer
        if not crashed:
            state.now += self.rng.randint(1_000, 5_000)
            writer.lifecycle(Event.DEACTIVATED.value, state.now, state.epoch)
        # Kill detection takes a heartbeat or two; a planned move is a drain and one call.
        delay = self.rng.randint(400_000, 1_500_000) if crashed else self.rng.randint(50_000, 150_000)
        activated_at = state.now + delay
        item = self.injections.zombies.get((self.plan.name, number))
        if item is not None:
            d = 0 if self.last_confirmed[0] else 1
            fragment = self.last_confirmed[d]
            writer.messages(
                Event.CONFIRMED.value,
                activated_at + 5_000,
                state.epoch,
                _DIRECTIONS[d],
                attempt=None,
                frags=[fragment],
            )
            match = _FRAGMENT_SEQ.match(fragment)
            assert match is not None
            self._located(
                item,
                direction=_DIRECTIONS[d],
                stream=match["stream"],
                seq=int(match["seq"]),
                broker=writer.broker,
                epoch=state.epoch,
                detail="a confirmed record after the next epoch was activated",
            )
        writer.close()
        state.failovers += 1
        if crashed:
            state.crashes += 1
            self.expected[Anomaly.CRASHED_TERM.value] += 1
        self.activate(activated_at)

    def _located(self, item: int, **where: Any) -> None:
        for key, value in where.items():
            setattr(self.injections.items[item], key, value)

    # -- bundles --

    def build(self, d: int, plan: _BatchPlan, tick: int, extras: dict[int, list[Group]]) -> _Batch:
        """The bundle's fragments (advancing each stream's seq), with its injected changes."""
        names, prefixes, next_seq = self.names[d], self.prefixes[d], self.state.next_seq[d]
        count = len(names)
        fragments: list[str] = []
        for j in range(plan.streams):
            s = (plan.cursor + j) % count
            first = next_seq[s]
            next_seq[s] = first + PER_STREAM
            before, after = prefixes[s]
            fragments += [f'{before}{q}{after}{q}"' for q in range(first, first + PER_STREAM)]
        self.state.accepted[d] += len(fragments)
        self.state.messages[d] += len(fragments)
        accepted = forwarded = delivered = confirmed = fragments
        direction = _DIRECTIONS[d]
        for kind, slot, item in plan.marks:
            s = (plan.cursor + slot) % count
            position = 0 if kind == Anomaly.OUT_OF_ORDER.value else 1
            index = slot * PER_STREAM + position
            seq = next_seq[s] - PER_STREAM + position
            fragment = fragments[index]
            later: list[Group] = []
            if kind == Anomaly.GAP.value:
                accepted, forwarded = _without(accepted, fragment), _without(forwarded, fragment)
                self.state.accepted[d] -= 1
            if kind != Anomaly.DUPLICATE_DELIVERY.value:
                delivered, confirmed = _without(delivered, fragment), _without(confirmed, fragment)
                self.state.messages[d] -= 1
            if kind == Anomaly.DUPLICATE_DELIVERY.value:
                later = [(Event.FORWARDED.value, 2, [fragment]), (Event.DELIVERED.value, None, [fragment])]
                extras.setdefault(tick + 3, []).extend(later)
            elif kind == Anomaly.OUT_OF_ORDER.value:
                later = [(Event.DELIVERED.value, None, [fragment]), (Event.CONFIRMED.value, None, [fragment])]
                extras.setdefault(tick + 3, []).extend(later)
                self.state.messages[d] += 1
            elif kind in (Anomaly.HELD.value, Anomaly.DISCARDED.value):
                retries: list[Group] = [
                    (Event.FORWARDED.value, n, [fragment]) for n in range(2, MAX_DELIVERIES + 1)
                ]
                final: Group = (Event.HELD.value, MAX_DELIVERIES, [fragment])
                if kind == Anomaly.DISCARDED.value:
                    final = (Event.DISCARDED.value, None, [fragment])
                extras.setdefault(tick + 2, []).extend([*retries, final])
            self._located(
                item,
                direction=direction,
                stream=names[s],
                seq=seq,
                broker=self.writer.broker,
                epoch=self.state.epoch,
            )
        return _Batch(
            (
                [(Event.ACCEPTED.value, None, accepted)],
                [(Event.FORWARDED.value, 1, forwarded)],
                [(Event.DELIVERED.value, None, delivered)],
                [(Event.CONFIRMED.value, None, confirmed)],
            ),
            fragments,
        )

    def run(
        self,
        burst: _BurstPlan,
        queues: tuple[list[_Batch | _BatchPlan], list[_Batch | _BatchPlan]],
        crash_after: int | None,
    ) -> tuple[list[tuple[int, _Batch]], list[tuple[int, _Batch]]]:
        """Run the pipeline over the bundles of both directions. On a crash, stop after that tick
        and return per direction the bundles still in the pipeline with the stage each reached:
        2 delivered (not confirmed), 1 forwarded (the target took it; its delivered record was
        lost with the broker), 0 accepted."""
        rng, state = self.rng, self.state
        built: tuple[list[_Batch], list[_Batch]] = ([], [])
        extras: tuple[dict[int, list[Group]], dict[int, list[Group]]] = ({}, {})
        ticks = max(len(queues[0]), len(queues[1])) + 3
        start = state.now
        for t in range(ticks):
            state.now = max(state.now, start + t * burst.tick)
            writer = self.writer
            for d in (0, 1):
                queue, done = queues[d], built[d]
                if t < len(queue):
                    item = queue[t]
                    done.append(item if isinstance(item, _Batch) else self.build(d, item, t, extras[d]))
                direction = _DIRECTIONS[d]
                for stage in range(4):
                    k = t - stage
                    if not 0 <= k < len(done):
                        continue
                    for event, attempt, frags in done[k].stages[stage]:
                        if frags:
                            state.now += rng.randint(10, 200)
                            writer.messages(
                                event, state.now, state.epoch, direction, attempt=attempt, frags=frags
                            )
                            if stage == 3:
                                self.last_confirmed[d] = frags[-1]
                for event, attempt, frags in extras[d].pop(t, ()):
                    state.now += rng.randint(10, 200)
                    writer.messages(event, state.now, state.epoch, direction, attempt=attempt, frags=frags)
            writer.close_if_full()
            if crash_after is not None and t == crash_after:
                return (
                    [(t - k, b) for k, b in enumerate(built[0]) if t - k < 3],
                    [(t - k, b) for k, b in enumerate(built[1]) if t - k < 3],
                )
        return [], []

    def resend(self, leftover: list[tuple[int, _Batch]]) -> _Batch:
        """What the next active gets again: every unconfirmed message of the dead term, in order;
        the target answers duplicate for what it took, so those are logged ``deduplicated``."""
        taken: list[str] = []
        fresh: list[str] = []
        for stage, batch in leftover:
            (taken if stage >= 1 else fresh).extend(batch.fragments)
            if stage == 1:  # evidence only from the target's duplicate answer
                self.expected[Anomaly.DEDUPLICATED.value] += len(batch.fragments)
        everything = taken + fresh
        return _Batch(
            (
                [(Event.ACCEPTED.value, None, everything)],
                [(Event.FORWARDED.value, 1, everything)],
                [(Event.DEDUPLICATED.value, None, taken), (Event.DELIVERED.value, None, fresh)],
                [(Event.CONFIRMED.value, None, everything)],
            ),
            everything,
        )

    def generate(self, progress: Callable[[int], None]) -> None:
        state = self.state
        if state.epoch == 0:
            self.activate(self.plan.bursts[0].start - 10_000)
        for burst in self.plan.bursts:
            if burst.planned_failover_before is not None:
                self.fail_over(burst.planned_failover_before, crashed=False)
            state.now = max(state.now, burst.start)
            queues: tuple[list[_Batch | _BatchPlan], list[_Batch | _BatchPlan]] = (
                list(burst.batches[0]),
                list(burst.batches[1]),
            )
            if burst.crash is None:
                self.run(burst, queues, None)
            else:
                number, crash_tick = burst.crash
                leftovers = self.run(burst, queues, crash_tick)
                self.fail_over(number, crashed=True)
                state.now += self.rng.randint(5_000, 20_000)  # the resend request and the resend
                requeued: tuple[list[_Batch | _BatchPlan], list[_Batch | _BatchPlan]] = ([], [])
                for d in (0, 1):
                    if leftovers[d]:
                        requeued[d].append(self.resend(leftovers[d]))
                    requeued[d].extend(burst.batches[d][crash_tick + 1 :])
                self.run(burst, requeued, None)
            progress(self.store.records)
        for writer in self.writers:
            writer.close()
        state.segment_index = [writer.index for writer in self.writers]


def _without(fragments: list[str], fragment: str) -> list[str]:
    return [f for f in fragments if f is not fragment]


# --- the public surface -------------------------------------------------------------------------


def generate_store(
    root: Path,
    *,
    records: int,
    streams: int = 200,
    brokers: int = 3,
    failovers: int = 6,
    crashes: int = 2,
    clusters: int = 1,
    inject: Mapping[str, int] | None = None,
    seed: int = 0,
    start: datetime | None = None,
    segment_records: int = SEGMENT_RECORDS,
    settle_seconds: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
) -> GeneratedStore:
    """Write a store of about ``records`` records under ``root`` and return its manifest.

    Per cluster (named ``bc-000``, ``bc-001``, ...): ``brokers`` brokers, ``failovers`` failovers
    of which ``crashes`` are crashes, ``streams`` streams in each direction (``orders-NNNN``
    outbound, ``invoices-NNNN`` inbound), messages split evenly between directions. ``inject`` maps
    :data:`INJECTABLE` classes to counts. ``settle_seconds`` only places ``lost`` (older than the
    horizon) and ``in-flight`` (younger) instances for a validator run with that setting.
    ``progress(records_written, records_planned)`` is called now and then. Same arguments, same
    bytes.
    """
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"store {root} is not empty; generate into a new directory (or use extend_store)")
    if not 0 <= crashes <= failovers:
        raise ValueError(f"crashes ({crashes}) must be between 0 and failovers ({failovers})")
    if min(records, streams, brokers, clusters, segment_records) < 1:
        raise ValueError("records, streams, brokers, clusters and segment_records must be at least 1")
    parameters: dict[str, Any] = {
        "records": records,
        "streams": streams,
        "brokers": brokers,
        "failovers": failovers,
        "crashes": crashes,
        "clusters": clusters,
        "inject": dict(inject or {}),
        "seed": seed,
        "start": (start or DEFAULT_START).isoformat(),
        "segmentRecords": segment_records,
        "settleSeconds": settle_seconds,
    }
    names = [f"bc-{index:03d}" for index in range(clusters)]
    states = {
        name: _ClusterState(
            now=_micros(start or DEFAULT_START),
            next_seq=[[1] * streams, [1] * streams],
            segment_index=[0] * brokers,
        )
        for name in names
    }
    identity = {name: ("acme", str(1000 + index)) for index, name in enumerate(names)}
    previous = GeneratedStore(
        root=root,
        records=0,
        malformed_lines=0,
        segments=0,
        bytes=0,
        clusters={},
        expected={anomaly.value: 0 for anomaly in Anomaly},
        injected=[],
        settle_seconds=settle_seconds,
        parameters={},
        parts=0,
    )
    return _write_part(
        root,
        previous,
        states,
        identity,
        brokers=brokers,
        streams=streams,
        records=records,
        failovers=failovers,
        crashes=crashes,
        inject=inject or {},
        seed=seed,
        segment_records=segment_records,
        parameters=parameters,
        progress=progress,
    )


def extend_store(
    root: Path,
    previous: GeneratedStore,
    *,
    records: int,
    failovers: int = 1,
    crashes: int = 0,
    inject: Mapping[str, int] | None = None,
    seed: int = 1,
    segment_records: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GeneratedStore:
    """Continue ``previous``'s history with about ``records`` more records, as new segments under
    ``root`` (``previous.root`` to grow the store in place, or another directory whose segments
    are later moved or linked into it): same clusters, brokers and streams, seqs and epochs go on,
    times after the previous part's end. Returns the cumulative manifest. Earlier ``in-flight``
    instances become ``lost``, since the new part is longer than the settle horizon."""
    if not previous.state:
        raise ValueError("the previous manifest has no continuation state")
    if not 0 <= crashes <= failovers:
        raise ValueError(f"crashes ({crashes}) must be between 0 and failovers ({failovers})")
    base = previous.parameters
    clusters = previous.state["clusters"]
    states: dict[str, _ClusterState] = {}
    identity: dict[str, tuple[str, str]] = {}
    for name, saved in clusters.items():
        fields = {key: value for key, value in saved.items() if key not in ("account", "company")}
        states[name] = _ClusterState(**fields)
        identity[name] = (saved["account"], saved["company"])
    parameters = dict(base)
    parameters.setdefault("parts", [])
    parameters["parts"] = [
        *parameters["parts"],
        {
            "records": records,
            "failovers": failovers,
            "crashes": crashes,
            "inject": dict(inject or {}),
            "seed": seed,
        },
    ]
    return _write_part(
        root,
        previous,
        states,
        identity,
        brokers=base["brokers"],
        streams=base["streams"],
        records=records,
        failovers=failovers,
        crashes=crashes,
        inject=inject or {},
        seed=seed,
        segment_records=segment_records or base["segmentRecords"],
        parameters=parameters,
        progress=progress,
    )


def _write_part(
    root: Path,
    previous: GeneratedStore,
    states: dict[str, _ClusterState],
    identity: dict[str, tuple[str, str]],
    *,
    brokers: int,
    streams: int,
    records: int,
    failovers: int,
    crashes: int,
    inject: Mapping[str, int],
    seed: int,
    segment_records: int,
    parameters: dict[str, Any],
    progress: Callable[[int, int], None] | None,
) -> GeneratedStore:
    began = time.monotonic()
    rng = random.Random(seed)
    settle = previous.settle_seconds
    names = list(states)
    per_cluster = max(1, records // len(names))
    plans = [
        _plan_cluster(
            name,
            *identity[name],
            [f"{name}-{index}" for index in range(brokers)],
            states[name],
            records=per_cluster,
            streams=streams,
            failovers=failovers,
            crashes=crashes,
            rng=rng,
        )
        for name in names
    ]
    injections = _place_injections(
        plans,
        inject,
        streams=streams,
        settle_seconds=settle,
        epochs=[states[name].epoch for name in names],
        rng=rng,
    )
    expected = dict(previous.expected)
    earlier = [dataclasses.replace(item) for item in previous.injected]
    if previous.parts:  # what was in flight at the end of the last part is lost now
        expected[Anomaly.LOST.value] += expected[Anomaly.IN_FLIGHT.value]
        expected[Anomaly.IN_FLIGHT.value] = 0
        for item in earlier:
            if item.anomaly == Anomaly.IN_FLIGHT.value:
                item.anomaly = Anomaly.LOST.value
                item.detail = (item.detail + "; " if item.detail else "") + "in flight when injected"
    for kind, count in inject.items():
        expected[kind] += count
    writer = _StoreWriter(root, segment_records)
    root.mkdir(parents=True, exist_ok=True)
    planned = per_cluster * len(names)
    for plan in plans:
        generator = _ClusterGenerator(
            writer,
            plan,
            states[plan.name],
            injections=injections,
            expected=expected,
            streams=streams,
            rng=random.Random(rng.random()),
        )
        generator.generate(lambda written: progress(written, planned) if progress else None)
    malformed = _inject_malformed(writer.segments, inject.get(Anomaly.MALFORMED.value, 0), rng, root)
    injections.items += malformed
    cluster_manifests: dict[str, ClusterManifest] = {}
    for plan in plans:
        state = states[plan.name]
        cluster_manifests[plan.name] = ClusterManifest(
            account=plan.account,
            company=plan.company,
            brokers=plan.brokers,
            failovers=state.failovers,
            crashes=state.crashes,
            epoch=state.epoch,
            messages=dict(zip(_DIRECTIONS, state.messages, strict=True)),
            accepted=dict(zip(_DIRECTIONS, state.accepted, strict=True)),
        )
    clock = _Clock()
    first_ts = previous.first_ts or clock.text(min(plan.bursts[0].start for plan in plans) - 10_000)
    return GeneratedStore(
        root=root,
        records=previous.records + writer.records,
        malformed_lines=previous.malformed_lines + len(malformed),
        segments=previous.segments + len(writer.segments),
        bytes=previous.bytes + sum(path.stat().st_size for path in writer.segments),
        clusters=cluster_manifests,
        expected=expected,
        injected=[*earlier, *injections.items],
        settle_seconds=settle,
        parameters=parameters,
        parts=previous.parts + 1,
        part_records=writer.records,
        seconds=round(time.monotonic() - began, 3),
        first_ts=first_ts,
        last_ts=clock.text(max(state.now for state in states.values())),
        state={
            "clusters": {
                name: {**state.to_json(), "account": identity[name][0], "company": identity[name][1]}
                for name, state in states.items()
            }
        },
    )


def _inject_malformed(
    segments: Sequence[Path], count: int, rng: random.Random, root: Path
) -> list[InjectedAnomaly]:
    """One bad line each in ``count`` different segments, at a random line boundary."""
    if count > len(segments):
        raise ValueError(
            f"cannot inject {count} malformed lines: one per segment and only {len(segments)} segments; "
            "lower segment_records"
        )
    items: list[InjectedAnomaly] = []
    newline = b"\n"
    for number, path in enumerate(sorted(rng.sample(list(segments), count))):
        data = path.read_bytes()
        lines = data.count(b"\n")
        cut = 0
        for _ in range(rng.randrange(lines + 1)):
            cut = data.index(b"\n", cut) + 1
        model = data[cut : data.index(b"\n", cut)] if cut < len(data) else data[: data.index(b"\n")]
        if number % 2 == 0:  # a torn record, as a kill -9 mid-write leaves it
            bad = model[: rng.randrange(10, len(model) - 10)]
            detail = "a torn record (not JSON)"
        else:
            bad = re.sub(rb'^\{"event":"[a-z]+"', b'{"event":"exploded"', model)
            detail = "a record with an unknown event"
        path.write_bytes(data[:cut] + bad + b"\n" + data[cut:])
        cluster, broker = path.relative_to(root).parts[:2]
        items.append(
            InjectedAnomaly(
                Anomaly.MALFORMED.value,
                cluster,
                broker=broker,
                segment=str(path.relative_to(root)),
                detail=f"{detail} after line {data.count(newline, 0, cut)}",
            )
        )
    return items


def _parse_inject(values: Sequence[str]) -> dict[str, int]:
    """``["lost=2", "gap=1"]`` as ``{"lost": 2, "gap": 1}``."""
    found: dict[str, int] = {}
    for value in values:
        name, _, count = value.partition("=")
        if name not in INJECTABLE or not count.isdigit():
            raise argparse.ArgumentTypeError(
                f"--inject {value!r}: want CLASS=COUNT with CLASS one of {INJECTABLE}"
            )
        found[name] = found.get(name, 0) + int(count)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broker_validator.synthetic", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("--store", type=Path, required=True, help="new directory for the store")
    parser.add_argument("--records", type=int, required=True, help="about this many records")
    parser.add_argument("--streams", type=int, default=200, help="streams per cluster and direction")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument(
        "--failovers", type=int, default=None, help="per cluster (default 6; 1 with --extend)"
    )
    parser.add_argument(
        "--crashes",
        type=int,
        default=None,
        help="how many of the failovers are crashes (default 2; 0 with --extend)",
    )
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument(
        "--inject", action="append", default=[], metavar="CLASS=COUNT", help=f"one of {INJECTABLE}"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=datetime.fromisoformat, default=None, help="ISO time with zone")
    parser.add_argument("--segment-records", type=int, default=SEGMENT_RECORDS)
    parser.add_argument("--settle-seconds", type=float, default=60.0)
    parser.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="manifest JSON (default: <store>.manifest.json beside the store)",
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="continue the store's history from its manifest instead of a new store",
    )
    args = parser.parse_args(argv)
    try:
        inject = _parse_inject(args.inject)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    manifest_path = args.manifest or args.store.with_name(args.store.name + ".manifest.json")

    shown = [-1]

    def show(written: int, planned: int) -> None:
        percent = min(100, 100 * written // max(planned, 1))
        if percent != shown[0]:
            shown[0] = percent
            print(f"\rgenerating: {percent:3d}% {written:,} records", end="", file=sys.stderr)

    try:
        if args.extend:
            store = extend_store(
                args.store,
                GeneratedStore.load(manifest_path),
                records=args.records,
                failovers=1 if args.failovers is None else args.failovers,
                crashes=0 if args.crashes is None else args.crashes,
                inject=inject,
                seed=args.seed,
                progress=show,
            )
        else:
            store = generate_store(
                args.store,
                records=args.records,
                streams=args.streams,
                brokers=args.brokers,
                failovers=6 if args.failovers is None else args.failovers,
                crashes=min(2, 6 if args.failovers is None else args.failovers)
                if args.crashes is None
                else args.crashes,
                clusters=args.clusters,
                inject=inject,
                seed=args.seed,
                start=args.start,
                segment_records=args.segment_records,
                settle_seconds=args.settle_seconds,
                progress=show,
            )
    except ValueError as error:
        print(f"\nsynthetic: {error}", file=sys.stderr)
        return 2
    print(file=sys.stderr)
    store.save(manifest_path)
    expected = {name: count for name, count in store.expected.items() if count}
    print(
        f"wrote {store.part_records:,} records ({store.bytes / 1e6:.0f} MB in {store.segments} segments, "
        f"{store.malformed_lines} malformed lines) in {store.seconds:.1f} s; "
        f"store now {store.records:,} records"
    )
    print(f"expected anomalies: {json.dumps(expected)}")
    print(f"manifest: {manifest_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
