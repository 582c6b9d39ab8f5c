"""The CRD file: the shape the API server needs and the defaults the operator assumes.

The CEL rules themselves are evaluated only by a real API server
(tests/e2e/test_operator.py); here the file is read as data.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_operator.controller import bodies, names
from broker_operator.controller.spec import SpecError, parse_spec
from broker_operator.core import spec_fields as fields
from broker_operator.core.model import HeartbeatSettings
from broker_operator.pki.replacement import ReplacementPhase

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
        # The controller's condition, so the column shows what the operator honours, not the
        # annotation a person typed (docs/pause.md).
        "PAUSED": '.status.conditions[?(@.type=="ReconciliationPaused")].status',
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
        "leaseSeconds": 10,
        "handoverLeaseSeconds": 30,
        "standbyProbeSeconds": 10,
    }
    assert defaulted["failback"] == "Automatic"
    assert defaulted["delivery"] == {"maxDeliveries": 5, "onPoison": "BlockStream"}
    assert defaulted["persistentVolumeClaimRetentionPolicy"] == {
        "whenScaled": "Retain",
        "whenDeleted": "Retain",
    }


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


def test_kubectl_explain_has_a_description_for_every_field() -> None:
    """`kubectl explain bc.spec.<field>` reads these; "<no description>" leaves a user guessing."""
    bare: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if not node.get("description"):
            bare.append(path or "(root)")
        for name, sub in (node.get("properties") or {}).items():
            if path or name != "metadata":  # the API server allows no more than the type there
                walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(version_of(load_crd())["schema"]["openAPIV3Schema"], "")
    assert bare == []


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


def test_the_tls_status_has_one_shape_for_the_part_that_writes_it() -> None:
    status = version_of(load_crd())["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    tls = status["tls"]["properties"]
    assert set(tls) == {"mode", "certificates", "served", "caReplacement"}
    assert tls["mode"]["enum"] == list(fields.TLS_MODE.choices)
    certificate = tls["certificates"]["items"]["properties"]
    assert set(certificate) == {"name", "secret", "serial", "notAfter"}
    assert certificate["name"]["enum"] == ["ca", "server", "operatorClient", "backendClientsCA", "upstreamCA"]
    assert tls["certificates"]["x-kubernetes-list-map-keys"] == ["name"]
    assert set(tls["served"]["items"]["properties"]) == {"broker", "serial"}
    assert tls["served"]["x-kubernetes-list-map-keys"] == ["broker"]
    replacement = tls["caReplacement"]["properties"]
    assert set(replacement) == {"token", "phase", "message"}
    assert replacement["phase"]["enum"] == [phase.value for phase in ReplacementPhase]


EXAMPLES = sorted((CRD_PATH.parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid_brokerclusters(example: Path) -> None:
    (manifest,) = list(yaml.safe_load_all(example.read_text(encoding="utf-8")))
    assert manifest["apiVersion"] == names.API_VERSION
    assert manifest["kind"] == names.KIND
    parse_spec(manifest["metadata"]["name"], manifest["spec"])  # raises SpecError naming the field


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


# ---- one description of the spec: the CRD, and everything Python states checked against it ----


def spec_schema() -> dict[str, Any]:
    return version_of(load_crd())["schema"]["openAPIV3Schema"]["properties"]["spec"]


def crd_leaves(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every leaf field below ``schema`` by dotted path ("[]" for a list's items), with its schema."""
    leaves: dict[str, dict[str, Any]] = {}
    if schema.get("type") == "array":
        return crd_leaves(schema["items"], f"{path}[]") if "properties" in schema["items"] else {path: schema}
    if schema.get("type") == "object" and "properties" in schema:
        for name, sub in schema["properties"].items():
            leaves.update(crd_leaves(sub, f"{path}.{name}" if path else name))
        return leaves
    return {path: schema}


CONSTRAINTS = ("type", "default", "minimum", "maximum", "enum")


def constraints_of(
    field: fields.IntegerField
    | fields.NumberField
    | fields.ChoiceField
    | fields.OptionalChoiceField
    | fields.TextField
    | fields.BooleanField,
) -> dict[str, Any]:
    if isinstance(field, fields.OptionalChoiceField):  # an enum with no default: absent means unset
        return {"type": "string", "enum": list(field.choices)}
    if isinstance(field, fields.BooleanField):
        return {"type": "boolean", "default": field.default}
    if isinstance(field, fields.IntegerField | fields.NumberField):
        kind = "integer" if isinstance(field, fields.IntegerField) else "number"
        found: dict[str, Any] = {"type": kind, "minimum": field.minimum, "maximum": field.maximum}
        return found if field.default is None else {**found, "default": field.default}
    if isinstance(field, fields.ChoiceField):
        return {"type": "string", "enum": list(field.choices), "default": field.default}
    return {"type": "string", "default": field.default}


def test_spec_fields_state_exactly_the_crds_defaults_bounds_and_choices() -> None:
    # Both directions: a default, bound or enum added or changed in the CRD and not in
    # core/spec_fields.py (which the parsers read theirs from), or the other way round, fails here.
    in_crd = {
        path: {key: leaf[key] for key in CONSTRAINTS if key in leaf}
        for path, leaf in crd_leaves(spec_schema()).items()
        if any(key in leaf for key in ("default", "minimum", "maximum", "enum"))
    }
    in_python = {field.path: constraints_of(field) for field in fields.FIELDS}
    assert in_python == in_crd


def test_the_heartbeat_durations_are_decimal_seconds_in_both() -> None:
    # Sub-second heartbeats on Kubernetes: the CRD says `number` (integers stay valid JSON numbers),
    # and the parsers read these three as floats; the other durations stay whole seconds.
    heartbeat = spec_schema()["properties"]["heartbeat"]["properties"]
    decimal = {"intervalSeconds", "timeoutSeconds", "leaseSeconds", "handoverLeaseSeconds"}
    assert {name for name, sub in heartbeat.items() if sub["type"] == "number"} == decimal
    assert {f.path for f in fields.FIELDS if isinstance(f, fields.NumberField)} == {
        f"heartbeat.{name}" for name in decimal
    }
    for name in decimal:
        assert "decimals allowed" in heartbeat[name]["description"].lower(), name
    assert spec_schema()["properties"]["failbackStableSeconds"]["type"] == "integer"
    assert heartbeat["standbyProbeSeconds"]["type"] == heartbeat["failureThreshold"]["type"] == "integer"


def test_the_heartbeat_rules_multiply_no_double_by_an_int_and_format_doubles() -> None:
    # A `number` field is a CEL double even when written 1: `double * int` does not compile, and
    # `%d` of a double fails at run time, so a decimal manifest would get no message at all.
    rules = spec_schema()["properties"]["heartbeat"]["x-kubernetes-validations"]
    lease, timeout = rules
    assert "self.intervalSeconds * double(self.failureThreshold)" in lease["rule"]
    assert "self.intervalSeconds * double(self.failureThreshold)" in lease["messageExpression"]
    for rule in rules:
        assert "%d" not in rule["messageExpression"] and rule["messageExpression"].count("%s") == 2
    assert timeout["rule"] == "self.timeoutSeconds <= self.intervalSeconds"


def test_object_defaults_spell_out_the_nested_defaults() -> None:
    # The heartbeat object's default is written out (CEL validates it as written): it must be the
    # same values as its fields' own defaults.
    for name, sub in spec_schema()["properties"].items():
        if sub.get("type") == "object" and sub.get("default"):
            nested = {field: schema["default"] for field, schema in sub["properties"].items()}
            assert sub["default"] == nested, name


def test_the_engines_settings_default_to_the_crds() -> None:
    settings = HeartbeatSettings()
    heartbeat = spec_schema()["properties"]["heartbeat"]["default"]
    assert (settings.interval_seconds, settings.timeout_seconds) == (
        heartbeat["intervalSeconds"],
        heartbeat["timeoutSeconds"],
    )
    assert (settings.failure_threshold, settings.lease_seconds, settings.standby_probe_seconds) == (
        heartbeat["failureThreshold"],
        heartbeat["leaseSeconds"],
        heartbeat["standbyProbeSeconds"],
    )
    assert settings.failback == spec_schema()["properties"]["failback"]["default"]
    assert settings.failback_stable_seconds == spec_schema()["properties"]["failbackStableSeconds"]["default"]


class ReadRecorder(Mapping[str, Any]):
    """A spec that remembers which of its fields were read, by dotted path."""

    def __init__(self, data: Mapping[str, Any], path: str, read: set[str]) -> None:
        self._data, self._path, self._read = data, path, read

    def __getitem__(self, key: str) -> Any:
        path = f"{self._path}.{key}" if self._path else key
        self._read.add(path)
        value = self._data[key]
        if isinstance(value, Mapping):
            return ReadRecorder(value, path, self._read)
        if isinstance(value, list):
            return [ReadRecorder(v, f"{path}[]", self._read) if isinstance(v, Mapping) else v for v in value]
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def sample_value(schema: dict[str, Any]) -> Any:
    """A value for every field the CRD declares: its default, its first choice, or one of its type."""
    if "default" in schema and schema.get("type") != "object":
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("type") == "object":
        if "properties" in schema:
            return {name: sample_value(sub) for name, sub in schema["properties"].items()}
        return {"cpu": "1"}  # additionalProperties: requests, limits
    if schema.get("type") == "array":
        return [sample_value(schema["items"])]
    return schema.get("minimum", 1) if schema.get("type") in ("integer", "number") else "x"


def test_the_operator_reads_every_field_the_crd_declares() -> None:
    # A field added to the CRD and not to the parser (or a parser reading a field the CRD lacks,
    # which the API server would prune) fails here.
    schema = spec_schema()
    read: set[str] = set()
    with pytest.raises(SpecError):  # the sample sets exclusive fields together; reads still happen
        parse_spec("x", ReadRecorder(sample_value(schema), "", read))
    declared = set(crd_leaves(schema))
    assert declared - read == set(fields.NOT_READ_BY_THE_OPERATOR)
    objects = {
        ".".join(parts[:end]).removesuffix("[]")
        for parts in (path.split(".") for path in declared)
        for end in range(1, len(parts))
    }
    # Inside an object the CRD keeps as written (x-kubernetes-preserve-unknown-fields: a
    # NetworkPolicyPeer's selectors, the security contexts, the affinity; or a list of such
    # objects: the tolerations) and inside a map (additionalProperties: the nodeSelector), every
    # field is the user's and passes through as it is.
    opaque = tuple(
        f"{path}[]." if leaf.get("type") == "array" else f"{path}."
        for path, leaf in crd_leaves(schema).items()
        if leaf.get("x-kubernetes-preserve-unknown-fields")
        or leaf.get("additionalProperties")
        or leaf.get("items", {}).get("x-kubernetes-preserve-unknown-fields")
    )
    assert opaque, "the check below would be vacuous"
    read = {path for path in read if not path.startswith(opaque)}
    assert read <= declared | objects, read - declared - objects


def test_every_body_type_is_used_and_the_status_fields_are_the_crds() -> None:
    declared = {
        name
        for name, value in vars(bodies).items()
        if isinstance(value, type) and value.__module__ == bodies.__name__
    }
    package = Path(bodies.__file__).parent.parent
    sources = "\n".join(
        path.read_text(encoding="utf-8") for path in package.rglob("*.py") if path.name != "bodies.py"
    )
    used = {name for name in declared if re.search(rf"\b{name}\b", sources)}
    pending = list(used)
    while pending:  # a type is used if a used type has a field of it
        for hint in typing.get_type_hints(getattr(bodies, pending.pop())).values():
            for name in declared - used:
                if name in repr(hint):
                    used.add(name)
                    pending.append(name)
    assert used == declared, f"declared but used by nothing: {sorted(declared - used)}"
    # The spec has one typed view, ClusterSpec (parse_spec); a TypedDict of it would be a fourth
    # statement of its fields that nothing reads through.
    assert typing.get_type_hints(bodies.BrokerClusterBody)["spec"] == dict[str, Any]
    status = version_of(load_crd())["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(typing.get_type_hints(bodies.BrokerClusterStatus)) <= set(status)
