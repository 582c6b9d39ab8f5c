"""The plan of one cluster's part of a history: bursts, the bundles in each, failovers and crashes.

Traffic comes in bursts separated by idle time, so a history of any size spans at least
:data:`MIN_SPAN_SECONDS` (older than the settle horizon, where ``lost`` is judged) while each burst
is short. A bundle carries :data:`PER_STREAM` consecutive seqs of each of up to
:data:`MAX_STREAMS_PER_BUNDLE` streams (bench-broker's shape). Failovers fall on burst boundaries,
terms about equally long; a crash stops the burst before its boundary in the middle.

Planning draws every random choice about the shape before any record is written, so that the
placement of injected anomalies can look at the whole part. What it deliberately does not do:
build records or choose where anomalies go (:mod:`.placement` marks the planned bundles).
:class:`ClusterState` is what a later part continues from.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Final

from broker_contracts.message_log import Direction

PER_STREAM: Final = 4
"""Consecutive seqs of one stream in one bundle (bench-broker's ``per_stream_in_bundle``)."""
MAX_STREAMS_PER_BUNDLE: Final = 25  # bundles of at most 100 messages
MAX_DELIVERIES: Final = 5  # the CRD's delivery.maxDeliveries default: a poison message is held after 5
SLOTS_PER_BURST: Final = 200  # stream runs per direction in one burst: ~800 messages each way
MIN_SPAN_SECONDS: Final = 1200.0
"""Every part of a history spans at least this long, so ``lost`` instances sit well before the
settle horizon however few records there are."""
MESSAGES_PER_SECOND: Final = 2000.0  # per cluster, both directions; longer histories span longer
DIRECTIONS: Final = (Direction.OUTBOUND.value, Direction.INBOUND.value)
"""Index 0 and 1 of every per-direction pair in the plan and the state."""


@dataclass
class BatchPlan:
    streams: int  # how many streams' runs the bundle carries
    cursor: int  # index of its first stream
    marks: list[tuple[str, int, int]] = field(default_factory=list)  # (anomaly, stream slot, instance)


@dataclass
class BurstPlan:
    start: int  # µs
    tick: int  # µs between pipeline ticks
    batches: tuple[list[BatchPlan], list[BatchPlan]]  # outbound, inbound
    planned_failover_before: int | None = None  # failover number, when one happens before this burst
    crash: tuple[int, int] | None = None  # (failover number, tick after which the broker dies)


@dataclass
class ClusterPlan:
    name: str
    account: str
    company: str
    brokers: list[str]
    bursts: list[BurstPlan]
    failovers: int
    crashes: int


@dataclass
class ClusterState:
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


def _batches(slots: int, streams: int, cursor: int, rng: random.Random) -> tuple[list[BatchPlan], int]:
    """A burst's stream runs cut into bundles of at most 25 streams, at least three bundles when
    there are enough runs (the pipeline then has something in every stage)."""
    widest = max(1, min(MAX_STREAMS_PER_BUNDLE, streams, slots // 3))
    plans: list[BatchPlan] = []
    while slots > 0:
        count = min(slots, rng.randint(max(1, widest // 3), widest))
        plans.append(BatchPlan(count, cursor))
        cursor = (cursor + count) % streams
        slots -= count
    return plans, cursor


def plan_cluster(
    name: str,
    account: str,
    company: str,
    brokers: list[str],
    state: ClusterState,
    *,
    records: int,
    streams: int,
    failovers: int,
    crashes: int,
    rng: random.Random,
) -> ClusterPlan:
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
    bursts: list[BurstPlan] = []
    for index in range(count):
        outbound, state.cursor[0] = _batches(sizes[0][index], streams, state.cursor[0], rng)
        inbound, state.cursor[1] = _batches(sizes[1][index], streams, state.cursor[1], rng)
        bursts.append(
            BurstPlan(
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
    return ClusterPlan(name, account, company, brokers, bursts, failovers, crashes)
