"""The synthetic store generator and the DuckDB comparator, without Spark (seconds in all).

A small reference checker written here straight from the semantics (target order by epoch, ts
and position in the file) judges the generated stores, so the generator's manifest is checked
against an oracle that shares no code with it or with the SQL; the DuckDB comparator of
``make bench-validator`` is then checked against the same manifests.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from broker_contracts.message_log import (
    FIELD_NAMES,
    Event,
    MessageLogError,
    MessageLogRecord,
    decode,
    encode,
    format_ts,
    parse_ts,
    segment_stem,
)
from broker_validator.report_schema import VIOLATIONS, Anomaly
from broker_validator.synthetic import INJECTABLE, GeneratedStore, extend_store, generate_store
from broker_validator.synthetic import main as synthetic_main

SMALL = 16_000  # records: ~2,000 messages each way, enough for every class and four failovers
EVENTS = frozenset(e.value for e in Event)
TS_SHAPE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
SEGMENT_NAME = re.compile(r"^\d{8}T\d{12}Z-(\d{6})-(?P<broker>.+)\.(?P<sha256>[0-9a-f]{64})\.jsonl$")
EVIDENCE = ("delivered", "deduplicated")
EFFECTFUL = ("accepted", "delivered", "deduplicated", "confirmed")


@dataclass
class Line:
    epoch: int
    ts: str
    path: str
    number: int
    record: MessageLogRecord


_read_cache: dict[Path, tuple[list[Line], int]] = {}


def read_store(store: Path) -> tuple[list[Line], int]:
    """Every record that fits the schema, and the count of lines that do not (cached per store).

    ``decode`` parses every ts with strptime, tens of µs a line; a line of exactly the schema's
    fields, a known event and a well-shaped ts is taken as it is, and any other line must be
    refused by ``decode`` (the layout test runs ``decode`` on every line of a store)."""
    if store in _read_cache:
        return _read_cache[store]
    lines: list[Line] = []
    malformed = 0
    for path in sorted(store.glob("*/*/*.jsonl")):
        for number, text in enumerate(path.read_bytes().splitlines()):
            try:
                record = json.loads(text)
                fits = (
                    tuple(record) == FIELD_NAMES
                    and record["event"] in EVENTS
                    and TS_SHAPE.match(record["ts"])
                )
            except json.JSONDecodeError:
                fits = False
            if not fits:
                with pytest.raises(MessageLogError):
                    decode(text)
                malformed += 1
                continue
            lines.append(Line(record["epoch"], record["ts"], str(path), number, record))
    _read_cache[store] = (lines, malformed)
    return lines, malformed


def reference_check(store: Path, settle_seconds: float = 60.0) -> dict[str, int]:
    """The anomaly counts of ``store``, computed record by record from the semantics."""
    lines, malformed = read_store(store)
    found = {anomaly.value: 0 for anomaly in Anomaly}
    found[Anomaly.MALFORMED.value] = malformed
    streams: dict[tuple[str, str, str], list[Line]] = defaultdict(list)
    newest: dict[str, str] = {}
    for line in lines:
        r = line.record
        newest[r["cluster"]] = max(newest.get(r["cluster"], ""), r["ts"])
        if r["stream"] is not None:
            streams[(r["cluster"], str(r["direction"]), r["stream"])].append(line)
    for (cluster, _, _), records in streams.items():
        horizon = format_ts(parse_ts(newest[cluster]) - timedelta(seconds=settle_seconds))
        _check_stream(sorted(records, key=lambda x: (x.epoch, x.ts, x.path, x.number)), horizon, found)
    _check_terms(lines, found)
    return found


def _check_stream(records: list[Line], horizon: str, found: dict[str, int]) -> None:
    """One stream's records in target order: (epoch, ts, position in the file)."""
    events: dict[int, set[str]] = defaultdict(set)
    first_accepted: dict[int, str] = {}
    for line in records:
        seq = int(str(line.record["seq"]))
        events[seq].add(line.record["event"])
        if line.record["event"] == "accepted":
            first_accepted.setdefault(seq, line.ts)
        if line.record["event"] in ("held", "discarded"):
            found[line.record["event"]] += 1
    seen: set[int] = set()
    highest = 0
    for line in records:
        event, seq = line.record["event"], int(str(line.record["seq"]))
        if event not in EVIDENCE:
            continue
        if event == "delivered" and seq in seen:
            found[Anomaly.DUPLICATE_DELIVERY.value] += 1
        elif event == "delivered" and seq < highest and "held" not in events[seq]:
            found[Anomaly.OUT_OF_ORDER.value] += 1
        seen.add(seq)
        highest = max(highest, seq)
    found[Anomaly.GAP.value] += sum(1 for seq in range(1, highest + 1) if not events.get(seq))
    for seq, kinds in events.items():
        unfinished = not (set(EVIDENCE) | {"held", "discarded"}) & kinds
        if seq in first_accepted and unfinished:
            found[Anomaly.IN_FLIGHT.value if first_accepted[seq] >= horizon else Anomaly.LOST.value] += 1
        if "deduplicated" in kinds and "delivered" not in kinds:
            found[Anomaly.DEDUPLICATED.value] += 1


def _check_terms(lines: list[Line], found: dict[str, int]) -> None:
    """Split brain and crashed terms, per cluster."""
    last_effect: dict[tuple[str, int], str] = {}
    activations: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)  # (ts, broker)
    terms: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    top_epoch: dict[str, int] = defaultdict(int)
    for line in lines:
        r = line.record
        place = (r["cluster"], r["epoch"])
        top_epoch[r["cluster"]] = max(top_epoch[r["cluster"]], r["epoch"])
        if r["event"] in EFFECTFUL:
            last_effect[place] = max(last_effect.get(place, ""), r["ts"])
        if r["event"] == "activated":
            activations[place].append((r["ts"], r["broker"]))
        if r["event"] in ("activated", "deactivated"):
            terms[(r["cluster"], r["broker"], r["epoch"])].add(r["event"])
    for (cluster, epoch), last in last_effect.items():
        later = [min(a)[0] for (c, e), a in activations.items() if c == cluster and e > epoch]
        if later and last > min(later):
            found[Anomaly.SPLIT_BRAIN.value] += 1
    found[Anomaly.SPLIT_BRAIN.value] += sum(1 for a in activations.values() if len({b for _, b in a}) > 1)
    for (cluster, _, epoch), kinds in terms.items():
        if kinds == {"activated"} and epoch < top_epoch[cluster]:
            found[Anomaly.CRASHED_TERM.value] += 1


def store_digest(store: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(store.rglob("*.jsonl")):
        digest.update(str(path.relative_to(store)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def generate(root: Path, inject: Mapping[str, int] | None = None, **options: int) -> GeneratedStore:
    settings = {"records": SMALL, "failovers": 3, "crashes": 1, "segment_records": 4_000} | options
    return generate_store(root / "store", inject=inject, **settings)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> GeneratedStore:
    return generate(tmp_path_factory.mktemp("clean"))


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> GeneratedStore:
    inject = {kind: 2 for kind in INJECTABLE} | {
        Anomaly.SPLIT_BRAIN.value: 5
    }  # 3 zombies, 2 second activations
    return generate(tmp_path_factory.mktemp("everything"), inject, clusters=2, records=2 * SMALL)


# --- the generator -------------------------------------------------------------------------------


def test_segments_land_in_the_store_layout_and_lines_are_the_writers_bytes(
    everything: GeneratedStore,
) -> None:
    store = everything.root
    files = sorted(path for path in store.rglob("*") if path.is_file())
    assert len(files) == everything.segments
    assert sum(path.stat().st_size for path in files) == everything.bytes
    bad = 0
    for path in files:
        cluster, broker, name = path.relative_to(store).parts
        match = SEGMENT_NAME.match(name)
        assert match is not None, name
        assert match["broker"] == broker
        assert match["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # sealed as a broker seals
        assert broker.startswith(cluster + "-")
        previous = ""
        for text in path.read_bytes().splitlines(keepends=True):
            try:
                record = decode(text)
            except MessageLogError:
                bad += 1
                continue
            assert encode(record) == text  # field order, separators, newline: as a broker writes it
            assert (record["cluster"], record["broker"]) == (cluster, broker)
            assert record["ts"] >= previous, f"{path}: time goes back at {record}"
            previous = record["ts"]
    assert bad == everything.malformed_lines == 2
    assert sorted(i.segment for i in everything.injected if i.anomaly == "malformed") == sorted(
        {str(p.relative_to(store)) for p in files if _has_bad_line(p)}
    )


def _has_bad_line(path: Path) -> bool:
    for text in path.read_bytes().splitlines():
        try:
            decode(text)
        except MessageLogError:
            return True
    return False


def test_manifest_counts_records_messages_and_failovers(everything: GeneratedStore) -> None:
    lines, malformed = read_store(everything.root)
    assert len(lines) == everything.records and malformed == everything.malformed_lines
    assert 0.9 * 2 * SMALL < everything.records < 1.1 * 2 * SMALL
    delivered: dict[tuple[str, str], set[tuple[str, int | None]]] = defaultdict(set)
    activated: dict[str, set[int]] = defaultdict(set)
    for line in lines:
        r = line.record
        if r["event"] in EVIDENCE:
            assert r["direction"] is not None
            delivered[(r["cluster"], r["direction"])].add((str(r["stream"]), r["seq"]))
        if r["event"] == "activated":
            activated[r["cluster"]].add(r["epoch"])
    assert set(everything.clusters) == {"bc-000", "bc-001"}
    for name, cluster in everything.clusters.items():
        for direction, count in cluster["messages"].items():
            assert len(delivered[(name, direction)]) == count
        assert cluster["failovers"] == 3 and cluster["crashes"] == 1
        assert activated[name] == {1, 2, 3, 4} and cluster["epoch"] == 4
    assert everything.failovers == 6


def test_manifest_places_every_injected_instance(everything: GeneratedStore) -> None:
    counts: dict[str, int] = defaultdict(int)
    keys = set()
    lines, _ = read_store(everything.root)
    present = {
        (r.record["cluster"], r.record["direction"], r.record["stream"], r.record["seq"]) for r in lines
    }
    for item in everything.injected:
        counts[item.anomaly] += 1
        if item.stream is not None:
            key = (item.cluster, item.direction, item.stream, item.seq)
            assert key not in keys
            keys.add(key)
            assert (key in present) == (item.anomaly != Anomaly.GAP.value), item
    assert dict(counts) == {kind: 5 if kind == Anomaly.SPLIT_BRAIN.value else 2 for kind in INJECTABLE}
    assert {kind: everything.expected[kind] for kind in INJECTABLE} == dict(counts)


def test_clean_store_has_no_violation_and_nothing_in_flight(clean: GeneratedStore) -> None:
    found = reference_check(clean.root)
    assert found == clean.expected
    assert all(found[v.value] == 0 for v in VIOLATIONS)
    assert found[Anomaly.IN_FLIGHT.value] == 0
    assert found[Anomaly.CRASHED_TERM.value] == 1
    assert found[Anomaly.DEDUPLICATED.value] > 0  # the crash's resend was answered duplicate


def test_every_class_together_is_counted_exactly_by_the_reference(everything: GeneratedStore) -> None:
    assert reference_check(everything.root) == everything.expected


@pytest.mark.parametrize("kind", INJECTABLE)
def test_one_class_alone_gives_exactly_that_count(tmp_path: Path, kind: str) -> None:
    count = 5 if kind == Anomaly.SPLIT_BRAIN.value else 3  # split-brain: one per epoch, all five used
    store = generate(tmp_path, {kind: count}, failovers=4, crashes=2)
    clean = {anomaly.value: 0 for anomaly in Anomaly} | {
        Anomaly.CRASHED_TERM.value: 2,
        Anomaly.DEDUPLICATED.value: store.expected[Anomaly.DEDUPLICATED.value],
    }
    assert store.expected == clean | {kind: count}
    assert reference_check(store.root) == store.expected


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    inject = {"lost": 1, "out-of-order": 1, "malformed": 1}
    first = generate(tmp_path / "a", inject, seed=5)
    again = generate(tmp_path / "b", inject, seed=5)
    other = generate(tmp_path / "c", inject, seed=6)
    assert store_digest(first.root) == store_digest(again.root)
    assert first.injected == again.injected and first.expected == again.expected
    assert store_digest(first.root) != store_digest(other.root)


def test_extension_continues_seqs_epochs_and_segments(tmp_path: Path) -> None:
    base = generate(tmp_path, {"in-flight": 1, "gap": 1}, failovers=2, crashes=0)
    before = {path.name for path in base.root.rglob("*.jsonl")}
    grown = extend_store(
        base.root, base, records=SMALL // 2, failovers=2, crashes=1, inject={"lost": 1}, seed=9
    )
    assert grown.parts == 2 and grown.records == base.records + grown.part_records
    assert grown.clusters["bc-000"]["epoch"] == 5 and grown.clusters["bc-000"]["failovers"] == 4
    new = [path for path in grown.root.rglob("*.jsonl") if path.name not in before]
    for path in new:  # later segment names sort after every earlier one of the same broker
        mine = [name for name in before if segment_stem(name).endswith(f"-{path.parent.name}")]
        assert mine and all(segment_stem(path.name) > segment_stem(name) for name in mine)
    assert new
    # The in-flight message of the first part is lost once the history goes on past the horizon.
    assert grown.expected[Anomaly.IN_FLIGHT.value] == 0 and grown.expected[Anomaly.LOST.value] == 2
    assert reference_check(grown.root) == grown.expected
    first_new_ts = min(decode(p.read_bytes().splitlines()[0])["ts"] for p in new)
    assert first_new_ts > base.last_ts


def test_refuses_what_it_cannot_make_exactly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too few for 6 failovers"):
        generate_store(tmp_path / "a", records=500)
    with pytest.raises(ValueError, match="one per segment"):
        generate(tmp_path, {"malformed": 1000})
    with pytest.raises(ValueError, match="cannot inject"):
        generate(tmp_path / "b", {"foreign-file": 1})
    with pytest.raises(ValueError, match="split-brain"):
        generate(tmp_path / "c", {"split-brain": 9}, brokers=1)
    with pytest.raises(ValueError, match="crashes"):
        generate(tmp_path / "d", failovers=1, crashes=2)
    generate(tmp_path / "e")
    with pytest.raises(ValueError, match="not empty"):
        generate(tmp_path / "e")


def test_cli_writes_the_store_and_its_manifest_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    argv = ["--store", str(store), "--records", "12000", "--failovers", "2", "--inject", "gap=2"]
    assert synthetic_main(argv) == 0
    manifest = GeneratedStore.load(tmp_path / "store.manifest.json")
    assert manifest.expected[Anomaly.GAP.value] == 2 and not list(store.glob("*.json"))
    assert synthetic_main(["--store", str(store), "--records", "6000", "--failovers", "1", "--extend"]) == 0
    assert GeneratedStore.load(tmp_path / "store.manifest.json").parts == 2
    assert "gap" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        synthetic_main(["--store", str(tmp_path / "x"), "--records", "10", "--inject", "nope=1"])
    assert refused.value.code == 2 and "nope=1" in capsys.readouterr().err
    assert synthetic_main(["--store", str(tmp_path / "y"), "--records", "10"]) == 2  # too few records


# --- the DuckDB comparator of bench-validator ----------------------------------------------------


def duckdb_counts(store: Path) -> dict[str, int]:

    from bench.validator_duckdb import validate_store_duckdb

    return validate_store_duckdb(store, threads=1, memory_limit="1GB").anomalies


def test_duckdb_finds_nothing_wrong_in_a_clean_store(clean: GeneratedStore) -> None:
    assert duckdb_counts(clean.root) == clean.expected


def test_duckdb_counts_every_class_together(everything: GeneratedStore) -> None:
    assert duckdb_counts(everything.root) == everything.expected


@pytest.mark.parametrize("kind", INJECTABLE)
def test_duckdb_counts_one_class_alone(tmp_path: Path, kind: str) -> None:
    store = generate(tmp_path, {kind: 2}, failovers=2, crashes=1, seed=3)
    assert duckdb_counts(store.root) == store.expected


def test_duckdb_counts_messages_and_foreign_files(tmp_path: Path) -> None:

    from bench.validator_duckdb import validate_store_duckdb

    store = generate(tmp_path, {"malformed": 1})
    (store.root / "notes.txt").write_text("not a segment\n")
    (store.root / ".validator").mkdir()
    (store.root / ".validator" / "checkpoint.json").write_text("{}")
    result = validate_store_duckdb(store.root, threads=1)
    assert result.anomalies == store.expected | {Anomaly.FOREIGN_FILE.value: 1}
    assert result.messages == {name: cluster["messages"] for name, cluster in store.clusters.items()}
    assert result.lines == store.lines and result.segments == store.segments
