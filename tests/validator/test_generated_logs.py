"""The Spark checks on generated histories (``broker_validator.synthetic``): many failovers and
crashes and no false alarm; each anomaly class injected alone found exactly, with its records;
and incremental runs over an extended store that agree with a full run."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker_validator.job import validate_store
from broker_validator.report_schema import Anomaly, Report
from broker_validator.synthetic import INJECTABLE, GeneratedStore, extend_store, generate_store

MAX_EXAMPLES_CHECKED = 5


def generate(root: Path, inject: dict[str, int] | None = None, **options: int) -> GeneratedStore:
    settings = {"records": 6_000, "streams": 6, "brokers": 3, "failovers": 5, "crashes": 2, "seed": 11}
    return generate_store(root / "store", inject=inject or {}, **(settings | options))  # type: ignore[arg-type]


def validate(spark: SparkSession, store: GeneratedStore, *, full: bool = True) -> Report:
    return validate_store(
        spark, store.root, store.root.parent / "report", full=full, settle_seconds=store.settle_seconds
    )


def test_generated_history_with_many_failovers_and_crashes_is_clean(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = generate(tmp_path, failovers=12, crashes=4, clusters=2)
    report = validate(spark, store)
    assert report["result"] == "Passed"
    assert report["anomalies"] == store.expected
    for name, cluster in store.clusters.items():
        assert report["clusters"][name]["messages"] == cluster["messages"]
        assert len(report["clusters"][name]["failovers"]) == cluster["failovers"]


@pytest.mark.parametrize("kind", INJECTABLE)
def test_each_class_injected_alone_is_found_exactly_with_its_records(
    spark: SparkSession, tmp_path: Path, kind: str
) -> None:
    store = generate(tmp_path, {kind: 3})
    report = validate(spark, store)
    assert report["anomalies"] == store.expected
    assert report["anomalies"][kind] == 3
    if kind == Anomaly.MALFORMED:
        bad = {p["segment"] for p in report["problems"] if p["lines"]}
        assert bad == {i.segment for i in store.injected if i.anomaly == kind}
        return
    if kind == Anomaly.SPLIT_BRAIN:  # the proof is the stale epoch's last work, named by broker and epoch
        proofs = {
            (name, e["broker"], e["epoch"])
            for name, cluster in report["clusters"].items()
            for e in cluster["examples"][kind]
        }
        assert proofs == {(i.cluster, i.broker, i.epoch) for i in store.injected if i.anomaly == kind}
        return
    found = {
        (name, e["direction"], e["stream"], e["seq"])
        for name, cluster in report["clusters"].items()
        for e in cluster["examples"][kind]
    }
    expected = {(i.cluster, i.direction, i.stream, i.seq) for i in store.injected if i.anomaly == kind}
    assert found == expected


def test_incremental_runs_over_an_extended_store_agree_with_a_full_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = generate(tmp_path, {"duplicate-delivery": 1})
    first = validate(spark, store, full=False)
    assert first["run"]["mode"] == "full" and first["anomalies"] == store.expected
    extended = extend_store(
        store.root, store, records=2_000, failovers=2, crashes=1, inject={"gap": 1, "lost": 1}
    )
    second = validate(spark, extended, full=False)
    assert second["run"]["mode"] == "incremental"
    assert second["run"]["segmentsRead"] == extended.segments - store.segments
    assert second["anomalies"] == extended.expected
    assert validate(spark, extended)["anomalies"] == second["anomalies"]
