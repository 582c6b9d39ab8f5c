"""``kubectl broker status``: the status document (``-o json``) and how it reads on a terminal.

Pure: a BrokerCluster body, the held counts the caller gathered and the current time in, a JSON
document or text out; no I/O, so the unit tests pin every line. The JSON document is the stable
interface for scripts (``SCHEMA`` names its version, docs/kubectl-plugin.md lists its fields): keys
are only ever added. The terminal text is for people and may change.

Heartbeat ages are read from ``brokers[].lastHeartbeatTime``, which the operator refreshes only
when some other status field changes (never once per heartbeat, docs/crd.md); the text says
"recorded" for that reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from broker_operator.controller.bodies import BrokerClusterBody

SCHEMA: Final = "kubectl-broker/status/v1"
NONE: Final = "-"


@dataclass(frozen=True)
class HeldCount:
    """Held messages one broker reported, or why the count is missing (``error``)."""

    count: int | None
    error: str | None = None


def status_of(body: BrokerClusterBody) -> Mapping[str, Any]:
    """``status`` with every field the CRD declares (the controller's TypedDict names only its own)."""
    return dict(body.get("status") or {})


def parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def age_seconds(text: object, now: datetime) -> float | None:
    moment = parse_time(text)
    return None if moment is None else max(0.0, (now - moment).total_seconds())


def format_age(seconds: float | None) -> str:
    """kubectl's short ages: ``45s``, ``3m12s``, ``5h4m``, ``2d3h``; ``-`` when unknown."""
    if seconds is None:
        return NONE
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 600:
        return f"{whole // 60}m{whole % 60}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{(whole % 3600) // 60}m"
    return f"{whole // 86400}d{(whole % 86400) // 3600}h"


def cluster_document(
    body: BrokerClusterBody, held: Mapping[str, HeldCount] | None, now: datetime
) -> dict[str, Any]:
    """The ``-o json`` object of one cluster. ``held`` None: counts were not asked for (``--no-held``)."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    status = status_of(body)
    brokers = []
    for broker in sorted(
        status.get("brokers") or [], key=lambda b: (b.get("priority", 0), b.get("name", ""))
    ):
        name = str(broker.get("name"))
        count = (held or {}).get(name)
        brokers.append(
            {
                "name": name,
                "priority": broker.get("priority"),
                "state": broker.get("state"),
                "unavailabilityCode": broker.get("unavailabilityCode"),
                "unavailabilityMessage": broker.get("unavailabilityMessage"),
                "lastHeartbeatTime": broker.get("lastHeartbeatTime"),
                "lastHeartbeatAgeSeconds": _rounded(age_seconds(broker.get("lastHeartbeatTime"), now)),
                "active": name == status.get("active"),
                "held": count.count if count else None,
                "heldError": count.error if count else None,
            }
        )
    ordering = status.get("ordering")
    return {
        "schema": SCHEMA,
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "account": spec.get("account"),
        "company": spec.get("company"),
        "phase": status.get("phase"),
        "active": status.get("active"),
        "epoch": status.get("epoch"),
        "failovers": status.get("failovers", 0),
        "preferredActive": spec.get("preferredActive"),
        "failback": spec.get("failback"),
        "lastFailover": dict(status["lastFailover"]) if status.get("lastFailover") else None,
        "ordering": dict(ordering) if ordering else None,
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")}
            for c in status.get("conditions") or []
        ],
        "conflictsWith": status.get("conflictsWith"),
        "reconciliationPaused": _paused_document(status),
        "heldTotal": _held_total(brokers) if held is not None else None,
        "brokers": brokers,
        "tls": _tls_document(status.get("tls"), now),
    }


# The operator's condition while broker.failover.dev/pause-reconciliation is "true" (docs/pause.md).
CONDITION_PAUSED: Final = "ReconciliationPaused"


def _paused_document(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """Since when, and why, reconciliation is paused (the condition while True); None otherwise."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == CONDITION_PAUSED and condition.get("status") == "True":
            return {
                "since": condition.get("lastTransitionTime"),
                "reason": condition.get("reason"),
                "message": condition.get("message"),
            }
    return None


def _tls_document(tls: object, now: datetime) -> dict[str, Any] | None:
    """``status.tls`` with each certificate's time left; None before the operator reported it."""
    if not isinstance(tls, Mapping):
        return None
    certificates = []
    for entry in tls.get("certificates") or []:
        if not isinstance(entry, Mapping):
            continue
        end = parse_time(entry.get("notAfter"))
        left = None if end is None else round((end - now).total_seconds(), 1)
        certificates.append(
            {
                "name": entry.get("name"),
                "secret": entry.get("secret"),
                "serial": entry.get("serial"),
                "notAfter": entry.get("notAfter"),
                "secondsLeft": left,
            }
        )
    served = [
        {"broker": s.get("broker"), "serial": s.get("serial")}
        for s in tls.get("served") or []
        if isinstance(s, Mapping)
    ]
    return {"mode": tls.get("mode"), "certificates": certificates, "served": served}


def _held_total(brokers: Sequence[Mapping[str, Any]]) -> int | None:
    """Held messages on the active broker (the one that holds them now, docs/broker.md), else all known."""
    active = [b for b in brokers if b["active"] and b["held"] is not None]
    counted = active or [b for b in brokers if b["held"] is not None]
    return sum(b["held"] for b in counted) if counted else None


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def render_cluster(document: Mapping[str, Any], now: datetime) -> str:
    """The terminal view of one cluster: a header of facts, then one row per broker."""
    rows: list[tuple[str, str]] = [
        ("Cluster", f"{document['name']} (namespace {document['namespace']})"),
        ("Pair", f"account {document['account']}, company {document['company']}"),
        ("Phase", str(document["phase"] or "(no status yet)")),
        *_paused_rows(document, now),
        ("Active", _active_line(document)),
        ("Failovers", _failover_line(document, now)),
        ("Ordering", _ordering_line(document, now)),
    ]
    if document.get("conflictsWith"):
        rows.append(("Conflict", f"another BrokerCluster, {document['conflictsWith']}, serves this pair"))
    for condition in document["conditions"]:
        text = f"{condition['type']}={condition['status']}"
        if condition.get("status") != "True" and condition.get("message"):
            text += f" ({condition.get('reason')}: {condition['message']})"
        rows.append(("Condition", text))
    lines = [f"{label + ':':<12}{value}" for label, value in rows]
    lines.append("")
    lines += broker_table(document["brokers"])
    problems = [
        f"  {b['name']}: {b['unavailabilityCode'] or b['state']}: {b['unavailabilityMessage']}"
        for b in document["brokers"]
        if b.get("unavailabilityMessage")
    ]
    if problems:
        lines += ["", "Why brokers are not available:", *problems]
    missing = sorted({b["heldError"] for b in document["brokers"] if b.get("heldError")})
    if missing:
        lines += ["", "Held counts missing:", *(f"  {m}" for m in missing)]
    lines += certificate_lines(document.get("tls"))
    return "\n".join(lines)


def _paused_rows(document: Mapping[str, Any], now: datetime) -> list[tuple[str, str]]:
    """A ``Paused`` row while reconciliation is paused: a person must see that the operator will
    not fail over, before anything else about the brokers."""
    paused = document.get("reconciliationPaused")
    if not paused:
        return []
    since = paused.get("since")
    when = f"since {since} ({format_age(age_seconds(since, now))} ago)" if since else "yes"
    return [("Paused", f"PAUSED {when}, {paused.get('reason')}: {paused.get('message')}")]


def format_left(seconds: float | None) -> str:
    """Time left before an end: ``in 89d23h``, or ``EXPIRED 2h ago``; ``-`` when unknown."""
    if seconds is None:
        return NONE
    return f"in {format_age(seconds)}" if seconds > 0 else f"EXPIRED {format_age(-seconds)} ago"


def certificate_lines(tls: Mapping[str, Any] | None) -> list[str]:
    """The TLS mode, one row per certificate (its end first: what a person checks), what each
    broker serves; nothing before the operator reported ``status.tls``."""
    if not tls:
        return []
    lines = ["", f"TLS:        {tls.get('mode') or NONE}"]
    certificates = tls.get("certificates") or []
    if certificates:
        header = ("CERTIFICATE", "ENDS", "NOT AFTER", "SERIAL", "SECRET")
        rows = [
            (
                str(c["name"]),
                format_left(c["secondsLeft"]),
                str(c["notAfter"] or NONE),
                str(c["serial"] or NONE),
                str(c["secret"] or NONE),
            )
            for c in certificates
        ]
        lines += table([header, *rows])
    served = ", ".join(f"{s['broker']} {s['serial']}" for s in tls.get("served") or [])
    if served:
        lines.append(f"Served:     {served}")
    return lines


def broker_table(brokers: Sequence[Mapping[str, Any]]) -> list[str]:
    if not brokers:
        return ["No broker has reported yet (status.brokers is empty)."]
    header = ("BROKER", "PRIORITY", "STATE", "CODE", "LAST HEARTBEAT (recorded)", "HELD")
    rows = [
        (
            ("*" if b["active"] else " ") + str(b["name"]),
            str(b["priority"]),
            str(b["state"]),
            str(b["unavailabilityCode"] or NONE),
            format_age(b["lastHeartbeatAgeSeconds"])
            + (" ago" if b["lastHeartbeatAgeSeconds"] is not None else ""),
            NONE if b["held"] is None else str(b["held"]),
        )
        for b in brokers
    ]
    return table([(" " + header[0], *header[1:]), *rows])


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, three spaces apart, as kubectl prints (no trailing blanks)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _active_line(document: Mapping[str, Any]) -> str:
    active = document["active"] or "none"
    text = f"{active}, epoch {document['epoch'] if document['epoch'] is not None else NONE}"
    preferred = document.get("preferredActive")
    if preferred and preferred != document["active"]:
        text += f" (spec.preferredActive asks for {preferred})"
    return text


def _failover_line(document: Mapping[str, Any], now: datetime) -> str:
    last = document["lastFailover"]
    if not last:
        return f"{document['failovers']}"
    when = format_age(age_seconds(last.get("time"), now))
    moved = f"{last.get('from') or 'none'} -> {last.get('to') or 'none'}"
    how = f"{last.get('reason')}, {last.get('durationMs')} ms"
    return f"{document['failovers']}, last {when} ago: {moved} ({how})"


def _ordering_line(document: Mapping[str, Any], now: datetime) -> str:
    ordering = document["ordering"]
    if not ordering:
        return "not checked yet (no validator run has recorded status.ordering)"
    when = format_age(age_seconds(ordering.get("lastCheckTime"), now))
    return (
        f"{ordering.get('result')}, {ordering.get('violations')} violations, checked {when} ago; "
        f"report {ordering.get('report') or NONE}"
    )


def cluster_summary(body: BrokerClusterBody, now: datetime) -> dict[str, Any]:
    """One line's worth of a cluster, for ``status`` without a name."""
    document = cluster_document(body, None, now)
    ready = sum(1 for b in document["brokers"] if b["state"] in ("Active", "Inactive"))
    return {
        **{k: document[k] for k in ("name", "namespace", "phase", "active", "epoch", "failovers")},
        "paused": document["reconciliationPaused"] is not None,
        "brokersReady": f"{ready}/{len(document['brokers'])}",
        "ordering": (document["ordering"] or {}).get("result"),
        "lastFailover": document["lastFailover"],
    }


def render_cluster_list(summaries: Sequence[Mapping[str, Any]], now: datetime, with_namespace: bool) -> str:
    if not summaries:
        return "No BrokerClusters found."
    header = ["NAME", "PHASE", "ACTIVE", "EPOCH", "BROKERS", "FAILOVERS", "LAST FAILOVER", "ORDERING"]
    rows = [
        [
            str(s["name"]),
            str(s["phase"] or NONE) + (" (paused)" if s.get("paused") else ""),
            str(s["active"] or NONE),
            NONE if s["epoch"] is None else str(s["epoch"]),
            str(s["brokersReady"]),
            str(s["failovers"]),
            format_age(age_seconds((s["lastFailover"] or {}).get("time"), now)),
            str(s["ordering"] or NONE),
        ]
        for s in summaries
    ]
    if with_namespace:
        header.insert(0, "NAMESPACE")
        for row, summary in zip(rows, summaries, strict=True):
            row.insert(0, str(summary["namespace"]))
    return "\n".join(table([header, *rows]))
