"""The checks on hand-written histories: each anomaly alone is found exactly, and crashes are not
false alarms. Real Spark (``local[2]``), real files; the histories are small so the rule under test
is plain to read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker_validator.job import validate_store
from broker_validator.report_schema import VIOLATIONS, Anomaly, Report
from tests.validator.logbuilder import History, reseal, write_sealed

CORRUPT = "corrupt-segment"  # a class of schema version 2


def found(report: Report, cluster: str = "c1") -> dict[str, int]:
    return {k: v for k, v in report["clusters"][cluster]["anomalies"].items() if v}


def run(spark: SparkSession, store: Path, **kwargs: object) -> Report:
    return validate_store(spark, store, store.parent / "report", **kwargs)  # type: ignore[arg-type]


def clean_start(history: History, *, upto: int = 10) -> None:
    history.log("activated", "b0", 1)
    history.relay("b0", 1, "s1", range(1, upto + 1))


def test_clean_history_with_planned_failover_and_crash_passes(spark: SparkSession, tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=20)
    h.relay("b0", 1, "in1", range(1, 6), direction="inbound")
    h.log("deactivated", "b0", 1)
    h.tick(50)
    h.log("activated", "b1", 2)
    h.relay("b1", 2, "s1", range(21, 41))
    # b1 is killed after the cloud took seq 41 but before it logged the delivery.
    h.log("accepted", "b1", 2, "outbound", "s1", 41)
    h.log("forwarded", "b1", 2, "outbound", "s1", 41, attempt=1)
    h.tick(3000)
    h.log("activated", "b2", 3)
    h.log("accepted", "b2", 3, "outbound", "s1", 41)  # the backend resends it
    h.log("deduplicated", "b2", 3, "outbound", "s1", 41)  # the cloud had it: proof of delivery
    h.log("confirmed", "b2", 3, "outbound", "s1", 41)
    h.relay("b2", 3, "s1", range(42, 51))
    h.relay("b2", 3, "in1", range(6, 11), direction="inbound")
    h.close()

    report = run(spark, h.store, full=True)

    assert report["result"] == "Passed", report["clusters"]["c1"]["examples"]
    assert found(report) == {Anomaly.DEDUPLICATED: 1, Anomaly.CRASHED_TERM: 1}
    cluster = report["clusters"]["c1"]
    assert cluster["messages"] == {"outbound": 50, "inbound": 10}
    assert [(f["fromBroker"], f["toBroker"], f["toEpoch"]) for f in cluster["failovers"]] == [
        ("b0", "b1", 2),
        ("b1", "b2", 3),
    ]
    assert [(t["broker"], t["ended"]) for t in cluster["terms"]] == [
        ("b0", "deactivated"),
        ("b1", "crashed"),
        ("b2", "open"),
    ]
    assert cluster["latencyMs"]["outbound"]["count"] == 50
    assert (h.store.parent / "report" / "report.json").is_file()
    assert (h.store.parent / "report" / "report.html").is_file()


def test_lost_message_is_found_alone_once_older_than_the_settle_horizon(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=4)
    h.relay("b0", 1, "s1", range(5, 6), delivered=False)  # accepted, never delivered
    h.relay("b0", 1, "s1", range(6, 10))
    h.close()
    young = run(spark, h.store, full=True, settle_seconds=60)
    assert found(young) == {Anomaly.IN_FLIGHT: 1}
    assert young["result"] == "Passed"

    h.tick(61_000)
    h.relay("b0", 1, "s2", range(1, 2))  # the cluster's clock moves on
    h.close()
    old = run(spark, h.store, full=True, settle_seconds=60)
    assert found(old) == {Anomaly.LOST: 1}
    (lost,) = old["clusters"]["c1"]["examples"]["lost"]
    assert (lost["stream"], lost["seq"], lost["broker"], lost["epoch"]) == ("s1", 5, "b0", 1)
    assert old["result"] == "Failed" and old["violations"] == 1


def test_duplicate_delivery_is_found_alone(spark: SparkSession, tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    clean_start(h)
    h.log("delivered", "b0", 1, "outbound", "s1", 7)  # the target took seq 7 a second time
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report) == {Anomaly.DUPLICATE_DELIVERY: 1}
    (dup,) = report["clusters"]["c1"]["examples"]["duplicate-delivery"]
    assert (dup["stream"], dup["seq"]) == ("s1", 7)


def test_swapped_deliveries_are_one_out_of_order_and_no_gap(spark: SparkSession, tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=4)
    h.log("accepted", "b0", 1, "outbound", "s1", 5)
    h.log("accepted", "b0", 1, "outbound", "s1", 6)
    h.tick()
    h.log("delivered", "b0", 1, "outbound", "s1", 6)  # same batch, same ts: only the line order tells
    h.log("delivered", "b0", 1, "outbound", "s1", 5)
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report) == {Anomaly.OUT_OF_ORDER: 1}
    (late,) = report["clusters"]["c1"]["examples"]["out-of-order"]
    assert late["seq"] == 5 and "after seq 6" in late["detail"]


def test_a_seq_never_seen_is_a_gap_with_the_delivery_that_skipped_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=4)
    h.relay("b0", 1, "s1", range(7, 9))  # 5 and 6 were never accepted nor delivered
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report) == {Anomaly.GAP: 2}
    gaps = report["clusters"]["c1"]["examples"]["gap"]
    assert [(g["seq"], g["broker"]) for g in gaps] == [(5, "b0"), (6, "b0")]
    assert "seq 7 was delivered after seq 4" in gaps[0]["detail"]


def test_work_after_another_broker_took_a_higher_epoch_is_split_brain(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=5)
    h.log("activated", "b1", 2)  # b0 was never fenced...
    h.tick()
    h.relay("b0", 1, "s2", range(1, 3))  # ...and goes on delivering
    h.relay("b1", 2, "s1", range(6, 8))
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report) == {Anomaly.SPLIT_BRAIN: 1, Anomaly.CRASHED_TERM: 1}
    (proof,) = report["clusters"]["c1"]["examples"]["split-brain"]
    assert (proof["broker"], proof["epoch"]) == ("b0", 1) and "epoch 2" in proof["detail"]


def test_one_epoch_granted_to_two_brokers_is_split_brain(spark: SparkSession, tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.log("deactivated", "b0", 1)
    h.log("activated", "b1", 2)
    h.log("activated", "b2", 2)
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report)[Anomaly.SPLIT_BRAIN] == 1


def test_a_held_message_replayed_later_is_neither_a_gap_nor_out_of_order(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=4)
    h.log("accepted", "b0", 1, "outbound", "s1", 5)
    h.log("held", "b0", 1, "outbound", "s1", 5, attempt=5)  # onPoison: Hold, the stream goes on
    h.relay("b0", 1, "s1", range(6, 9))
    h.log("replayed", "b0", 1, "outbound", "s1", 5)
    h.log("delivered", "b0", 1, "outbound", "s1", 5)
    h.log("accepted", "b0", 1, "outbound", "s1", 9)
    h.log("held", "b0", 1, "outbound", "s1", 9, attempt=5)
    h.log("discarded", "b0", 1, "outbound", "s1", 9)
    h.relay("b0", 1, "s1", range(10, 12))
    h.close()
    report = run(spark, h.store, full=True)
    assert found(report) == {Anomaly.HELD: 2, Anomaly.DISCARDED: 1}
    assert report["result"] == "Passed"


def test_malformed_foreign_empty_and_open_files_are_reported_not_fatal(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    (segment,) = h.close()
    good = segment.read_bytes()
    segment = reseal(  # a broker's own bad lines: sealed with their checksum, so read as lines
        segment,
        good
        + b"not json at all\n"
        + b'{"event":"delivered","ts":"yesterday","cluster":"c1"}\n'
        + b'{"event":"delivered","ts":"2026-11-20T12:00:00.000000Z","cluster":"c1","broker":"b0",'
        + b'"epoch":"one"}\n'
        + b'{"event":"accepted","ts":"2026-11-20T12:00:0',  # torn last line
    )
    (h.store / "README.txt").write_text("not a segment")
    (h.store / "c1" / "b0" / "notes.txt").write_text("nor this")
    (h.store / "c1" / "b0" / "20261120T120000000000Z-000099-b0.jsonl").write_bytes(b"")
    (h.store / "c1" / "b0" / "20261120T120001000000Z-000100-b0.jsonl.open").write_text("{half")
    report = run(spark, h.store, full=True)
    assert report["result"] == "Passed"
    assert found(report) == {Anomaly.MALFORMED: 4}
    assert report["anomalies"][Anomaly.FOREIGN_FILE] == 2
    problems = {p["segment"]: p for p in report["problems"]}
    assert problems[segment.relative_to(h.store).as_posix()]["lines"] == 4
    assert set(problems) >= {"README.txt", "c1/b0/notes.txt", "c1/b0/20261120T120000000000Z-000099-b0.jsonl"}
    assert report["clusters"]["c1"]["messages"] == {"outbound": 3}


def test_incremental_run_reads_only_new_segments_and_finds_a_duplicate_across_the_boundary(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=10)
    h.close()
    first = run(spark, h.store)
    assert first["run"]["mode"] == "full" and first["result"] == "Passed"
    assert first["run"]["segmentsRead"] == 1

    h.relay("b0", 1, "s1", range(11, 15))
    h.log("delivered", "b0", 1, "outbound", "s1", 3)  # accepted and delivered in the first run's data
    h.close()
    second = run(spark, h.store)
    assert second["run"]["mode"] == "incremental"
    assert (second["run"]["segmentsRead"], second["run"]["segmentsKnown"]) == (1, 1)
    assert found(second) == {Anomaly.DUPLICATE_DELIVERY: 1}
    third = run(spark, h.store)  # nothing new: the verdict stands
    assert third["run"]["segmentsRead"] == 0 and found(third) == {Anomaly.DUPLICATE_DELIVERY: 1}

    full = run(spark, h.store, full=True)
    assert full["anomalies"] == second["anomalies"]
    assert full["clusters"]["c1"]["messages"] == second["clusters"]["c1"]["messages"] == {"outbound": 14}


def test_a_gap_filled_by_a_later_run_becomes_out_of_order_and_a_pending_message_delivered(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.log("accepted", "b0", 1, "outbound", "s1", 4)
    h.relay("b0", 1, "s1", range(5, 7))
    h.close()
    first = run(spark, h.store)
    assert found(first) == {Anomaly.IN_FLIGHT: 1}
    h.log("delivered", "b0", 1, "outbound", "s1", 4)
    h.close()
    second = run(spark, h.store)
    assert found(second) == {Anomaly.OUT_OF_ORDER: 1}
    assert second["clusters"]["c1"]["latencyMs"]["outbound"]["count"] == 6
    assert run(spark, h.store, full=True)["anomalies"] == second["anomalies"]


def test_a_crashed_brokers_segment_closed_late_is_no_false_alarm(spark: SparkSession, tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=5)
    h.close()
    h.log("delivered", "b0", 1, "outbound", "s1", 6)  # logged by b0, whose segment stays open
    h.log("accepted", "b0", 1, "outbound", "s1", 6)
    late = h.open.pop("b0")
    h.tick(3000)
    h.log("activated", "b1", 2)
    h.log("accepted", "b1", 2, "outbound", "s1", 6)
    h.log("deduplicated", "b1", 2, "outbound", "s1", 6)
    h.relay("b1", 2, "s1", range(7, 9))
    h.close()
    assert run(spark, h.store)["result"] == "Passed"
    h.open["b0"] = late  # b0 restarts and closes its leftover segment
    h.close()
    report = run(spark, h.store)
    assert report["result"] == "Passed", report["clusters"]["c1"]["examples"]
    assert report["clusters"]["c1"]["messages"] == {"outbound": 8}
    assert report["anomalies"] == run(spark, h.store, full=True)["anomalies"]


def test_a_run_that_cannot_write_its_report_leaves_the_checkpoint_as_it_was(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    run(spark, h.store)
    checkpoint = h.store / ".validator" / "checkpoint.json"
    before = checkpoint.read_bytes()
    h.relay("b0", 1, "s1", range(4, 6))
    h.close()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the report directory should be")
    with pytest.raises(OSError):
        validate_store(spark, h.store, blocked)
    assert checkpoint.read_bytes() == before
    assert run(spark, h.store)["run"]["segmentsRead"] == 1


def test_every_violation_class_fails_the_run() -> None:
    assert {a.value for a in VIOLATIONS} == {
        "lost",
        "duplicate-delivery",
        "out-of-order",
        "gap",
        "split-brain",
    }


# -- a store brokers of many clusters share (issue 39) ----------------------------------------------


def test_a_bad_file_is_reported_and_every_run_after_it_still_succeeds(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A segment-named symlink out of the store, a FIFO and a directory named like segments: none is
    followed, opened or fatal; the next runs succeed too (a symlink once made every run raise)."""
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"not a record\n")
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    directory = h.store / "c1" / "b0"
    (directory / "20261120T130000000000Z-000050-b0.jsonl").symlink_to(outside)
    os.mkfifo(directory / "20261120T130001000000Z-000051-b0.jsonl")
    (directory / "20261120T130002000000Z-000052-b0.jsonl").mkdir()
    for _ in range(2):
        report = run(spark, h.store)
        assert report["result"] == "Passed"
        assert report["anomalies"][Anomaly.FOREIGN_FILE] == 3
        assert found(report) == {}
        assert report["clusters"]["c1"]["messages"] == {"outbound": 3}
        assert {p["segment"] for p in report["problems"]} >= {
            "c1/b0/20261120T130000000000Z-000050-b0.jsonl",
            "c1/b0/20261120T130001000000Z-000051-b0.jsonl",
            "c1/b0/20261120T130002000000Z-000052-b0.jsonl",
        }


def test_records_behind_a_symlink_are_never_evidence(spark: SparkSession, tmp_path: Path) -> None:
    """The symlink points at a segment of another store, full of deliveries: none of them counts."""
    other = History(tmp_path / "other", cluster="c1")
    clean_start(other, upto=50)
    (elsewhere,) = other.close()
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    (h.store / "c1" / "b0" / elsewhere.name.replace("-000000-", "-000077-")).symlink_to(elsewhere)
    report = run(spark, h.store, full=True)
    assert report["clusters"]["c1"]["messages"] == {"outbound": 3}
    assert report["anomalies"][Anomaly.FOREIGN_FILE] == 1


def test_a_segment_altered_after_closing_is_corrupt_its_records_ignored_and_it_is_read_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    h.relay("b0", 1, "s1", range(4, 7))
    (later,) = h.close()
    data = later.read_bytes()
    later.write_bytes(data.replace(b'"seq":5,', b'"seq":9,'))  # same size, other bytes
    first = run(spark, h.store)
    assert first["result"] == "Passed"
    assert found(first) == {CORRUPT: 1}
    assert first["clusters"]["c1"]["messages"] == {"outbound": 3}  # nothing of the altered segment
    (problem,) = [p for p in first["problems"] if p["segment"].endswith(later.name)]
    assert "sha256" in problem["example"]
    again = run(spark, h.store)  # recorded as seen: not read again, still reported
    assert again["run"]["segmentsRead"] == 0 and found(again) == {CORRUPT: 1}


def test_records_naming_another_cluster_never_reach_its_verdict(spark: SparkSession, tmp_path: Path) -> None:
    """A broker of c1 can write only into c1's directory; what it writes there about c2 is no
    evidence for c2 (whose status.ordering it would otherwise decide) and is malformed for c1."""
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    forger = History(tmp_path / "forged", cluster="c2")
    forger.log("activated", "b0", 1)
    forger.relay("b0", 1, "s1", range(1, 3))
    forger.log("delivered", "b0", 1, "outbound", "s1", 1)  # would be a duplicate delivery in c2
    (forged,) = forger.close()
    write_sealed(h.store / "c1" / "b0" / "20261120T140000000000Z-000090-b0", forged.read_bytes())
    report = run(spark, h.store, full=True)
    assert set(report["clusters"]) == {"c1"}
    assert found(report) == {Anomaly.MALFORMED: 10}
    assert report["clusters"]["c1"]["messages"] == {"outbound": 3}


def test_an_oversize_segment_and_an_oversize_record_are_reported_not_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = History(tmp_path / "store")
    clean_start(h, upto=3)
    h.close()
    h.relay("b0", 1, "s1", range(4, 40))
    (big,) = h.close()
    h.log("accepted", "b0", 1, "outbound", "s" * 3000, 1)
    h.relay("b0", 1, "s1", range(40, 41))
    h.close()
    from broker_validator.limits import ReadLimits

    limits = ReadLimits(max_segment_bytes=big.stat().st_size - 1, max_record_bytes=2048)
    report = run(spark, h.store, limits=limits)
    assert report["anomalies"][Anomaly.FOREIGN_FILE] == 1
    assert found(report) == {Anomaly.MALFORMED: 1, Anomaly.GAP: 36}
    problems = {p["segment"]: p["example"] for p in report["problems"]}
    assert "--max-segment-bytes" in problems[big.relative_to(h.store).as_posix()]
