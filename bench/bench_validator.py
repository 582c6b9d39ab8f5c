"""Validator throughput: the Spark ordering validator against DuckDB on one ten-million-record store.

Setup (the issue's): a synthetic message-log store (``broker_validator.synthetic``) of 10,000,000
records, 200 streams each way, 3 brokers, 6 failovers of which 2 are crashes, and a few injected
anomalies of every violation class; then 10 % more records of the same history (one more crash,
two more anomalies) as new segments. Both are generated once and cached under
``~/.cache/broker-failover/bench-validator/<key>`` (the key hashes the parameters and every
source file of the generator's package), so a second run starts at once; each run hard-links them
into a fresh scratch store, since the validator writes its checkpoint into the store.

In one run, every segment first read once (the page cache warm for both engines), then:

* ``duckdb``: :mod:`bench.validator_duckdb`, the same checks as SQL, one full pass on 2 threads;
* ``validator full``: ``broker_validator.job.validate_store(full=True)`` on ``local[2]``, timed
  from a ready session (JVM start excluded, printed apart) after a warm-up run on a small store;
* ``validator incremental``: the extra segments linked into the store, then an incremental run
  (the checkpoint of the full run carries the state) in the same session.

Both engines must report exactly the anomaly counts of the generator's manifest (every class,
non-violations included); any difference is printed and the run exits 1 after its figures. The
figures: ``duckdb_records_per_s`` (M) and ``validator_records_per_s`` (N) are lines in the store
divided by wall time; ``validator_incremental_ratio`` (R) is incremental over full time;
``validator_vs_duckdb`` is N / M. Targets: N >= 0.5 M, R <= 0.2. CPU seconds per phase (the JVM,
the Python driver) show whether the two cores were busy. Progress goes to stderr; the last line
is the headline ``validator_records_per_s=N``.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.validator_duckdb import (  # noqa: E402  # the repository root is put on the path just above
    VALIDATOR_DIR,
    validate_store_duckdb,
)
from broker_validator import synthetic  # noqa: E402
from broker_validator.synthetic import GeneratedStore, extend_store, generate_store  # noqa: E402

CACHE = Path.home() / ".cache" / "broker-failover" / "bench-validator"
BASE_INJECT: Mapping[str, int] = {
    "lost": 3,
    "duplicate-delivery": 3,
    "out-of-order": 3,
    "gap": 3,
    "split-brain": 3,
    "held": 2,
    "discarded": 1,
    "malformed": 2,
}
EXTENSION_INJECT: Mapping[str, int] = {"duplicate-delivery": 1, "gap": 1, "lost": 1}
WARMUP_RECORDS = 100_000  # the untimed warm-up store, or --records if that is smaller


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--streams", type=int, default=200, help="per direction")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=6)
    parser.add_argument("--crashes", type=int, default=2)
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument("--increment", type=float, default=0.1, help="new data for the incremental run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", type=int, default=2, help="local[N] for Spark, threads for DuckDB")
    parser.add_argument("--settle-seconds", type=float, default=60.0)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--skip-spark", action="store_true", help="DuckDB only (no JVM)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="keep Spark's event log and print the time of each stage by call site, per run",
    )
    return parser.parse_args()


# --- the cached stores ---------------------------------------------------------------------------


def cache_key(args: argparse.Namespace) -> str:
    """Parameters and the generator's own source (every file of its package, by path): a changed
    generator never reuses an old store."""
    package = Path(inspect.getfile(synthetic)).parent
    source = b"".join(
        str(path.relative_to(package)).encode() + b"\0" + path.read_bytes()
        for path in sorted(package.rglob("*.py"))
    )
    parameters = {
        name: getattr(args, name)
        for name in ("records", "streams", "brokers", "failovers", "crashes", "clusters", "increment", "seed")
    }
    parameters |= {
        "base": dict(BASE_INJECT),
        "extension": dict(EXTENSION_INJECT),
        "settle": args.settle_seconds,
    }
    digest = hashlib.sha256(json.dumps(parameters, sort_keys=True).encode() + source).hexdigest()[:16]
    return f"r{args.records}-s{args.streams}-b{args.brokers}-f{args.failovers}-c{args.clusters}-{digest}"


def progress_printer(label: str) -> Callable[[int, int], None]:
    shown = [-1.0]

    def show(written: int, planned: int) -> None:
        percent = min(100, 100 * written // max(planned, 1))
        if percent >= shown[0] + 10 or (percent == 100 and shown[0] < 100):
            shown[0] = percent
            say(f"generating {label}: {percent}% ({written:,} records)")

    return show


def cached_stores(args: argparse.Namespace) -> tuple[Path, GeneratedStore, GeneratedStore]:
    """The cache entry's directory with the base manifest and the cumulative one after the
    extension; generated (into a temporary directory, renamed when complete) when missing."""
    key = cache_key(args)
    entry = args.cache / key
    if (entry / "extension.json").exists():
        say(f"cached stores: {entry}")
        return entry, GeneratedStore.load(entry / "base.json"), GeneratedStore.load(entry / "extension.json")
    args.cache.mkdir(parents=True, exist_ok=True)
    for old in args.cache.iterdir():  # one store at a time: each is gigabytes
        if old.name != key and old.is_dir():
            say(f"removing an older cached store {old.name}")
            shutil.rmtree(old)
    building = args.cache / f"{key}.tmp-{os.getpid()}"
    began = time.monotonic()
    base = generate_store(
        building / "base",
        records=args.records,
        streams=args.streams,
        brokers=args.brokers,
        failovers=args.failovers,
        crashes=args.crashes,
        clusters=args.clusters,
        inject=BASE_INJECT,
        seed=args.seed,
        settle_seconds=args.settle_seconds,
        progress=progress_printer("base"),
    )
    say(f"generated {base.records:,} records ({base.bytes / 1e9:.2f} GB) in {base.seconds:.1f} s")
    grown = extend_store(
        building / "extension",
        base,
        records=int(args.records * args.increment),
        failovers=1,
        crashes=1,
        inject=EXTENSION_INJECT,
        seed=args.seed + 1,
        progress=progress_printer("extension"),
    )
    say(f"generated {grown.part_records:,} more records in {grown.seconds:.1f} s")
    base.root, grown.root = entry / "base", entry / "extension"  # where they are once renamed
    base.save(building / "base.json")
    grown.save(building / "extension.json")
    os.replace(building, entry)
    say(f"stores cached in {entry} ({time.monotonic() - began:.1f} s)")
    return entry, GeneratedStore.load(entry / "base.json"), GeneratedStore.load(entry / "extension.json")


def link_tree(source: Path, target: Path) -> int:
    """Hard-link every file of ``source`` into ``target`` (segments are never rewritten)."""
    count = 0
    for path in sorted(source.rglob("*.jsonl")):
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, destination)
        count += 1
    return count


def warm_page_cache(store: Path) -> tuple[int, float]:
    began = time.monotonic()
    total = 0
    for path in sorted(store.rglob("*.jsonl")):
        with path.open("rb") as file:
            while chunk := file.read(1 << 24):
                total += len(chunk)
    return total, time.monotonic() - began


# --- measuring ---------------------------------------------------------------------------------


def process_tree_cpu(root_pid: int) -> float:
    """User plus system CPU seconds of ``root_pid`` and every live descendant (the JVM is a child
    of spark-submit, itself a child of this process)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree = {root_pid}
    grown = True
    while grown:
        grown = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grown = True
    return sum(times.get(pid, 0.0) for pid in tree if pid != root_pid)


def own_cpu() -> float:
    usage = os.times()
    return usage.user + usage.system


def compare(engine: str, found: Mapping[str, int], expected: Mapping[str, int]) -> list[str]:
    # Every class either side names: a class the manifest lacks but an engine reports is wrong too.
    wrong = [
        f"{engine}: {name} found {found.get(name, 0)}, injected/expected {expected.get(name, 0)}"
        for name in sorted(set(expected) | set(found))
        if found.get(name, 0) != expected.get(name, 0)
    ]
    for line in wrong:
        say("MISMATCH " + line)
    if not wrong:
        found_now = {name: count for name, count in expected.items() if count}
        say(f"{engine}: anomaly counts equal the manifest {json.dumps(found_now)}")
    return wrong


# --- the run ------------------------------------------------------------------------------------


def run_spark(
    args: argparse.Namespace, entry: Path, work: Path, base: GeneratedStore, grown: GeneratedStore
) -> tuple[dict[str, float], list[str], list[str]]:
    """Session, warm-up, full run, extension, incremental run; figures, report lines, mismatches."""
    from broker_validator.job import validate_store

    figures: dict[str, float] = {}
    lines: list[str] = []
    wrong: list[str] = []
    marks: list[tuple[str, float]] = []  # (run, wall-clock start) for the stage profile
    takes_progress = "progress" in inspect.signature(validate_store).parameters

    def run(label: str, store: Path, full: bool) -> tuple[dict[str, Any], float, float, float]:
        options: dict[str, Any] = {"full": full, "settle_seconds": args.settle_seconds}
        if takes_progress:
            began_at = time.monotonic()
            options["progress"] = lambda text: say(f"  {label} +{time.monotonic() - began_at:6.1f}s {text}")
        jvm_before, own_before = process_tree_cpu(os.getpid()), own_cpu()
        marks.append((label, time.time()))
        began = time.monotonic()
        report = validate_store(spark, store, entry / "reports" / label, **options)
        seconds = time.monotonic() - began
        return dict(report), seconds, process_tree_cpu(os.getpid()) - jvm_before, own_cpu() - own_before

    say("starting the Spark session (not timed)")
    began = time.monotonic()
    spark = start_session(args, entry / "work" / "spark-events")
    figures["session_start_s"] = time.monotonic() - began
    say(f"session ready in {figures['session_start_s']:.1f} s")
    try:
        warmup = work.parent / "warmup"
        shutil.rmtree(warmup, ignore_errors=True)
        # Never larger than the measured store: a smoke run's whole point is to be small.
        warmup_records = min(WARMUP_RECORDS, args.records)
        small = generate_store(
            warmup, records=warmup_records, streams=args.streams, seed=args.seed + 7, inject={"gap": 1}
        )
        say(f"warm-up run on a {warmup_records:,}-record store (not timed)")
        report, seconds, _, _ = run("warmup", warmup, True)
        figures["warmup_s"] = seconds
        wrong += compare("validator warm-up", report["anomalies"], small.expected)

        say(f"validator full run over {base.lines:,} lines")
        report, seconds, jvm_cpu, driver_cpu = run("full", work, True)
        figures |= {"full_s": seconds, "full_jvm_cpu_s": jvm_cpu, "full_driver_cpu_s": driver_cpu}
        wrong += compare("validator full", report["anomalies"], base.expected)
        lines.append(
            f"validator_full_s={seconds:.2f} records_read={report['run']['recordsRead']} "
            f"cpu_s jvm={jvm_cpu:.1f} driver={driver_cpu:.1f} (of {args.cores} cores x {seconds:.1f} s)"
        )

        added = link_tree(entry / "extension", work)
        say(f"linked {added} new segments ({grown.part_records:,} records); validator incremental run")
        report, seconds, jvm_cpu, driver_cpu = run("incremental", work, False)
        figures |= {"incremental_s": seconds, "incremental_jvm_cpu_s": jvm_cpu}
        wrong += compare("validator incremental", report["anomalies"], grown.expected)
        lines.append(
            f"validator_incremental_s={seconds:.2f} records_read={report['run']['recordsRead']} "
            f"segments_read={report['run']['segmentsRead']} segments_known={report['run']['segmentsKnown']} "
            f"cpu_s jvm={jvm_cpu:.1f} driver={driver_cpu:.1f}"
        )
    finally:
        spark.stop()
    if args.profile:
        lines += stage_profile(entry / "work" / "spark-events", marks)
    return figures, lines, wrong


def start_session(args: argparse.Namespace, events: Path) -> Any:
    """``local_session(cores)``; with ``--profile`` it also writes Spark's event log to ``events``."""
    from broker_validator.spark import SparkSettings, local_session

    if not args.profile:
        return local_session(args.cores)
    events.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    return local_session(args.cores, SparkSettings(extra_conf=conf))


def stage_profile(events: Path, marks: list[tuple[str, float]]) -> list[str]:
    """Stage wall time by call site from Spark's event log, per run (``marks``: run label and its
    start, epoch seconds). Stages of one job overlap only when Spark runs them in parallel."""
    per_run: dict[str, dict[str, list[float]]] = {}
    for log in sorted(path for path in events.rglob("*") if path.is_file()):
        for raw in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if event.get("Event") != "SparkListenerStageCompleted":
                continue
            info = event["Stage Info"]
            if "Submission Time" not in info or "Completion Time" not in info:
                continue
            started = info["Submission Time"] / 1000
            label = next((name for name, at in reversed(marks) if at <= started), "before")
            site = info["Stage Name"].replace(str(ROOT) + "/", "")
            total = per_run.setdefault(label, {}).setdefault(site, [0.0, 0, 0])
            total[0] += (info["Completion Time"] - info["Submission Time"]) / 1000
            total[1] += 1
            total[2] += info.get("Number of Tasks", 0)
    lines = []
    for label, sites in per_run.items():
        if label == "warmup":
            continue
        lines.append(f"--- Spark stages of the {label} run: seconds, stages, tasks by call site ---")
        for site, (seconds, stages, tasks) in sorted(sites.items(), key=lambda item: -item[1][0])[:15]:
            lines.append(f"{seconds:8.1f} s {int(stages):3d} stages {int(tasks):5d} tasks  {site}")
    return lines


def main() -> int:
    args = parse_args()
    entry, base, grown = cached_stores(args)
    work = entry / "work" / "store"
    shutil.rmtree(entry / "work", ignore_errors=True)
    shutil.rmtree(entry / "reports", ignore_errors=True)
    linked = link_tree(entry / "base", work)
    size, warm_seconds = warm_page_cache(work)
    say(f"scratch store: {linked} segments linked; read once ({size / 1e9:.2f} GB in {warm_seconds:.1f} s)")
    lines = [
        f"store: records={base.records} lines={base.lines} segments={base.segments} bytes={base.bytes} "
        f"clusters={args.clusters} streams={args.streams}x2 brokers={args.brokers} "
        f"failovers={base.failovers} increment={grown.part_records}",
        f"injected: {json.dumps({k: v for k, v in base.expected.items() if v})}",
    ]

    say("DuckDB full run")
    duck = validate_store_duckdb(
        work,
        settle_seconds=args.settle_seconds,
        threads=args.cores,
        temp_directory=entry / "work" / "duckdb-tmp",
    )
    wrong = compare("duckdb", duck.anomalies, base.expected)
    messages = {name: cluster["messages"] for name, cluster in base.clusters.items()}
    if duck.messages != messages:
        wrong.append(f"duckdb: messages per cluster and direction {duck.messages}, generated {messages}")
    if (work / VALIDATOR_DIR).exists():
        raise SystemExit("the DuckDB comparator must not write into the store")
    duckdb_rate = base.lines / duck.seconds
    lines.append(
        f"duckdb_s={duck.seconds:.2f} phases "
        + " ".join(f"{name}={seconds:.2f}" for name, seconds in duck.phases.items())
    )
    lines.append(f"duckdb_records_per_s={duckdb_rate:.0f}")
    print("\n".join(lines), flush=True)
    lines = []

    if args.skip_spark:
        return 1 if wrong else 0
    figures, spark_lines, spark_wrong = run_spark(args, entry, work, base, grown)
    wrong += spark_wrong
    rate = base.lines / figures["full_s"]
    lines += [
        f"validator_session_start_s={figures['session_start_s']:.1f} (excluded) "
        f"warmup_s={figures['warmup_s']:.1f}",
        *spark_lines,
        f"validator_incremental_ratio={figures['incremental_s'] / figures['full_s']:.3f}",
        f"validator_vs_duckdb={rate / duckdb_rate:.3f}",
        f"validator_records_per_s={rate:.0f}",
    ]
    print("\n".join(lines), flush=True)
    if wrong:
        print("FAILED: the engines did not find exactly the injected anomalies:", file=sys.stderr)
        for line in wrong:
            print("  " + line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
