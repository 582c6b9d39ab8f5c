"""``broker-validator``: validate a message-log store, write the reports, tell the BrokerClusters.

Exit codes are the contract a CronJob and a script rely on: 0 the store passed, 1 violations were
found, 2 the store could not be validated (unreadable store, Spark failure, status not written).
A short summary goes to stdout; progress and Spark's own chatter go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from broker_contracts.logs import add_log_arguments, configure_logging, log_settings_from
from broker_contracts.redact import redact, redact_url
from broker_validator.limits import DEFAULT_LIMITS, ReadLimits
from broker_validator.report_schema import EXIT_COULD_NOT_VALIDATE, EXIT_PASSED, EXIT_VIOLATIONS, Report

logger = logging.getLogger("broker_validator")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="broker-validator",
        description="Prove from the brokers' message logs that no message was lost, delivered twice or "
        "reordered, and that no two brokers of a cluster were active at once.",
    )
    parser.add_argument("--store", type=Path, required=True, help="the message-log store (a directory)")
    parser.add_argument(
        "--report-dir", type=Path, required=True, help="where report.json and report.html are written"
    )
    parser.add_argument(
        "--full", action="store_true", help="validate every segment again, ignoring the checkpoint"
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master: local[*] (default), local[N] or k8s://https://<apiserver>",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=60.0,
        help="an accepted message younger than this (against the cluster's newest record) is in flight, "
        "not lost (default 60)",
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="record the verdict in status.ordering of the BrokerClusters (named by the store's top-level "
        "directories) in this namespace; omit to write no status",
    )
    parser.add_argument(
        "--report-location",
        default=None,
        help="what status.ordering.report says (default: the report directory's report.html)",
    )
    parser.add_argument(
        "--max-segment-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_segment_bytes,
        help="a closed segment larger than this is reported as foreign-file and not read "
        f"(default {DEFAULT_LIMITS.max_segment_bytes}: brokers close theirs at 32 MiB)",
    )
    parser.add_argument(
        "--max-record-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_record_bytes,
        help="a line longer than this is malformed and not parsed "
        f"(default {DEFAULT_LIMITS.max_record_bytes})",
    )
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    args.log = log_settings_from(parser, args, os.environ)
    if args.settle_seconds < 0:
        parser.error(f"--settle-seconds ({args.settle_seconds}) must not be negative")
    for flag in ("max_segment_bytes", "max_record_bytes"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} ({getattr(args, flag)}) must be at least 1")
    args.limits = ReadLimits(args.max_segment_bytes, args.max_record_bytes)
    return args


class CouldNotValidateError(RuntimeError):
    """Why there is no verdict: said on stderr, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The driver's Python logging only: Spark's JVM logs through its own log4j configuration.
    configure_logging(args.log)
    try:
        report = validate(args)
        print(summary(report, args.report_dir))
        if args.namespace:
            record_status(report, args)
    except CouldNotValidateError as error:
        print(f"broker-validator: {error}", file=sys.stderr)
        return EXIT_COULD_NOT_VALIDATE
    return EXIT_VIOLATIONS if report["violations"] else EXIT_PASSED


def validate(args: argparse.Namespace) -> Report:
    from broker_validator.spark import SparkSettings, SparkSettingsError, session_for
    from broker_validator.store import StoreUnreadableError, scan_store

    try:  # an unusable store is said at once, before Spark takes its seconds to start
        scan_store(args.store, args.limits)
        settings = SparkSettings.from_env()
    except (StoreUnreadableError, SparkSettingsError) as error:
        raise CouldNotValidateError(f"cannot validate: {error}") from error
    started = time.monotonic()
    try:
        spark = session_for(args.master, settings)
    except Exception as error:  # no session, no validation: say why
        # A master URL may carry credentials (userinfo, a token in its query): never printed.
        raise CouldNotValidateError(
            redact(f"could not start Spark ({args.master or 'local[*]'}): {error}")
        ) from error
    master = redact_url(spark.sparkContext.master or "")
    logger.info("Spark ready in %.1f s (%s)", time.monotonic() - started, master)
    try:
        from broker_validator.job import validate_store

        return validate_store(
            spark,
            args.store,
            args.report_dir,
            full=args.full,
            settle_seconds=args.settle_seconds,
            limits=args.limits,
        )
    except StoreUnreadableError as error:
        raise CouldNotValidateError(f"cannot validate: {error}") from error
    except Exception as error:
        logger.exception("validation failed; the checkpoint is unchanged")
        raise CouldNotValidateError(f"validation failed: {error}") from error
    finally:
        spark.stop()


def record_status(report: Report, args: argparse.Namespace) -> None:
    from broker_validator.status import OrderingStatusError, record_ordering

    location = args.report_location or str(args.report_dir / "report.html")
    try:
        for warning in record_ordering(report, args.namespace, location):
            print(f"broker-validator: warning: {warning}", file=sys.stderr)
    except OrderingStatusError as error:
        raise CouldNotValidateError(
            f"the verdict could not be recorded in status.ordering: {error}"
        ) from error


def summary(report: Report, report_dir: Path) -> str:
    run = report["run"]
    lines = [
        f"ordering {report['result']}: {report['violations']} violations "
        f"in {len(report['clusters'])} clusters "
        f"({run['mode']} run: {run['segmentsRead']} new segments, {run['recordsRead']:,} records, "
        f"{run['seconds']:.1f} s)",
    ]
    for name, cluster in report["clusters"].items():
        found = ", ".join(f"{k} {v}" for k, v in cluster["anomalies"].items() if v) or "no anomalies"
        delivered = ", ".join(f"{d} {n:,}" for d, n in sorted(cluster["messages"].items())) or "none"
        lines.append(
            f"  {name}: {cluster['result']} ({found}); delivered {delivered}; "
            f"{len(cluster['failovers'])} failovers"
        )
    lines.append(f"report: {report_dir / 'report.html'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
