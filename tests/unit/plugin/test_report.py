"""``report``: the verdict from status.ordering, and report.json found (or explained) from its location."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from broker_operator.kubectl_plugin.report import render_report, report_document, report_json_path
from tests.unit.plugin.support import cluster_body

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
CLAIM_LOCATION = "pvc/message-log/.validator/reports/report.html"


def ordered(location: str) -> dict:
    return cluster_body(
        ordering={
            "lastCheckTime": "2026-11-23T11:45:00Z",
            "result": "Failed",
            "violations": 2,
            "report": location,
        }
    )


def test_report_json_is_next_to_the_html(tmp_path: Path) -> None:
    assert report_json_path("/reports/report.html", None) == Path("/reports/report.json")
    assert report_json_path("/reports", None) == Path("/reports/report.json")
    assert report_json_path(CLAIM_LOCATION, None) is None
    assert report_json_path(CLAIM_LOCATION, tmp_path) == tmp_path / ".validator/reports/report.json"
    assert report_json_path("relative/report.html", None) is None


def test_no_validator_run_yet_is_said_and_is_not_a_failure() -> None:
    document, problem = report_document(cluster_body(), None, show=False)
    assert (document["ordering"], document["reportLocation"], problem) == (None, None, None)
    assert render_report(document, NOW).startswith("No ordering check recorded for orders yet")
    _, problem = report_document(cluster_body(), None, show=True)
    assert problem == "no validator run has recorded a report for this cluster yet"


def test_a_claim_location_without_the_claim_mounted_explains_kubectl_cp() -> None:
    document, problem = report_document(ordered(CLAIM_LOCATION), None, show=True)
    assert document["ordering"]["result"] == "Failed"
    assert document["report"] is None
    assert problem is not None
    assert "PersistentVolumeClaim message-log (namespace shop) at .validator/reports/" in problem
    assert "kubectl cp shop/POD:MOUNT_PATH/.validator/reports/report.json report.json" in problem
    text = render_report(document, NOW)
    assert "Result:       Failed" in text and "Violations:   2" in text
    assert "Checked:      2026-11-23T11:45:00Z (15m ago)" in text
    assert f"Report:       {CLAIM_LOCATION}" in text


def test_show_reads_report_json_under_the_claim_dir(tmp_path: Path) -> None:
    reports = tmp_path / ".validator" / "reports"
    reports.mkdir(parents=True)
    report = {
        "schemaVersion": 1,
        "result": "Failed",
        "clusters": {"orders": {"result": "Failed", "violations": 2}},
    }
    (reports / "report.json").write_text(json.dumps(report))
    document, problem = report_document(ordered(CLAIM_LOCATION), tmp_path, show=True)
    assert problem is None
    assert document["report"] == report
    assert document["reportJson"] == str(reports / "report.json")
    text = render_report(document, NOW)
    assert '"violations": 2' in text  # this cluster's section of the report


def test_a_local_path_that_is_gone_says_so(tmp_path: Path) -> None:
    _, problem = report_document(ordered(str(tmp_path / "report.html")), None, show=True)
    assert problem is not None and problem.startswith(f"{tmp_path / 'report.json'} does not exist")
