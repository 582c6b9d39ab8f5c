"""The chart's three descriptions of its values agree: values.yaml, values.schema.json, charts/README.md.

helm itself checks values.yaml against the schema (``additionalProperties: false`` everywhere), so
a key added to values.yaml alone fails ``helm lint``. What helm does not check, and this does: the
schema describes no key values.yaml lacks, every key has a description, and the README's table
names every key a user can set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "broker-failover"
README = CHART.parent / "README.md"


def schema_leaves(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Dotted paths of the values the schema types, stopping at free-form maps (requests, limits)."""
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub:
            yield from schema_leaves(sub, f"{path}.")
        else:
            yield path, sub


def value_leaves(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in values.items():
        sub = schema.get("properties", {}).get(name, {})
        if isinstance(value, dict) and "properties" in sub:
            yield from value_leaves(value, sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    return values, schema


def test_the_schema_types_exactly_the_keys_of_values_yaml() -> None:
    values, schema = load()
    typed = {path for path, _ in schema_leaves(schema)} - {"global"}
    assert typed == set(value_leaves(values, schema))


def test_every_schema_entry_is_described_and_closed() -> None:
    _, schema = load()

    def walk(node: dict[str, Any], path: str) -> Iterator[str]:
        if "description" not in node:
            yield f"{path}: no description"
        if (
            node.get("type") == "object"
            and "properties" in node
            and node.get("additionalProperties") is not False
        ):
            yield f"{path}: takes unknown keys (a typo would pass silently)"
        for name, sub in node.get("properties", {}).items():
            if name != "global":
                yield from walk(sub, f"{path}.{name}" if path else name)

    assert list(walk(schema, "")) == []


def test_the_readme_table_names_every_value() -> None:
    values, schema = load()
    table = README.read_text()
    cells = " ".join(re.findall(r"^\| (.+?) \|", table, flags=re.M))
    missing = []
    for path in value_leaves(values, schema):
        head, _, last = path.rpartition(".")
        parts = path.split(".")
        # Or a parent below the top (`operator` alone would cover everything); a top-level leaf
        # (`imagePullSecrets`) names itself.
        first = min(2, len(parts))
        named = any(f"`{'.'.join(parts[:n])}`" in cells for n in range(first, len(parts) + 1))
        # The table groups siblings: "`operator.image.repository`, `.tag`, `.pullPolicy`".
        if not named and not (f"`.{last}`" in cells and f"`{head}." in cells):
            missing.append(path)
    assert missing == []


def test_the_narrow_install_is_the_default() -> None:
    """Issue 39: cluster-wide write rights are asked for (operator.clusterWide), never the default,
    and the writes guard is on whenever they are."""
    values, _ = load()
    assert values["operator"]["clusterWide"] is False
    assert values["operator"]["watchNamespaces"] == []
    assert values["operator"]["writesGuard"] is True
    rbac = (CHART / "templates" / "rbac.yaml").read_text()
    # The namespaced rules reach a ClusterRole only under clusterWide.
    assert '{{- if .Values.operator.clusterWide }}\n  {{- include "broker-failover.namespacedRules"' in rbac
