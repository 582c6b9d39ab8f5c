"""The chart's alerts, exactly as ``helm template`` renders its PrometheusRule, checked and unit-tested
with promtool, in seconds (issue 43).

- ``promtool check rules`` on the rendered groups, and ``promtool test rules`` with
  ``alerts.test.yaml``: each alert fires in one case, with its exact labels and annotations, and
  stays quiet in another. BrokerClusterSplitBrain is proven there with series alone: the epochs
  and leases keep a real cluster from ever having two actives.
- Every alert has a severity of the allowed set, a summary, a description and a runbook_url that
  names a file of docs/runbooks; every metric its expression reads is one the code defines.
- The values that shape the rule: ``disabled``, ``for``, ``alertLabels``, ``runbookBaseURL``, and
  a typo in an alert's name failing the install.

Not here: that each alert fires against the real operator and brokers under a real Prometheus (the
e2e step that follows; docs/monitoring.md, "Tests").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.chart import (
    CHART,
    RUNBOOKS,
    SEVERITIES,
    alerts,
    defined_metric_names,
    documents,
    metric_names_in,
    promtool,
    render,
    rule_groups,
    write_rules,
)

pytestmark = pytest.mark.needs("tools")  # helm (make tools) and promtool (make monitoring-packages)

HERE = Path(__file__).parent
UNIT_TESTS = HERE / "alerts.test.yaml"
# The alert names of the rules' source, read without helm (which make test may still be building
# when the tests are collected); test_the_rules_come_from_one_file... checks they are the rendered ones.
SOURCE_ALERTS = [
    rule["alert"]
    for group in yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["groups"]
    for rule in group["rules"]
]


def test_nothing_of_monitoring_renders_by_default() -> None:
    """Off by default: the monitors and the rule need the Prometheus Operator's CRDs."""
    docs = documents()
    assert [d["kind"] for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")] == []
    assert not any(d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard") for d in docs)


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    rules = write_rules(rule_groups(), tmp_path / "rules.yaml")
    result = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass_on_the_rendered_rules(tmp_path: Path) -> None:
    write_rules(rule_groups(), tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = subprocess.run(
        [promtool(), "test", "rules", UNIT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_fail_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    """The promtool cases can fail: with one alert's threshold out of reach, its firing case does."""
    groups = rule_groups()
    for rule in groups[0]["rules"]:
        if rule["alert"] == "BrokerClusterSplitBrain":
            rule["expr"] = rule["expr"].replace("> 1", "> 2")
    write_rules(groups, tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = subprocess.run(
        [promtool(), "test", "rules", UNIT_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    report = result.stdout + result.stderr  # promtool writes the failures to stderr
    assert result.returncode != 0
    assert "alertname: BrokerClusterSplitBrain" in report
    assert report.count("alertname:") == 1, report


def test_every_alert_has_a_firing_case_with_exact_annotations_and_a_quiet_one() -> None:
    cases: dict[str, list[dict[str, Any]]] = {}
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(case)
    rendered = alerts()
    assert set(cases) == set(rendered)
    for name, rule in rendered.items():
        firing = [alert for case in cases[name] for alert in case["exp_alerts"]]
        assert firing, f"{name}: no case where it fires"
        assert any(not case["exp_alerts"] for case in cases[name]), f"{name}: no case where it stays quiet"
        for alert in firing:
            assert alert["exp_labels"]["severity"] == rule["labels"]["severity"], name
            assert set(alert["exp_annotations"]) == set(rule["annotations"]), name


@pytest.mark.parametrize("name", SOURCE_ALERTS)  # not alerts(): no helm at collection time
def test_each_alert_is_described_and_has_a_runbook(name: str) -> None:
    rule = alerts()[name]
    assert rule["labels"]["severity"] in SEVERITIES, rule["labels"]
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == f"docs/runbooks/{name}.md"  # runbookBaseURL's default
    runbook = RUNBOOKS / f"{name}.md"
    assert runbook.is_file(), f"runbook_url of {name} names {runbook}, which does not exist"
    text = runbook.read_text()
    for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation"):
        assert section in text, f"{runbook}: no {section!r}"
    assert "kubectl broker " in text and "kubectl " in text, f"{runbook}: no command to run"


def test_every_runbook_belongs_to_an_alert() -> None:
    """Or is listed in the runbooks' README under "Without an alert" (a situation no metric shows)."""
    readme = (RUNBOOKS / "README.md").read_text()
    without = set(re.findall(r"^\| \[(\w+)\]\(\1\.md\) \|", readme.partition("## Without an alert")[2], re.M))
    assert without == {"JournalVolumeLost"}
    assert {path.stem for path in RUNBOOKS.glob("*.md")} - {"README"} - without == set(alerts())


def test_every_metric_an_alert_reads_is_defined_by_the_code() -> None:
    defined = defined_metric_names()
    used = {name: metric_names_in(rule["expr"]) for name, rule in alerts().items()}
    assert all(used.values()), used
    unknown = {name: sorted(names - defined) for name, names in used.items() if names - defined}
    assert unknown == {}


def test_the_metric_name_reader_finds_selected_names_only() -> None:
    expr = (
        'sum by (a, b) (rate(x_total{c="d", e=~"$v"}[5m])) > 0 unless on (a) '
        "histogram_quantile(0.99, y_bucket) or vector(0) and time() - z"
    )
    assert metric_names_in(expr) == {"x_total", "y_bucket", "z"}


def test_alerts_can_be_left_out_relabelled_and_given_other_durations() -> None:
    shaped = alerts(
        "monitoring.prometheusRule.disabled={BrokerClusterDegraded,BrokerHeldMessagesGrowing}",
        "monitoring.prometheusRule.for.BrokerClusterNoActiveBroker=15s",
        "monitoring.prometheusRule.alertLabels.team=sap-integration",
        "monitoring.prometheusRule.alertLabels.severity=info",
        "monitoring.prometheusRule.runbookBaseURL=https://wiki.example/runbooks/",
    )
    assert set(alerts()) - set(shaped) == {"BrokerClusterDegraded", "BrokerHeldMessagesGrowing"}
    assert shaped["BrokerClusterNoActiveBroker"]["for"] == "15s"
    assert shaped["BrokerClusterSplitBrain"]["for"] == alerts()["BrokerClusterSplitBrain"]["for"]
    for name, rule in shaped.items():
        # Extra labels are added; an alert's own severity is never overridden by them.
        assert rule["labels"] == {"severity": alerts()[name]["labels"]["severity"], "team": "sap-integration"}
        assert rule["annotations"]["runbook_url"] == f"https://wiki.example/runbooks/{name}.md"


@pytest.mark.parametrize("value", ["disabled={BrokerClusterNoActive}", "for.BrokerSplitBrain=1m"])
def test_a_name_that_is_no_alert_fails_the_install(value: str) -> None:
    result = render(
        "monitoring.prometheusRule.enabled=true", f"monitoring.prometheusRule.{value}", check=False
    )
    assert result.returncode != 0
    assert "is not an alert of this chart" in result.stderr, result.stderr


def test_the_rules_come_from_one_file_with_every_parameter_filled() -> None:
    source = (CHART / "files" / "alerts.yaml").read_text()
    rendered = yaml.safe_dump(
        rule_groups("operator.shards=3", "monitoring.prometheusRule.verdictMaxAgeSeconds=7200")
    )
    assert "${" not in rendered
    names = [rule["alert"] for group in yaml.safe_load(source)["groups"] for rule in group["rules"]]
    assert names == list(alerts())
    operator_down = alerts("operator.shards=3")["BrokerFailoverOperatorDown"]["expr"]
    assert 'up{job="bf-broker-failover-metrics", namespace="bf-system"}' in operator_down
    assert operator_down.rstrip().endswith("< 3")
    stale = alerts("monitoring.prometheusRule.verdictMaxAgeSeconds=7200")["BrokerClusterOrderingVerdictStale"]
    assert stale["expr"].rstrip().endswith("> 7200")


def test_docs_list_every_alert_with_its_severity_and_for() -> None:
    """docs/monitoring.md's table says what the chart renders by default."""
    table = (RUNBOOKS.parent / "monitoring.md").read_text()
    rows = {
        match.group(1): (match.group(2), match.group(3))
        for match in re.finditer(r"^\| \[(\w+)\]\(runbooks/\1\.md\) \| (\w+) \| (\w+) \|", table, flags=re.M)
    }
    assert rows == {name: (rule["labels"]["severity"], rule["for"]) for name, rule in alerts().items()}
