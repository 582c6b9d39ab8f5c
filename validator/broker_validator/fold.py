"""Folds one batch's collected findings into the carried state: the event findings, in plain Python.

Decisions about a record read the state as it was *before* the batch (``had evidence before``
means: in an earlier run, or earlier in this batch's target order), then the state moves on:
new holes from deliveries that jumped ahead, holes filled, the new ``max_seq``, pending messages,
terms and epochs. No Spark here, so the rules can be read, and tested, on their own.
"""

from __future__ import annotations

from collections import defaultdict

from broker_contracts.message_log import Event
from broker_validator.checks import BatchFindings
from broker_validator.report_schema import Anomaly, Example
from broker_validator.segment_pass import max_known, min_known
from broker_validator.state import EpochState, Pending, StreamKey, TermState, ValidatorState
from broker_validator.timefmt import ts_text

RATE_WINDOW_SECONDS = 6 * 3600
"""Per-second delivery counts are kept for the newest six hours of each cluster's data."""


def example(  # noqa: PLR0917  # the record's fields, in the schema's order
    anomaly: Anomaly | str,
    key: StreamKey | tuple[str, None, None],
    seq: int | None,
    broker: str | None,
    epoch: int | None,
    ts_us: int | None,
    detail: str,
) -> Example:
    return Example(
        anomaly=str(anomaly),
        cluster=key[0],
        direction=key[1],
        stream=key[2],
        seq=seq,
        broker=broker,
        epoch=epoch,
        ts=ts_text(ts_us) if ts_us is not None else None,
        detail=detail,
    )


def fold(state: ValidatorState, findings: BatchFindings) -> None:
    held_in_batch: dict[StreamKey, set[int]] = defaultdict(set)
    for term in findings.terms:
        for side in term.side:
            if side.event == Event.HELD.value:
                held_in_batch[(term.cluster, side.direction, side.stream)].add(side.seq)
    _fold_behind(state, findings, held_in_batch)
    _fold_messages(state, findings)
    _fold_cursors(state, findings)
    _fold_side(state, findings)
    _fold_terms(state, findings)
    _fold_rate_and_latency(state, findings)


def _fold_behind(
    state: ValidatorState, findings: BatchFindings, held_in_batch: dict[StreamKey, set[int]]
) -> None:
    """A `delivered` at or below the highest seq before it: out of order if it is the message's first."""
    for row in findings.behind:
        key: StreamKey = (row.cluster, row.direction, row.stream)
        stream = state.streams.get(key)
        had_before = (stream is not None and stream.has_evidence(row.seq)) or findings.earlier.get(
            (*key, row.seq, row.pos), 0
        ) > 0
        if had_before:
            continue  # a repeat: _fold_messages counts it if the target took it twice
        if (stream is not None and row.seq in stream.held) or row.seq in held_in_batch[key]:
            continue  # a replayed held message comes late by design
        cluster = state.cluster(row.cluster)
        cluster.counts[Anomaly.OUT_OF_ORDER] += 1
        cluster.add_example(
            Anomaly.OUT_OF_ORDER,
            example(
                Anomaly.OUT_OF_ORDER,
                key,
                row.seq,
                row.broker,
                row.epoch,
                row.ts_us,
                f"seq {row.seq} delivered after seq {row.prevmax} of the same stream",
            ),
        )


def _fold_messages(state: ValidatorState, findings: BatchFindings) -> None:
    """Deliveries the target took twice, messages still pending, and pending ones now delivered."""
    for row in findings.messages:
        key: StreamKey = (row.cluster, row.direction, row.stream)
        stream = state.stream(key)
        before = stream.has_evidence(row.seq)
        delivered_before = before and row.seq not in stream.dedup_only
        twice = row.delivered if delivered_before else max(0, row.delivered - 1)
        if twice:
            cluster = state.cluster(row.cluster)
            cluster.counts[Anomaly.DUPLICATE_DELIVERY] += twice
            ev = row.ev
            cluster.add_example(
                Anomaly.DUPLICATE_DELIVERY,
                example(
                    Anomaly.DUPLICATE_DELIVERY,
                    key,
                    row.seq,
                    ev.broker,
                    ev.epoch,
                    ev.ts_us,
                    f"seq {row.seq} delivered to the target {row.delivered + int(delivered_before)} times",
                ),
            )
        if row.delivered:
            stream.dedup_only.discard(row.seq)
        elif row.ev is not None and not before:  # the target's word for a delivery never logged
            stream.dedup_only.add(row.seq)
            state.cluster(row.cluster).add_example(
                Anomaly.DEDUPLICATED,
                example(
                    Anomaly.DEDUPLICATED,
                    key,
                    row.seq,
                    row.ev.broker,
                    row.ev.epoch,
                    row.ev.ts_us,
                    f"the target already had seq {row.seq}, and no broker logged its delivery",
                ),
            )
        if row.ev is None and row.acc is not None and not before:
            waiting = state.pending.setdefault(key, {})
            if row.seq not in waiting:
                waiting[row.seq] = Pending(row.acc.ts_us, row.acc.broker, row.acc.epoch)
        elif row.ev is not None and row.pending_us is not None:
            state.pending.get(key, {}).pop(row.seq, None)


def _fold_cursors(state: ValidatorState, findings: BatchFindings) -> None:
    """Holes opened by deliveries that jumped ahead, holes filled, the new highest seq."""
    for row in findings.jumps:
        stream = state.stream((row.cluster, row.direction, row.stream))
        stream.holes.append([row.prevmax + 1, row.seq - 1, row.ts_us, row.broker, row.epoch, row.seq])
    filled: dict[StreamKey, set[int]] = defaultdict(set)
    for row in findings.filled:
        filled[(row.cluster, row.direction, row.stream)].add(row.seq)
    for key, seqs in filled.items():
        state.stream(key).fill(seqs)
    for row in findings.stream_max:
        stream = state.stream((row.cluster, row.direction, row.stream))
        stream.max_seq = max(stream.max_seq, row.batch_max)
        stream.holes.sort(key=lambda hole: hole[0])


def _fold_side(state: ValidatorState, findings: BatchFindings) -> None:
    for term in findings.terms:
        for row in term.side:
            if row.event == Event.REPLAYED.value:
                continue
            key: StreamKey = (term.cluster, row.direction, row.stream)
            anomaly = Anomaly.HELD if row.event == Event.HELD.value else Anomaly.DISCARDED
            stream = state.stream(key)
            (stream.held if anomaly is Anomaly.HELD else stream.discarded).add(row.seq)
            cluster = state.cluster(term.cluster)
            cluster.counts[anomaly] += 1
            cluster.add_example(
                anomaly,
                example(
                    anomaly, key, row.seq, term.broker, term.epoch, row.ts_us, f"seq {row.seq} {row.event}"
                ),
            )


def _fold_terms(state: ValidatorState, findings: BatchFindings) -> None:
    for row in findings.terms:
        cluster = state.cluster(row.cluster)
        cluster.newest_us = max(cluster.newest_us, row.last)
        term = cluster.terms.setdefault((row.broker, row.epoch), TermState())
        term.start_us = min_known(term.start_us, row.start)
        term.deactivated_us = max_known(term.deactivated_us, row.deactivated)
        term.last_us = max(term.last_us, row.last)
        epoch = cluster.epochs.setdefault(row.epoch, EpochState())
        if row.start is not None:
            epoch.activations[row.broker] = min_known(epoch.activations.get(row.broker), row.start)
        effect = row.effect
        if effect is not None and (epoch.last_effect_us is None or effect.ts_us > epoch.last_effect_us):
            epoch.last_effect_us = effect.ts_us
            epoch.last_effect = example(
                "",
                (row.cluster, effect.direction, effect.stream),
                effect.seq,
                row.broker,
                row.epoch,
                effect.ts_us,
                f"{effect.event} by {row.broker} with epoch {row.epoch}",
            )
        epoch.first_evidence_us = min_known(epoch.first_evidence_us, row.first_evidence)
        epoch.last_evidence_us = max_known(epoch.last_evidence_us, row.last_evidence)


def _fold_rate_and_latency(state: ValidatorState, findings: BatchFindings) -> None:
    for term in findings.terms:
        rate = state.cluster(term.cluster).rate
        for second, deliveries in term.rate.items():
            rate[second] = rate.get(second, 0) + int(deliveries)
    for cluster in state.clusters.values():
        horizon = cluster.newest_us // 1_000_000 - RATE_WINDOW_SECONDS
        if cluster.rate and min(cluster.rate) < horizon:
            cluster.rate = {second: n for second, n in cluster.rate.items() if second >= horizon}
    for row in findings.latency:
        buckets = state.cluster(row.cluster).latency.setdefault(row.direction, {})
        buckets[row.bucket] = buckets.get(row.bucket, 0) + int(row.n)
    for message in findings.worst:
        cluster = state.cluster(message.cluster)
        if message.lag_ms > cluster.worst_lag_ms and message.ev is not None:
            cluster.worst_lag_ms = float(message.lag_ms)
            cluster.worst_lag = example(
                "",
                (message.cluster, message.direction, message.stream),
                message.seq,
                message.ev.broker,
                message.ev.epoch,
                message.ev.ts_us,
                f"delivered {message.lag_ms:.1f} ms after it was accepted",
            )
