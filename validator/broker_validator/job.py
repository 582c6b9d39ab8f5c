"""One validation run: scan the store, read what is new, fold it in, write the reports, checkpoint.

The order of the last steps is the crash-safety argument: ``report.json`` and ``report.html``
are written (each atomically) before the checkpoint is replaced, so a run that dies at any point
leaves the previous checkpoint; the next run reads the same segments again and reaches the same
verdict.

Segments normally arrive in target order (a broker closes its segment when it deactivates, before
the next one is activated). The exception is a broker that crashed: its last segment is closed
only when it restarts, possibly after a run validated the next epoch's records. Such a late
segment would be judged against a newer state, so when a batch carries delivery evidence of an
epoch below one already validated for its cluster, that cluster is validated again from all of
its segments (and the report says so).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pyspark.sql import SparkSession

from broker_contracts.message_log import format_ts
from broker_validator.checks import BatchFindings, FileProblem, PriorState, find, read_batch
from broker_validator.fold import fold
from broker_validator.limits import DEFAULT_LIMITS, ReadLimits
from broker_validator.report import build_report
from broker_validator.report_schema import Anomaly, Report, RunInfo, SegmentProblem
from broker_validator.segment_reader import SegmentSource
from broker_validator.state import ValidatorState
from broker_validator.store import (
    CheckpointUnusableError,
    Segment,
    StoreScan,
    load_checkpoint,
    save_checkpoint,
    scan_store,
)

logger = logging.getLogger(__name__)
Progress = Callable[[str], None]
RunMode = Literal["full", "incremental"]


def validate_store(
    spark: SparkSession,
    store: Path,
    report_dir: Path | None,
    *,
    full: bool = False,
    settle_seconds: float = 60.0,
    limits: ReadLimits = DEFAULT_LIMITS,
    progress: Progress | None = None,
) -> Report:
    """Validate ``store`` (incrementally from its checkpoint unless ``full``); write the reports
    into ``report_dir`` (when given) and then the checkpoint. Raises StoreUnreadableError."""
    say = progress or logger.info
    started = time.monotonic()
    started_at = format_ts()
    scan = scan_store(store, limits)
    state, mode = _starting_state(store, full, say)
    problems = _scan_problems(scan)
    known = sum(1 for s in scan.segments if s.path in state.processed)
    new, changed = _new_segments(scan, state)
    problems += changed
    records = bytes_read = 0
    if new:
        say(
            f"reading {len(new)} new segments ({sum(s.size for s in new) / 1e6:.1f} MB); "
            f"{known} already validated"
        )
        records, bytes_read = _read_and_fold(
            spark, store=store, state=state, new=new, scan=scan, limits=limits, say=say
        )
    else:
        say(f"no new segments; {known} already validated")
    run = RunInfo(
        mode=mode,
        startedAt=started_at,
        seconds=round(time.monotonic() - started, 3),
        segmentsRead=len(new),
        segmentsKnown=known,
        recordsRead=records,
        bytesRead=bytes_read,
        settleSeconds=settle_seconds,
    )
    report = build_report(
        state,
        store=str(store),
        run=run,
        settle_seconds=settle_seconds,
        scan_problems=problems,
        foreign_files=len(scan.foreign),
        generated_at=format_ts(datetime.now(UTC)),
    )
    if report_dir is not None:
        write_reports(report, report_dir)
    save_checkpoint(store, state.to_json())
    return report


def _starting_state(store: Path, full: bool, say: Progress) -> tuple[ValidatorState, RunMode]:
    if full:
        return ValidatorState(), "full"
    try:
        data = load_checkpoint(store)
    except CheckpointUnusableError as error:
        say(str(error))
        return ValidatorState(), "full"
    if data is None:
        return ValidatorState(), "full"
    return ValidatorState.from_json(data), "incremental"


def _scan_problems(scan: StoreScan) -> list[SegmentProblem]:
    problems = [SegmentProblem(segment=path, lines=0, example=why) for path, why in scan.foreign]
    problems += [SegmentProblem(segment=path, lines=0, example="empty segment") for path in scan.empty]
    return problems


def _new_segments(scan: StoreScan, state: ValidatorState) -> tuple[list[Segment], list[SegmentProblem]]:
    new: list[Segment] = []
    changed: list[SegmentProblem] = []
    for segment in scan.segments:
        size = state.processed.get(segment.path)
        if size is None:
            new.append(segment)
        elif size != segment.size:
            changed.append(
                SegmentProblem(
                    segment=segment.path,
                    lines=0,
                    example=f"closed segment changed after it was validated "
                    f"({size} -> {segment.size} bytes); "
                    "closed segments are never rewritten: run with --full to validate it again",
                )
            )
    return new, changed


def _read_and_fold(
    spark: SparkSession,
    *,
    store: Path,
    state: ValidatorState,
    new: list[Segment],
    scan: StoreScan,
    limits: ReadLimits,
    say: Progress,
) -> tuple[int, int]:
    def sources(segments: list[Segment]) -> list[SegmentSource]:
        return [
            SegmentSource(str(store / s.path), s.path, s.cluster, s.sha256, s.size, limits) for s in segments
        ]

    batch = read_batch(spark, sources(new))
    try:
        say(f"parsed {batch.count} records; checking")
        findings = find(batch, _prior(state))
        late = _late_clusters(state, findings)
        if late:
            say(
                f"late segments for {', '.join(sorted(late))}: "
                "validating those clusters again from all their segments"
            )
            _forget(state, late)
            again = [s for s in scan.segments if s.cluster in late and s not in new]
            batch.release()
            batch = read_batch(spark, sources([*new, *again]))
            findings = find(batch, _prior(state))
            new = [*new, *again]
        say(f"checked ({len(findings.jumps)} seqs ahead of order, {len(findings.behind)} behind); reporting")
        fold(state, findings)
        _fold_problems(state, batch.problems)
        refused = {p.segment for p in batch.problems if p.anomaly != Anomaly.MALFORMED}
        for segment in new:
            # Every segment read counts as seen, a refused one too: it is reported once and kept in
            # the verdict, never tried again (until --full), and never stops a later run.
            state.processed[segment.path] = segment.size
            if segment.sha256 is None and segment.path not in refused:
                state.cluster(segment.cluster).counts[Anomaly.UNVERIFIED_SEGMENT] += 1
        malformed = sum(p.amount for p in batch.problems if p.anomaly == Anomaly.MALFORMED)
        return batch.count + malformed, sum(s.size for s in new)
    finally:
        batch.release()


def _prior(state: ValidatorState) -> PriorState:
    return PriorState(
        stream_max=[(*key, s.max_seq) for key, s in state.streams.items()],
        pending=[
            (*key, seq, p.accepted_us) for key, waiting in state.pending.items() for seq, p in waiting.items()
        ],
        holes=[(*key, hole[0], hole[1]) for key, s in state.streams.items() for hole in s.holes],
    )


def _late_clusters(state: ValidatorState, findings: BatchFindings) -> set[str]:
    newest_validated = {
        name: max(
            (e for e, info in cluster.epochs.items() if info.last_evidence_us is not None), default=None
        )
        for name, cluster in state.clusters.items()
    }
    late: set[str] = set()
    for row in findings.terms:
        validated = newest_validated.get(row.cluster)
        if validated is not None and row.first_evidence is not None and row.epoch < validated:
            late.add(row.cluster)
    return late


def _forget(state: ValidatorState, clusters: set[str]) -> None:
    for name in clusters:
        state.clusters.pop(name, None)
    state.streams = {k: v for k, v in state.streams.items() if k[0] not in clusters}
    state.pending = {k: v for k, v in state.pending.items() if k[0] not in clusters}
    state.processed = {p: n for p, n in state.processed.items() if p.split("/", 1)[0] not in clusters}
    state.problems = [p for p in state.problems if p["segment"].split("/", 1)[0] not in clusters]


def _fold_problems(state: ValidatorState, problems: list[FileProblem]) -> None:
    """Malformed lines and refused segments, counted for the cluster whose directory holds them."""
    for problem in problems:
        cluster = state.cluster(problem.segment.split("/", 1)[0])
        cluster.counts[problem.anomaly] += problem.amount
        if len(state.problems) < 100:
            lines = problem.amount if problem.anomaly == Anomaly.MALFORMED else 0
            state.problems.append(
                SegmentProblem(segment=problem.segment, lines=lines, example=problem.example[:200])
            )


def write_reports(report: Report, report_dir: Path) -> None:
    """``report.json`` and ``report.html``, each replaced atomically."""
    from broker_validator.report_html import render_html

    report_dir.mkdir(parents=True, exist_ok=True)
    _replace(report_dir / "report.json", json.dumps(report, indent=2, sort_keys=False) + "\n")
    _replace(report_dir / "report.html", render_html(report))


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
