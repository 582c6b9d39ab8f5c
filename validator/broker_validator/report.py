"""Builds ``report.json`` from the carried state: the state findings are derived here, every run.

Lost, in-flight, gap, split-brain and crashed-term depend on everything seen so far (a hole can
be filled by a later segment, an accepted message delivered later), so they are not counted as
records pass; they are computed from the state as it stands, which is why a chain of incremental
runs and one full run give the same report.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Final

from broker_validator.fold import example
from broker_validator.messages import bucket_upper_ms
from broker_validator.report_schema import (
    MAX_EXAMPLES,
    SCHEMA_VERSION,
    Anomaly,
    ClusterReport,
    DeliveryRate,
    Example,
    Failover,
    Latency,
    Report,
    RunInfo,
    SegmentProblem,
    StreamSummary,
    Term,
    count_violations,
    empty_anomalies,
    result_of,
)
from broker_validator.state import ClusterState, StreamKey, StreamState, ValidatorState
from broker_validator.timefmt import ts_text

MAX_STREAMS_LISTED: Final = 200
MAX_PROBLEMS_LISTED: Final = 100


def build_report(
    state: ValidatorState,
    *,
    store: str,
    run: RunInfo,
    settle_seconds: float,
    scan_problems: list[SegmentProblem],
    foreign_files: int,
    generated_at: str,
) -> Report:
    streams_by_cluster: dict[str, list[tuple[StreamKey, StreamState]]] = defaultdict(list)
    for key, stream in sorted(state.streams.items()):
        streams_by_cluster[key[0]].append((key, stream))
    clusters = {
        name: _cluster_report(name, state.clusters[name], streams_by_cluster[name], state, settle_seconds)
        for name in sorted(state.clusters)
    }
    anomalies = empty_anomalies()
    for cluster in clusters.values():
        for anomaly, count in cluster["anomalies"].items():
            anomalies[anomaly] += count
    anomalies[Anomaly.FOREIGN_FILE] += foreign_files
    violations = count_violations(anomalies)
    problems = (list(state.problems) + scan_problems)[:MAX_PROBLEMS_LISTED]
    return Report(
        schemaVersion=SCHEMA_VERSION,
        generatedAt=generated_at,
        store=store,
        result=result_of(violations),
        violations=violations,
        anomalies=anomalies,
        run=run,
        clusters=clusters,
        problems=problems,
    )


def _cluster_report(
    name: str,
    cluster: ClusterState,
    streams: list[tuple[StreamKey, StreamState]],
    state: ValidatorState,
    settle_seconds: float,
) -> ClusterReport:
    anomalies = empty_anomalies()
    for anomaly, count in cluster.counts.items():
        anomalies[anomaly] += count
    examples: dict[str, list[Example]] = {a.value: list(cluster.examples.get(a.value, [])) for a in Anomaly}

    def found(anomaly: Anomaly, count: int, sample: Example | None) -> None:
        anomalies[anomaly] += count
        if sample is not None and len(examples[anomaly]) < MAX_EXAMPLES:
            examples[anomaly].append(sample)

    horizon = cluster.newest_us - int(settle_seconds * 1_000_000)
    messages: dict[str, int] = defaultdict(int)
    summaries: list[StreamSummary] = []
    for key, stream in streams:
        pending = state.pending.get(key, {})
        exempt = stream.held | stream.discarded
        for lo, hi, ts_us, broker, epoch, seq in stream.holes:
            for missing in range(lo, hi + 1):
                if missing in exempt or missing in pending:
                    continue
                found(
                    Anomaly.GAP,
                    1,
                    example(
                        Anomaly.GAP,
                        key,
                        missing,
                        broker,
                        epoch,
                        ts_us,
                        f"seq {missing} was never accepted or delivered; seq {seq} was delivered after "
                        f"seq {lo - 1}",
                    ),
                )
        for seq, waiting in sorted(pending.items()):
            if seq in exempt or stream.has_evidence(seq):
                continue
            anomaly = Anomaly.LOST if waiting.accepted_us < horizon else Anomaly.IN_FLIGHT
            found(
                anomaly,
                1,
                example(
                    anomaly,
                    key,
                    seq,
                    waiting.broker,
                    waiting.epoch,
                    waiting.accepted_us,
                    f"accepted by {waiting.broker} and not delivered, held or discarded "
                    f"{(cluster.newest_us - waiting.accepted_us) / 1e6:.1f} s later",
                ),
            )
        anomalies[Anomaly.DEDUPLICATED] += len(stream.dedup_only)
        delivered = stream.max_seq - stream.missing()
        messages[key[1]] += delivered
        if len(summaries) < MAX_STREAMS_LISTED:
            summaries.append(
                StreamSummary(direction=key[1], stream=key[2], delivered=delivered, lastSeq=stream.max_seq)
            )
    _split_brain(name, cluster, found)
    terms = _terms(cluster)
    for term in terms:
        if term["ended"] == "crashed":
            found(
                Anomaly.CRASHED_TERM,
                1,
                example(
                    Anomaly.CRASHED_TERM,
                    (name, None, None),
                    None,
                    term["broker"],
                    term["epoch"],
                    None,
                    f"{term['broker']} was active with epoch {term['epoch']} and its log ends without "
                    "`deactivated` before a later epoch began (killed or cut off)",
                ),
            )
    violations = count_violations(anomalies)
    return ClusterReport(
        result=result_of(violations),
        violations=violations,
        anomalies=anomalies,
        examples=examples,
        messages=dict(messages),
        streamCount=len(streams),
        streams=summaries,
        terms=terms,
        failovers=_failovers(cluster),
        latencyMs={direction: _latency(buckets) for direction, buckets in sorted(cluster.latency.items())},
        worstLag=cluster.worst_lag,
        deliveryRate=_rate(cluster),
        firstTs=ts_text(min(t.start_us or t.last_us for t in cluster.terms.values()))
        if cluster.terms
        else None,
        lastTs=ts_text(cluster.newest_us) if cluster.newest_us else None,
    )


def _split_brain(name: str, cluster: ClusterState, found: object) -> None:
    """Work done under an epoch after another broker was activated with a higher one; or an epoch
    granted to two brokers."""
    report = found  # (anomaly, count, example) -> None
    assert callable(report)
    epochs = sorted(cluster.epochs.items())
    for index, (epoch, info) in enumerate(epochs):
        if len(info.activations) > 1:
            brokers = sorted(info.activations)
            report(
                Anomaly.SPLIT_BRAIN,
                1,
                example(
                    Anomaly.SPLIT_BRAIN,
                    (name, None, None),
                    None,
                    brokers[1],
                    epoch,
                    info.activations[brokers[1]],
                    f"epoch {epoch} was activated by {', '.join(brokers)}",
                ),
            )
        if info.last_effect_us is None or info.last_effect is None:
            continue
        doer = info.last_effect["broker"]
        later = [
            (ts, broker, higher)
            for higher, other in epochs[index + 1 :]
            for broker, ts in other.activations.items()
            if broker != doer
        ]
        if not later:
            continue
        activated_us, broker, higher = min(later)
        if info.last_effect_us > activated_us:
            proof = dict(info.last_effect)
            proof["anomaly"] = Anomaly.SPLIT_BRAIN.value
            proof["detail"] = (
                f"{info.last_effect['detail']} at {proof['ts']}, after {broker} was activated with epoch "
                f"{higher} at {ts_text(activated_us)}"
            )
            report(Anomaly.SPLIT_BRAIN, 1, Example(**proof))  # type: ignore[typeddict-item]


def _terms(cluster: ClusterState) -> list[Term]:
    newest_epoch = max(cluster.epochs, default=0)
    terms: list[Term] = []
    for (broker, epoch), term in sorted(cluster.terms.items(), key=lambda item: (item[0][1], item[0][0])):
        if term.start_us is None:
            continue
        if term.deactivated_us is not None and term.deactivated_us >= term.start_us:
            ended, end = "deactivated", term.deactivated_us
        elif epoch < newest_epoch:
            ended, end = "crashed", term.last_us
        else:
            ended, end = "open", None
        terms.append(
            Term(
                broker=broker,
                epoch=epoch,
                start=ts_text(term.start_us),
                end=ts_text(end) if end is not None else None,
                ended=ended,  # type: ignore[typeddict-item]
            )
        )
    return terms


def _failovers(cluster: ClusterState) -> list[Failover]:
    activated = [(epoch, info) for epoch, info in sorted(cluster.epochs.items()) if info.activations]
    failovers: list[Failover] = []
    for (old_epoch, old), (new_epoch, new) in itertools.pairwise(activated):
        broker, at = min(new.activations.items(), key=lambda item: item[1])
        gap = (
            (new.first_evidence_us - old.last_evidence_us) / 1000.0
            if new.first_evidence_us is not None and old.last_evidence_us is not None
            else None
        )
        failovers.append(
            Failover(
                at=ts_text(at),
                fromBroker=min(old.activations, key=old.activations.__getitem__),
                fromEpoch=old_epoch,
                toBroker=broker,
                toEpoch=new_epoch,
                gapMs=gap,
            )
        )
    return failovers


def _latency(buckets: dict[int, int]) -> Latency:
    total = sum(buckets.values())
    ordered = sorted(buckets.items())

    def percentile(fraction: float) -> float:
        target = fraction * total
        seen = 0
        for bucket, count in ordered:
            seen += count
            if seen >= target:
                return round(bucket_upper_ms(bucket), 3)
        return round(bucket_upper_ms(ordered[-1][0]), 3) if ordered else 0.0

    return Latency(
        count=total,
        p50=percentile(0.5),
        p90=percentile(0.9),
        p99=percentile(0.99),
        max=round(bucket_upper_ms(ordered[-1][0]), 3) if ordered else 0.0,
    )


def _rate(cluster: ClusterState) -> DeliveryRate:
    if not cluster.rate:
        return DeliveryRate(bucketSeconds=1, start=None, counts=[])
    first, last = min(cluster.rate), max(cluster.rate)
    span = last - first + 1
    bucket = max(1, -(-span // 2000))  # at most 2000 points in the picture
    counts = [0] * (-(-span // bucket))
    for second, n in cluster.rate.items():
        counts[(second - first) // bucket] += n
    return DeliveryRate(bucketSeconds=bucket, start=ts_text(first * 1_000_000), counts=counts)
