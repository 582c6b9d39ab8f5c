"""The command line, ``python -m broker_validator.synthetic --store DIR --records N [--inject ...]``.

A new store, or ``--extend`` to continue one from its manifest (by default
``<store>.manifest.json`` beside the store, never inside it). Exit 0 when written, 2 when the
arguments cannot make a store (too few records for the failovers, a full directory, ...); a bad
``--inject`` is a usage error. It lives apart from ``__main__.py`` so that the package can
re-export :func:`main` without importing ``__main__`` (which ``python -m`` would then warn about).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from broker_validator.synthetic.generate import SEGMENT_RECORDS, extend_store, generate_store
from broker_validator.synthetic.manifest import INJECTABLE, GeneratedStore

_DESCRIPTION = "Synthetic message-log stores: realistic broker histories with exactly known anomalies."


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
    parser = argparse.ArgumentParser(prog="python -m broker_validator.synthetic", description=_DESCRIPTION)
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
