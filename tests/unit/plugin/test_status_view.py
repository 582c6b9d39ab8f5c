"""The status document and its terminal rendering: every field, ages, held counts, the list view."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from broker_operator.kubectl_plugin.status_view import (
    SCHEMA,
    HeldCount,
    cluster_document,
    cluster_summary,
    format_age,
    render_cluster,
    render_cluster_list,
)
from tests.unit.plugin.support import cluster_body

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (59.9, "59s"), (60, "1m0s"), (192, "3m12s"), (900, "15m"), (18240, "5h4m"),
     (183600, "2d3h")],
)  # fmt: skip
def test_ages_read_like_kubectl(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_the_json_document_has_every_documented_field(body: dict[str, Any]) -> None:
    held = {"orders-0": HeldCount(2), "orders-1": HeldCount(None, "orders-1: no pod IP yet")}
    document = cluster_document(body, held, NOW)
    assert json.loads(json.dumps(document)) == document  # plain JSON, nothing a script cannot read
    assert document["schema"] == SCHEMA
    keys = ("name", "namespace", "account", "company", "phase", "active", "epoch")
    assert {k: document[k] for k in keys} == {
        "name": "orders", "namespace": "shop", "account": "acme", "company": "1000", "phase": "Healthy",
        "active": "orders-0", "epoch": 3,
    }  # fmt: skip
    assert document["failovers"] == 1
    assert document["lastFailover"]["to"] == "orders-0"
    assert document["ordering"] is None
    assert document["heldTotal"] == 2  # the active's count: it holds what is held now
    # Priority order, whatever order status lists them in.
    assert [b["name"] for b in document["brokers"]] == ["orders-0", "orders-1"]
    first, second = document["brokers"]
    assert first == {
        "name": "orders-0", "priority": 0, "state": "Active", "unavailabilityCode": None,
        "unavailabilityMessage": None, "lastHeartbeatTime": "2026-11-23T11:59:55.000000Z",
        "lastHeartbeatAgeSeconds": 5.0, "active": True, "held": 2, "heldError": None,
    }  # fmt: skip
    assert (second["held"], second["heldError"]) == (None, "orders-1: no pod IP yet")


def test_the_held_total_is_the_actives_count_and_all_known_without_an_answer_from_it(
    body: dict[str, Any],
) -> None:
    # A standby answers from its own journal (what it held when last active): not held now.
    both = {"orders-0": HeldCount(2), "orders-1": HeldCount(5)}
    assert cluster_document(body, both, NOW)["heldTotal"] == 2
    silent_active = {"orders-0": HeldCount(None, "unreachable"), "orders-1": HeldCount(5)}
    assert cluster_document(body, silent_active, NOW)["heldTotal"] == 5
    assert cluster_document(body, {}, NOW)["heldTotal"] is None


def test_without_held_counts_they_are_null_not_zero(body: dict[str, Any]) -> None:
    document = cluster_document(body, None, NOW)
    assert document["heldTotal"] is None
    assert all(b["held"] is None for b in document["brokers"])


def test_the_terminal_view_shows_header_and_broker_table(body: dict[str, Any]) -> None:
    body["status"]["ordering"] = {
        "lastCheckTime": "2026-11-23T11:58:00Z", "result": "Passed", "violations": 0,
        "report": "pvc/message-log/.validator/reports/report.html",
    }  # fmt: skip
    text = render_cluster(
        cluster_document(body, {"orders-0": HeldCount(0), "orders-1": HeldCount(1)}, NOW), NOW
    )
    lines = text.splitlines()
    assert lines[0] == "Cluster:    orders (namespace shop)"
    assert "Phase:      Healthy" in lines
    assert "Active:     orders-0, epoch 3" in lines
    assert "Failovers:  1, last 1h0m ago: orders-1 -> orders-0 (ActiveUnavailable, 812 ms)" in lines
    ordering = "Passed, 0 violations, checked 2m0s ago; report pvc/message-log/.validator/reports/report.html"
    assert f"Ordering:   {ordering}" in lines
    assert "Condition:  SpecValid=True" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == [
        "BROKER",
        "PRIORITY",
        "STATE",
        "CODE",
        "LAST",
        "HEARTBEAT",
        "(recorded)",
        "HELD",
    ]
    assert table[1].split() == ["*orders-0", "0", "Active", "-", "5s", "ago", "0"]
    assert table[2].split() == ["orders-1", "1", "Inactive", "-", "10s", "ago", "1"]


def test_an_unavailable_broker_shows_its_code_and_why() -> None:
    body = cluster_body(
        phase="Unavailable",
        active=None,
        brokers=[{"name": "orders-0", "priority": 0, "state": "Unavailable",
                  "unavailabilityCode": "BACKEND_UNREACHABLE", "lastHeartbeatTime": None,
                  "unavailabilityMessage": "cannot reach the backend at http://b:8081"}],
    )  # fmt: skip
    body["spec"]["preferredActive"] = "orders-0"
    text = render_cluster(cluster_document(body, None, NOW), NOW)
    assert "Active:     none, epoch 3 (spec.preferredActive asks for orders-0)" in text
    row = next(line for line in text.splitlines() if "orders-0" in line and "BACKEND" in line)
    assert row.split() == ["orders-0", "0", "Unavailable", "BACKEND_UNREACHABLE", "-", "-"]
    assert "  orders-0: BACKEND_UNREACHABLE: cannot reach the backend at http://b:8081" in text


def test_a_cluster_without_status_yet_reads_plainly() -> None:
    body = cluster_body()
    body["status"] = {}
    text = render_cluster(cluster_document(body, {}, NOW), NOW)
    assert "Phase:      (no status yet)" in text
    assert "No broker has reported yet" in text
    assert "not checked yet" in text


def test_the_list_has_one_line_per_cluster(body: dict[str, Any]) -> None:
    other = cluster_body(phase="Degraded", active="billing-1", epoch=7, failovers=0, lastFailover=None)
    other["metadata"] = {"name": "billing", "namespace": "finance"}
    other["status"]["brokers"][0]["state"] = "Unavailable"
    summaries = [cluster_summary(b, NOW) for b in (body, other)]
    lines = render_cluster_list(summaries, NOW, with_namespace=True).splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "PHASE", "ACTIVE", "EPOCH", "BROKERS", "FAILOVERS", "LAST", "FAILOVER",
        "ORDERING",
    ]  # fmt: skip
    assert lines[1].split() == ["shop", "orders", "Healthy", "orders-0", "3", "2/2", "1", "1h0m", "-"]
    assert lines[2].split() == ["finance", "billing", "Degraded", "billing-1", "7", "1/2", "0", "-", "-"]
    assert render_cluster_list([], NOW, with_namespace=False) == "No BrokerClusters found."


def test_certificates_show_their_end_and_what_each_broker_serves() -> None:
    tls = {
        "mode": "Operator",
        "certificates": [
            {"name": "ca", "secret": "orders-ca", "serial": "1a", "notAfter": "2036-11-23T12:00:00Z"},
            {"name": "server", "secret": "orders-tls", "serial": "2b", "notAfter": "2026-11-23T10:00:00Z"},
        ],
        "served": [{"broker": "orders-0", "serial": "2b"}],
    }
    body = cluster_body(tls=tls)
    document = cluster_document(body, None, NOW)
    certificates = document["tls"]["certificates"]
    assert [c["name"] for c in certificates] == ["ca", "server"]
    assert certificates[1]["secondsLeft"] == -7200.0  # ended two hours before NOW
    assert certificates[0]["secondsLeft"] > 0
    text = render_cluster(document, NOW)
    assert "TLS:        Operator" in text
    server_row = next(line for line in text.splitlines() if line.startswith("server"))
    assert (
        "EXPIRED 2h0m ago" in server_row
        and "2026-11-23T10:00:00Z" in server_row
        and "orders-tls" in server_row
    )
    assert "Served:     orders-0 2b" in text
    assert cluster_document(cluster_body(), None, NOW)["tls"] is None
    assert "TLS:" not in render_cluster(cluster_document(cluster_body(), None, NOW), NOW)
