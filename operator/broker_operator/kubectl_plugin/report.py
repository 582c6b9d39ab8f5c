"""``kubectl broker report CLUSTER``: the validator's latest verdict, and where its report is.

The verdict is ``status.ordering`` (``lastCheckTime``, ``result``, ``violations``, ``report``), which
the validator writes after each run (validator/README.md). ``report`` is a location for people: a
path inside the validator's pod, or ``pvc/<claim>/<path>`` when the report lives in the shared
message-log claim (the chart's CronJob writes ``pvc/<claim>/.validator/reports/report.html``).

``--show`` prints ``report.json``, which sits next to ``report.html``: from the local file system
when the location is a path readable here, or under ``--claim-dir`` (where the claim is mounted on
this machine) for a ``pvc/`` location. Otherwise it explains how to fetch it with ``kubectl cp``
from a pod that mounts the claim: the plugin does not start pods or exec into them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from broker_operator.controller.bodies import BrokerClusterBody
from broker_operator.kubectl_plugin.errors import PluginError
from broker_operator.kubectl_plugin.status_view import NONE, age_seconds, format_age, status_of

SCHEMA: Final = "kubectl-broker/report/v1"
REPORT_JSON: Final = "report.json"
CLAIM_PREFIX: Final = "pvc/"


def report_json_path(location: str, claim_dir: Path | None) -> Path | None:
    """Where ``report.json`` is on this machine for a ``status.ordering.report`` location, if anywhere."""
    if location.startswith(CLAIM_PREFIX):
        if claim_dir is None:
            return None
        _, _claim, inside = [*location.split("/", 2), "", ""][:3]
        path = claim_dir / inside
    else:
        path = Path(location)
        if not path.is_absolute():
            return None
    return path if path.suffix == ".json" else (path.parent if path.suffix else path) / REPORT_JSON


def how_to_fetch(location: str, namespace: str) -> str:
    """The English advice for a report this machine cannot read."""
    if location.startswith(CLAIM_PREFIX):
        _, claim, inside = [*location.split("/", 2), "", ""][:3]
        directory = str(Path(inside).parent) if Path(inside).suffix else inside
        return (
            f"the report is in PersistentVolumeClaim {claim} (namespace {namespace}) at {directory}/, which "
            "is not mounted here. Copy it from a pod that mounts the claim, e.g. a broker pod with "
            f"spec.messageLog.claimName={claim} (mounted at its messageLog.mountPath):\n"
            f"  kubectl cp {namespace}/POD:MOUNT_PATH/{directory}/{REPORT_JSON} {REPORT_JSON}\n"
            f"or pass --claim-dir DIR if the claim is mounted on this machine at DIR"
        )
    return (
        f"the report location {location} is not a file readable on this machine (it is a path inside the "
        "validator's pod, which is gone when its Job ends); run the validator with its report directory "
        "on the shared claim (the chart's default) to keep reports"
    )


def report_document(
    body: BrokerClusterBody, claim_dir: Path | None, show: bool
) -> tuple[dict[str, Any], str | None]:
    """The ``-o json`` object, and why ``report.json`` could not be read when ``show`` asked for it."""
    meta = body.get("metadata") or {}
    ordering: Mapping[str, Any] | None = status_of(body).get("ordering")
    location = str((ordering or {}).get("report") or "")
    path = report_json_path(location, claim_dir) if location else None
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "cluster": meta.get("name"),
        "namespace": meta.get("namespace"),
        "ordering": dict(ordering) if ordering else None,
        "reportLocation": location or None,
        "reportJson": str(path) if path is not None else None,
        "report": None,
    }
    problem: str | None = None
    if show:
        if not location:
            problem = "no validator run has recorded a report for this cluster yet"
        elif path is None or not path.is_file():
            problem = how_to_fetch(location, str(meta.get("namespace")))
            if path is not None:
                problem = f"{path} does not exist; " + problem
        else:
            try:
                document["report"] = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                raise PluginError(f"cannot read the report {path}: {error}") from None
    return document, problem


def render_report(document: Mapping[str, Any], now: datetime) -> str:
    ordering = document["ordering"]
    name = document["cluster"]
    if not ordering:
        return (
            f"No ordering check recorded for {name} yet: status.ordering is empty until the ordering "
            "validator has run over this cluster's message log (the chart's CronJob, every 15 minutes by "
            "default; run one now with kubectl create job --from=cronjob/<release>-broker-failover-validator "
            "validate-now)."
        )
    checked = ordering.get("lastCheckTime")
    lines = [
        f"Cluster:      {name} (namespace {document['namespace']})",
        f"Result:       {ordering.get('result')}",
        f"Violations:   {ordering.get('violations')}",
        f"Checked:      {checked} ({format_age(age_seconds(checked, now))} ago)",
        f"Report:       {document['reportLocation'] or NONE}",
    ]
    if document["reportJson"]:
        lines.append(f"report.json:  {document['reportJson']}")
    report = document.get("report")
    if report is not None:
        section = (report.get("clusters") or {}).get(name)
        lines += ["", json.dumps(section if section is not None else report, indent=2, sort_keys=True)]
    return "\n".join(lines)
