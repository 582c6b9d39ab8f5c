"""docs/operator.md's RBAC table is exactly what the chart grants, in every mode that changes it.

Issue 42: the docs' list had drifted (no EndpointSlices, Endpoints, PodDisruptionBudgets or nodes),
so RBAC written from it got a 403 on the ``-active`` slice write and failover traffic went nowhere.
Here the chart is rendered with the real helm (``helm template``, no cluster) for each value
combination that changes its rules, and every (where, API group, resource, verb) it grants is
compared with the table in both directions; the writes guard's resources with the table's
``writes guard`` column. tests/e2e/test_chart.py checks the same rules against the calls the
operator really makes (the API server's audit log), so the table, the chart and the code agree.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import built_tools_dir

pytestmark = pytest.mark.needs("tools")  # the Go-built helm (make tools)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "broker-failover"
DOCS = REPO / "docs" / "operator.md"
RELEASE, NAMESPACE = "bf", "brokers"
OPERATOR = f"{RELEASE}-broker-failover"
VALIDATOR = f"{OPERATOR}-validator"
HEADER = "| granted in | API group | resources | verbs | writes guard | what for |"

Grant = tuple[str, str, str, str]  # (object, API group, resource, verb); object: ClusterRole or Role/<ns>


@dataclass(frozen=True)
class Mode:
    """One value combination and what it means for where the table's rows go."""

    values: tuple[str, ...]
    namespaces: tuple[str, ...] = (NAMESPACE,)  # where the operator's Roles are
    cluster_wide: bool = False
    peering: bool = True
    validator: bool = False
    executors: bool = False


VALIDATOR_ON = ("--set", "validator.enabled=true", "--set", "validator.store.claimName=message-log")
MODES = {
    "namespaced": Mode(()),
    "given-namespaces": Mode(("--set", "operator.watchNamespaces={erp,hr}"), namespaces=("erp", "hr")),
    "standalone": Mode(("--set", "operator.standalone=true"), peering=False),
    "cluster-wide": Mode(("--set", "operator.clusterWide=true"), namespaces=(), cluster_wide=True),
    "cluster-wide-standalone": Mode(
        ("--set", "operator.clusterWide=true", "--set", "operator.standalone=true"),
        namespaces=(),
        cluster_wide=True,
        peering=False,
    ),
    "validator": Mode(VALIDATOR_ON, validator=True),
    "validator-executors": Mode(
        (*VALIDATOR_ON, "--set", "validator.executors=2"), validator=True, executors=True
    ),
}


@dataclass(frozen=True)
class Row:
    granted_in: str
    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    guarded: bool


def _codes(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def table_rows() -> list[Row]:
    """The RBAC table of docs/operator.md, row by row."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        granted_in, group, resources, verbs, guard = cells[:5]
        # "core" is the core group, "" in a rule; any other is written as code.
        (group_name,) = ("",) if group == "core" else _codes(group)
        rows.append(Row(granted_in, group_name, _codes(resources), _codes(verbs), guard == "yes"))
    return rows


# Where a row's rules go in a mode: the objects, or none. Every "granted in" the table uses must be
# one of these; a new one fails the test until it says what it means.
PLACES: dict[str, Callable[[Mode], tuple[str, ...]]] = {
    "ClusterRole": lambda m: ("ClusterRole",),
    "Role": lambda m: ("ClusterRole",) if m.cluster_wide else tuple(f"Role/{ns}" for ns in m.namespaces),
    "Role, peering": lambda m: tuple(f"Role/{ns}" for ns in m.namespaces) if m.peering else (),
    "ClusterRole, peering": lambda m: ("ClusterRole",) if m.cluster_wide and m.peering else (),
    "validator Role": lambda m: (f"Role/{NAMESPACE}/validator",) if m.validator else (),
    "validator Role, executors": lambda m: (f"Role/{NAMESPACE}/validator",) if m.executors else (),
}


def documented(mode: Mode) -> set[Grant]:
    return {
        (place, row.group, resource, verb)
        for row in table_rows()
        for place in PLACES[row.granted_in](mode)
        for resource in row.resources
        for verb in row.verbs
    }


def render(mode: Mode) -> list[dict[str, Any]]:
    result = subprocess.run(
        [
            str(built_tools_dir() / "helm"),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            *mode.values,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _grants(place: str, rules: list[dict[str, Any]]) -> Iterator[Grant]:
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    yield place, group, resource, verb


def granted(docs: list[dict[str, Any]]) -> set[Grant]:
    """Every grant of the release's ClusterRole and Roles; a role of another name fails."""
    found: set[Grant] = set()
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "ClusterRole":
            assert meta["name"] == OPERATOR
            found |= set(_grants("ClusterRole", doc["rules"]))
        elif kind == "Role":
            place = {OPERATOR: f"Role/{meta['namespace']}", VALIDATOR: f"Role/{meta['namespace']}/validator"}
            found |= set(_grants(place[meta["name"]], doc["rules"]))
    return found


def test_the_table_is_read_whole() -> None:
    rows = table_rows()
    assert len(rows) >= 15, "the parser lost the table"
    assert {row.granted_in for row in rows} <= set(PLACES), "a 'granted in' the test does not know"
    assert all(row.resources and row.verbs for row in rows), rows
    # The rules issue 42 found missing from the old list.
    listed = {(row.group, resource) for row in rows for resource in row.resources}
    assert {
        ("discovery.k8s.io", "endpointslices"),
        ("", "endpoints"),
        ("policy", "poddisruptionbudgets"),
        ("", "nodes"),
        ("storage.k8s.io", "storageclasses"),
    } <= listed


@pytest.mark.parametrize("name", sorted(MODES))
def test_the_chart_grants_exactly_the_documented_rules(name: str) -> None:
    mode = MODES[name]
    rendered, expected = granted(render(mode)), documented(mode)
    assert sorted(rendered - expected) == [], "granted by the chart, missing from docs/operator.md"
    assert sorted(expected - rendered) == [], "in docs/operator.md, not granted by the chart"


def test_the_writes_guard_holds_the_documented_resources() -> None:
    docs = render(MODES["cluster-wide"])
    (policy,) = [doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicy"]
    guarded = set()
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"], rule
        guarded |= {(group, resource) for group in rule["apiGroups"] for resource in rule["resources"]}
    rows = table_rows()
    assert guarded == {(row.group, resource) for row in rows if row.guarded for resource in row.resources}
    # Every namespaced resource the operator writes is guarded, but its own kind and its events.
    writes = {"create", "update", "patch", "delete"}
    written = {
        (row.group, resource)
        for row in rows
        if row.granted_in == "Role" and writes & set(row.verbs)
        for resource in row.resources
    }
    unguarded = {("broker.failover.dev", "brokerclusters"), ("broker.failover.dev", "brokerclusters/status")}
    assert written - guarded == unguarded | {("", "events")}
    # Off with writesGuard=false, and never in a namespaced install.
    off = render(Mode((*MODES["cluster-wide"].values, "--set", "operator.writesGuard=false")))
    assert not [doc for doc in off if doc["kind"].startswith("ValidatingAdmissionPolicy")]
    assert not [doc for doc in render(MODES["namespaced"]) if doc["kind"].startswith("ValidatingAdmission")]
