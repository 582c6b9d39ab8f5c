"""The CRD file: the shape the API server needs and the defaults the operator assumes.

The CEL rules themselves are evaluated only by a real API server
(tests/e2e/test_operator.py); here the file is read as data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_operator.controller import names
from broker_operator.controller.spec import parse_spec

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / "broker.failover.dev_brokerclusters.yaml"


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))


def version_of(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: absent fields with a default get it, recursively."""
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    result = dict(value)
    for field, sub in (schema.get("properties") or {}).items():
        if field not in result and "default" in sub:
            result[field] = sub["default"]
        if field in result:
            result[field] = apply_defaults(sub, result[field])
    return result


def test_names_group_and_scope() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    assert crd["spec"]["group"] == names.GROUP
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["bc"]
    assert crd["spec"]["names"]["kind"] == names.KIND
    version = version_of(crd)
    assert version["name"] == names.VERSION
    assert version["subresources"] == {"status": {}}


def test_printer_columns_are_the_issues() -> None:
    columns = {c["name"].upper(): c["jsonPath"] for c in version_of(load_crd())["additionalPrinterColumns"]}
    assert columns == {
        "ACCOUNT": ".spec.account",
        "COMPANY": ".spec.company",
        "PHASE": ".status.phase",
        "ACTIVE": ".status.active",
        "EPOCH": ".status.epoch",
        "ORDERING": ".status.ordering.result",
        "AGE": ".metadata.creationTimestamp",
    }


def test_schema_defaults_equal_the_operators_defaults() -> None:
    schema = version_of(load_crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaulted = apply_defaults(schema, {"account": "a", "company": "c"})
    assert "replicas" not in defaulted  # exclusive with endpoints: the operator applies 2 (docs/crd.md)
    assert parse_spec("x", defaulted) == parse_spec("x", {"account": "a", "company": "c"})
    assert defaulted["heartbeat"] == {
        "intervalSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
        "leaseSeconds": 5,
        "standbyProbeSeconds": 10,
    }
    assert defaulted["failback"] == "Automatic"
    assert defaulted["delivery"] == {"maxDeliveries": 5, "onPoison": "BlockStream"}


def test_every_cel_rule_explains_itself_with_the_field() -> None:
    rules: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules.extend(node.get("x-kubernetes-validations") or [])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(version_of(load_crd())["schema"])
    assert len(rules) >= 8
    for rule in rules:
        text = rule.get("message") or rule.get("messageExpression") or ""
        assert "spec." in text, rule


def test_status_schema_has_every_design_field() -> None:
    status = version_of(load_crd())["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for field in (
        "phase",
        "active",
        "epoch",
        "brokers",
        "lastFailover",
        "failovers",
        "ordering",
        "conditions",
    ):
        assert field in status
    assert set(status["ordering"]["properties"]) == {"lastCheckTime", "result", "violations", "report"}
    assert "Conflict" in status["phase"]["enum"]


EXAMPLES = sorted((CRD_PATH.parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid_brokerclusters(example: Path) -> None:
    (manifest,) = list(yaml.safe_load_all(example.read_text(encoding="utf-8")))
    assert manifest["apiVersion"] == names.API_VERSION
    assert manifest["kind"] == names.KIND
    parse_spec(manifest["metadata"]["name"], manifest["spec"])  # raises SpecError naming the field


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2
