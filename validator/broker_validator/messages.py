"""Per-message judgement, vectorised: which messages the fold must see, and their latency.

A message is ``(cluster, direction, stream, seq)``. Its rows here carry the batch's first
acceptance, first delivery evidence (each with who logged it) and its number of ``delivered``
records. The same :func:`judge` runs in a Spark task over the messages that live in one segment
only, and on the driver over the few that span segments (joined first by :func:`join`), so both
follow one rule.

What the fold must see (:class:`Message` rows): a message accepted and not evidenced (pending),
one pending from an earlier run, one delivered twice or delivered again after an earlier run's
evidence, and one evidenced only by ``deduplicated``. Everything else only adds to the latency
histogram: accepted-to-first-evidence, for a message whose first evidence is new (above the
carried highest seq, or pending from an earlier run), in buckets that grow by 5 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Final, NamedTuple

import numpy as np

StreamKey = tuple[str, str, str]
LATENCY_BUCKET_BASE: Final = 1.05
"""Latency histogram buckets grow by 5 %: percentiles merge across runs within that precision."""
_BUCKET_OFFSET: Final = 2048  # buckets run from -95 (0.01 ms) to below 1,000 for any int64 lag
_BUCKET_WIDTH: Final = 4096


class Stamp(NamedTuple):
    ts_us: int
    broker: str | None
    epoch: int | None


class Message(NamedTuple):
    cluster: str
    direction: str
    stream: str
    seq: int
    delivered: int
    pending_us: int | None
    lag_ms: float | None
    acc: Stamp | None  # the first acceptance in this batch
    ev: Stamp | None  # the first delivery evidence in this batch


class LatencyBucket(NamedTuple):
    cluster: str
    direction: str
    bucket: int
    n: int
    worst_ms: float


@dataclass
class MessageRows:
    """Messages as columns, sorted by (key, seq); ``key`` indexes ``keys``, brokers index ``brokers``."""

    keys: list[StreamKey]
    key: np.ndarray
    seq: np.ndarray
    brokers: list[str]
    has_acc: np.ndarray
    acc_us: np.ndarray
    acc_pos: np.ndarray  # position in the batch (segment, line): breaks ties of time
    acc_broker: np.ndarray
    acc_epoch: np.ndarray
    has_ev: np.ndarray
    ev_us: np.ndarray
    ev_pos: np.ndarray
    ev_broker: np.ndarray
    ev_epoch: np.ndarray
    delivered: np.ndarray

    def __len__(self) -> int:
        return len(self.key)

    def take(self, mask: np.ndarray) -> MessageRows:
        columns = {
            f.name: getattr(self, f.name)[mask] for f in fields(self) if f.name not in ("keys", "brokers")
        }
        return replace(self, **columns)

    def stamp(self, i: int, ts: np.ndarray, broker: np.ndarray, epoch: np.ndarray) -> Stamp:
        return Stamp(int(ts[i]), self.brokers[broker[i]], int(epoch[i]))


@dataclass
class Judged:
    messages: list[Message] = field(default_factory=list)
    buckets: dict[tuple[str, str, int], tuple[int, float]] = field(default_factory=dict)  # -> (n, worst)
    worst: dict[tuple[str, str], list[Message]] = field(default_factory=dict)  # the slowest, ties kept

    def merge(self, other: Judged) -> None:
        self.messages += other.messages
        for bucket, (n, worst) in other.buckets.items():
            had_n, had_worst = self.buckets.get(bucket, (0, 0.0))
            self.buckets[bucket] = (had_n + n, max(had_worst, worst))
        for where, rows in other.worst.items():
            mine = self.worst.get(where)
            if not mine or rows[0].lag_ms > mine[0].lag_ms:  # type: ignore[operator]
                self.worst[where] = rows
            elif rows[0].lag_ms == mine[0].lag_ms:
                mine += rows

    def latency(self) -> list[LatencyBucket]:
        return [LatencyBucket(c, d, b, n, worst) for (c, d, b), (n, worst) in self.buckets.items()]


def judge(
    rows: MessageRows, carried: dict[StreamKey, int], pending: dict[tuple[str, str, str, int], int]
) -> Judged:
    judged = Judged()
    if not len(rows):
        return judged
    carried_max = np.array([carried.get(key, 0) for key in rows.keys], dtype=np.int64)[rows.key]
    is_pending = np.zeros(len(rows), dtype=bool)
    pending_us = np.zeros(len(rows), dtype=np.int64)
    ids = {key: i for i, key in enumerate(rows.keys)}
    for (cluster, direction, stream, seq), waiting_since in pending.items():
        key_id = ids.get((cluster, direction, stream))
        if key_id is None:
            continue
        lo, hi = np.searchsorted(rows.key, [key_id, key_id + 1])
        at = lo + int(np.searchsorted(rows.seq[lo:hi], seq))
        if at < hi and rows.seq[at] == seq:
            is_pending[at], pending_us[at] = True, waiting_since
    accepted_us = np.where(is_pending, pending_us, rows.acc_us)
    timed = rows.has_ev & (rows.has_acc | is_pending) & ((rows.seq > carried_max) | is_pending)
    lag = np.maximum((rows.ev_us - accepted_us) / 1000.0, 0.0)
    shown = (
        (~rows.has_ev & rows.has_acc)
        | is_pending
        | (rows.delivered >= 2)
        | ((rows.delivered >= 1) & (rows.seq <= carried_max))
        | (rows.has_ev & (rows.delivered == 0))
    )

    def message(i: int) -> Message:
        cluster, direction, stream = rows.keys[rows.key[i]]
        return Message(
            cluster,
            direction,
            stream,
            int(rows.seq[i]),
            int(rows.delivered[i]),
            int(pending_us[i]) if is_pending[i] else None,
            float(lag[i]) if timed[i] else None,
            rows.stamp(i, rows.acc_us, rows.acc_broker, rows.acc_epoch) if rows.has_acc[i] else None,
            rows.stamp(i, rows.ev_us, rows.ev_broker, rows.ev_epoch) if rows.has_ev[i] else None,
        )

    judged.messages = [message(i) for i in np.flatnonzero(shown).tolist()]
    timed_rows = np.flatnonzero(timed)
    if len(timed_rows):
        # (cluster, direction) ids, then one composite per (cluster, direction, bucket).
        pairs = sorted({key[:2] for key in rows.keys})
        pair_of_key = np.array([pairs.index(key[:2]) for key in rows.keys], dtype=np.int64)
        pair = pair_of_key[rows.key[timed_rows]]
        lags = lag[timed_rows]
        bucket = np.floor(np.log(np.maximum(lags, 0.01)) / math.log(LATENCY_BUCKET_BASE)).astype(np.int64)
        composite = pair * _BUCKET_WIDTH + bucket + _BUCKET_OFFSET
        values, inverse, counts = np.unique(composite, return_inverse=True, return_counts=True)
        worst = np.zeros(len(values))
        np.maximum.at(worst, inverse, lags)
        for value, n, slowest in zip(values.tolist(), counts.tolist(), worst.tolist(), strict=True):
            p, b = divmod(value, _BUCKET_WIDTH)
            judged.buckets[(*pairs[p], b - _BUCKET_OFFSET)] = (n, slowest)
        for p, where in enumerate(pairs):
            mine = timed_rows[pair == p]
            if len(mine):
                slowest = lag[mine].max()
                judged.worst[where] = [message(i) for i in mine[lag[mine] == slowest].tolist()]
    return judged


def join(parts: list[MessageRows]) -> MessageRows | None:
    """One row per message from rows of several segments: the earliest acceptance and evidence
    (with who logged them), the ``delivered`` records summed; sorted by (key, seq) again."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return None
    keys = sorted({key for part in parts for key in part.keys})
    brokers = sorted({b for part in parts for b in part.brokers})
    key_ids, broker_ids = {k: i for i, k in enumerate(keys)}, {b: i for i, b in enumerate(brokers)}

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    key = np.concatenate([np.array([key_ids[k] for k in p.keys], dtype=np.int64)[p.key] for p in parts])
    remap = [np.array([broker_ids[b] for b in p.brokers] or [0], dtype=np.int64) for p in parts]
    acc_broker = np.concatenate([r[p.acc_broker] for r, p in zip(remap, parts, strict=True)])
    ev_broker = np.concatenate([r[p.ev_broker] for r, p in zip(remap, parts, strict=True)])
    seq, has_acc, acc_us, acc_pos = cat("seq"), cat("has_acc"), cat("acc_us"), cat("acc_pos")
    has_ev, ev_us, ev_pos = cat("has_ev"), cat("ev_us"), cat("ev_pos")
    # Sort by message, then present-and-earliest first, so the first row of a message has its
    # earliest acceptance; the same again for evidence.
    by_acc = np.lexsort((acc_pos, acc_us, ~has_acc, seq, key))
    by_ev = np.lexsort((ev_pos, ev_us, ~has_ev, seq, key))
    k, s = key[by_acc], seq[by_acc]
    start = np.ones(len(k), dtype=bool)
    start[1:] = (k[1:] != k[:-1]) | (s[1:] != s[:-1])
    starts = np.flatnonzero(start)
    a, e = by_acc[starts], by_ev[starts]  # the same message order in both sorts
    return MessageRows(
        keys=keys,
        key=k[starts],
        seq=s[starts],
        brokers=brokers,
        has_acc=has_acc[a],
        acc_us=acc_us[a],
        acc_pos=acc_pos[a],
        acc_broker=acc_broker[a],
        acc_epoch=cat("acc_epoch")[a],
        has_ev=has_ev[e],
        ev_us=ev_us[e],
        ev_pos=ev_pos[e],
        ev_broker=ev_broker[e],
        ev_epoch=cat("ev_epoch")[e],
        delivered=np.add.reduceat(cat("delivered")[by_acc], starts),
    )


def bucket_upper_ms(bucket: int) -> float:
    """The upper bound of a latency bucket, in milliseconds."""
    return float(LATENCY_BUCKET_BASE ** (bucket + 1))
