"""The controller's side of a pause, pure: the condition, its events, certificates due, the held spec.

``test_pause_kmock.py`` runs the same inside kopf against kmock; these pin the wording and the
rules (``controller/pause.py``) one case at a time.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker_operator.controller import pause
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.reconcile import ClusterRef
from broker_operator.controller.spec import parse_spec
from broker_operator.core.model import HeartbeatSettings
from broker_operator.core.pause import PAUSE_ANNOTATION
from broker_operator.kubectl_plugin.status_view import cluster_document, cluster_summary, render_cluster

NOW = datetime(2026, 11, 28, 15, 0, tzinfo=UTC)
SPEC = {"account": "acme", "company": "1000"}
HEALTHY = {
    "phase": "Healthy",
    "active": "orders-0",
    "epoch": 3,
    "activeEpoch": 3,
    "brokers": [{"name": "orders-0", "state": "Active"}, {"name": "orders-1", "state": "Inactive"}],
}


def ref(status: dict[str, Any], annotations: dict[str, str] | None = None) -> ClusterRef:
    meta = {"name": "orders", "namespace": "shop", "generation": 1, "annotations": annotations or {}}
    return ClusterRef("shop", "orders", {"metadata": meta, "spec": SPEC, "status": status}, status)


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """The events report_pause posts through kopf, as (type, reason, message)."""
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        pause.kopf, "info", lambda _b, reason, message: events.append(("Normal", reason, message))
    )
    monkeypatch.setattr(
        pause.kopf, "warn", lambda _b, reason, message: events.append(("Warning", reason, message))
    )
    return events


def condition(patch: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in patch["conditions"] if c["type"] == pause.CONDITION_PAUSED)


def test_the_condition_says_since_when_and_whether_the_active_still_serves(
    posted: list[tuple[str, str, str]],
) -> None:
    observations, spec = ClusterObservations(), parse_spec("orders", SPEC)
    patch: dict[str, Any] = {}
    assert pause.report_pause(ref(HEALTHY, {PAUSE_ANNOTATION: "true"}), patch, observations, spec, NOW)
    first = condition(patch)
    assert (first["status"], first["reason"], first["lastTransitionTime"]) == (
        "True",
        "Paused",
        "2026-11-28T15:00:00Z",
    )
    assert "orders-0 keeps its lease at epoch 3" in first["message"]
    assert [(t, r) for t, r, _ in posted] == [("Normal", "ReconciliationPaused")]

    # Later, the active died: the reason and message change, the transition time does not, and
    # the pause is not announced again.
    dead = {
        **HEALTHY,
        "brokers": [{"name": "orders-0", "state": "Unavailable", "unavailabilityCode": "POD_NOT_FOUND"}],
    }
    status = {**dead, "conditions": patch["conditions"]}
    later: dict[str, Any] = {}
    assert pause.report_pause(
        ref(status, {PAUSE_ANNOTATION: "true"}), later, observations, spec, NOW + timedelta(minutes=5)
    )
    second = condition(later)
    assert second["reason"] == "PausedActiveUnavailable"
    assert second["lastTransitionTime"] == "2026-11-28T15:00:00Z"
    assert "orders-0 is Unavailable (POD_NOT_FOUND) and is NOT failed over" in second["message"]
    assert len(posted) == 1

    # Nothing changed: nothing to write.
    status = {**dead, "conditions": later["conditions"]}
    unchanged: dict[str, Any] = {}
    pause.report_pause(
        ref(status, {PAUSE_ANNOTATION: "true"}), unchanged, observations, spec, NOW + timedelta(hours=1)
    )
    assert unchanged == {}

    # Resumed: False, Resumed, when and since when; and the event.
    resumed: dict[str, Any] = {}
    assert not pause.report_pause(ref(status), resumed, observations, spec, NOW + timedelta(hours=2))
    third = condition(resumed)
    assert (third["status"], third["reason"], third["lastTransitionTime"]) == (
        "False",
        "Resumed",
        "2026-11-28T17:00:00Z",
    )
    assert "paused since 2026-11-28T15:00:00Z" in third["message"]
    assert [r for _, r, _ in posted] == ["ReconciliationPaused", "ReconciliationResumed"]


def test_a_cluster_never_paused_gets_no_condition(posted: list[tuple[str, str, str]]) -> None:
    patch: dict[str, Any] = {}
    assert not pause.report_pause(ref(HEALTHY), patch, ClusterObservations(), parse_spec("orders", SPEC), NOW)
    assert patch == {} and posted == []


def test_a_value_other_than_true_or_false_does_not_pause_and_is_warned_once(
    posted: list[tuple[str, str, str]],
) -> None:
    observations = ClusterObservations()
    for _ in range(2):
        patch: dict[str, Any] = {}
        body = ref(HEALTHY, {PAUSE_ANNOTATION: "on"})
        assert not pause.report_pause(body, patch, observations, parse_spec("orders", SPEC), NOW)
    assert [(t, r) for t, r, _ in posted] == [("Warning", "InvalidPauseAnnotation")]


def test_no_active_is_said_plainly() -> None:
    reason, message = pause.pause_condition({"phase": "Pending"}, "2026-11-28T15:00:00Z", [])
    assert reason == "PausedNoActive" and "no broker is active, and none is activated" in message


def tls_status(**ends: datetime) -> dict[str, Any]:
    return {
        **HEALTHY,
        "tls": {
            "mode": "Operator",
            "certificates": [
                {"name": name, "secret": f"orders-{name}", "notAfter": end.strftime("%Y-%m-%dT%H:%M:%SZ")}
                for name, end in ends.items()
            ],
        },
    }


def test_a_certificate_whose_renewal_falls_due_while_paused_is_warned_and_named(
    posted: list[tuple[str, str, str]],
) -> None:
    spec = parse_spec("orders", SPEC)  # mode Operator: renewed renewBeforeDays before its end
    renew_before = spec.tls.certificates.renew_before_days
    status = tls_status(
        server=NOW + timedelta(days=renew_before - 1),  # due
        operatorClient=NOW + timedelta(days=renew_before + 1),  # not yet
        ca=NOW + timedelta(days=3650),
    )
    due = pause.certificates_due(status, spec, NOW)
    assert [name for name, _, _ in due] == ["server"]
    patch: dict[str, Any] = {}
    pause.report_pause(ref(status, {PAUSE_ANNOTATION: "true"}), patch, ClusterObservations(), spec, NOW)
    assert "due for renewal and not renewed while paused: server (ends " in condition(patch)["message"]
    (warning,) = [m for t, r, m in posted if r == "CertificateRenewalPaused"]
    assert "orders-server" in warning and "not renewed while reconciliation is paused" in warning
    # Mode Disabled: no certificate to speak of.
    disabled = parse_spec("orders", {**SPEC, "tls": {"mode": "Disabled"}})
    assert pause.certificates_due(status, disabled, NOW) == []


def test_the_engine_keeps_its_spec_while_paused_and_takes_the_new_one_on_resume() -> None:
    log = logging.getLogger("test")
    first = parse_spec("orders", SPEC)
    taken = pause.EngineSpec(first, HeartbeatSettings.from_spec(SPEC), paused=False)
    edited = {**SPEC, "preferredActive": "orders-1", "heartbeat": {"leaseSeconds": 20}}
    paused_body = {"metadata": {"name": "orders", "annotations": {PAUSE_ANNOTATION: "true"}}}
    taken.follow(paused_body, edited, None, log)
    assert taken.paused and taken.spec is first and taken.settings.lease_seconds == 10
    taken.follow({"metadata": {"name": "orders"}}, edited, None, log)
    assert not taken.paused
    assert taken.spec.preferred_active == "orders-1" and taken.settings.lease_seconds == 20
    # An invalid edit keeps what the engine has, paused or not.
    taken.follow({"metadata": {"name": "orders"}}, {**SPEC, "heartbeat": {"leaseSeconds": "x"}}, None, log)
    assert taken.settings.lease_seconds == 20


def test_kubectl_broker_status_shows_the_pause_first() -> None:
    body = {
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": SPEC,
        "status": {
            **HEALTHY,
            "conditions": [
                {
                    "type": "ReconciliationPaused",
                    "status": "True",
                    "reason": "Paused",
                    "message": "reconciliation paused since 2026-11-28T14:00:00Z",
                    "lastTransitionTime": "2026-11-28T14:00:00Z",
                }
            ],
        },
    }
    document = cluster_document(body, None, NOW)  # type: ignore[arg-type]
    assert document["reconciliationPaused"] == {
        "since": "2026-11-28T14:00:00Z",
        "reason": "Paused",
        "message": "reconciliation paused since 2026-11-28T14:00:00Z",
    }
    text = render_cluster(document, NOW)
    assert "Paused:     PAUSED since 2026-11-28T14:00:00Z (1h0m ago), Paused: reconciliation paused" in text
    assert cluster_summary(body, NOW)["paused"] is True  # type: ignore[arg-type]
    body["status"]["conditions"][0]["status"] = "False"
    assert cluster_document(body, None, NOW)["reconciliationPaused"] is None  # type: ignore[arg-type]
    assert "PAUSED" not in render_cluster(cluster_document(body, None, NOW), NOW)  # type: ignore[arg-type]
