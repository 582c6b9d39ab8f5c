"""The CRD's CEL messages as data: find the rules under a field, render a message as the API server would.

The rules themselves run only on a real API server (tests/e2e/test_tls_and_active_service_crd.py).
Their messages are plain text or ``'...%s...'.format([self.x, ...])``, which is simple enough to
render here for given values: so a unit test can hold the Python parser's message against the
CRD's, word for word, for every rule, without an API server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / "broker.failover.dev_brokerclusters.yaml"
_FORMAT = re.compile(r"^'(?P<text>.*)'\s*\.format\(\[(?P<args>.*)\]\)$", re.DOTALL)


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    (version,) = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


def schema_at(path: str) -> dict[str, Any]:
    """The schema of ``spec.<path>`` (dotted; ``[]`` steps into a list's items)."""
    node = spec_schema()
    for part in path.split("."):
        items = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if items:
            node = node["items"]
    return node


def rules_at(path: str) -> list[dict[str, Any]]:
    return list(schema_at(path).get("x-kubernetes-validations") or [])


def rules_below(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every rule in ``spec.<path>`` and below it, with the path it is at."""

    def walk(node: Mapping[str, Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for rule in node.get("x-kubernetes-validations") or []:
            yield where, rule
        for name, sub in (node.get("properties") or {}).items():
            yield from walk(sub, f"{where}.{name}")
        if "items" in node:
            yield from walk(node["items"], f"{where}[]")

    yield from walk(schema_at(path), path)


def rendered(rule: Mapping[str, Any], values: Mapping[str, object]) -> str:
    """The rule's message with ``values`` (by CEL expression: ``self.mode``, ``self``) filled in."""
    if "message" in rule:
        return " ".join(str(rule["message"]).split())
    found = _FORMAT.match(" ".join(str(rule["messageExpression"]).split()))
    assert found, f"not a '...'.format([...]) messageExpression: {rule['messageExpression']}"
    text = found["text"].replace("\\'", "'")
    args = [arg.strip() for arg in found["args"].split(",")]
    return text.replace("%s", "{}").replace("%d", "{}").format(*(values[arg] for arg in args))
