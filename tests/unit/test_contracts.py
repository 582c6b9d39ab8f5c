"""The shared contracts: zeep can consume the WSDL, and message-log records round-trip and are checked."""

import dataclasses
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree

import pytest
import zeep

from broker_contracts import environment, message_log, soap, wsdl_path
from broker_contracts.message_log import Event, MessageLogError
from broker_contracts.token_verifier import token_verifier
from broker_operator import heartbeat_client
from broker_operator.controller import builders
from broker_operator.controller.spec import parse_spec
from broker_operator.core import model as core_model
from broker_service import settings as broker_settings


def test_zeep_builds_every_operation_from_the_wsdl() -> None:
    client = zeep.Client(str(wsdl_path()))
    operations = client.service._binding._operations  # zeep keeps the bound operations here
    assert set(operations) == {"Heartbeat", "SendMessages", "ListHeld", "ReplayHeld", "DiscardHeld"}


def test_heartbeat_request_serialises_with_the_contract_namespace() -> None:
    client = zeep.Client(str(wsdl_path()))
    envelope = client.create_message(client.service, "Heartbeat", active=True, epoch=7, operatorId="op-1")
    body = envelope.find(f"{{{soap.SOAP_ENV_NAMESPACE}}}Body")
    heartbeat = body[0]
    assert heartbeat.tag == f"{{{soap.NAMESPACE}}}Heartbeat"
    assert [child.text for child in heartbeat] == ["true", "7", "op-1"]


def test_heartbeat_check_carries_renew_lease_false_as_the_fourth_element() -> None:
    client = zeep.Client(str(wsdl_path()))
    envelope = client.create_message(
        client.service, "Heartbeat", active=True, epoch=7, operatorId="op-1", renewLease=False
    )
    heartbeat = envelope.find(f"{{{soap.SOAP_ENV_NAMESPACE}}}Body")[0]
    assert [child.tag.split("}")[1] for child in heartbeat] == ["active", "epoch", "operatorId", "renewLease"]
    assert heartbeat[3].text == "false"


def _record(**overrides: object) -> dict[str, object]:
    record: dict[str, object] = {
        "event": "accepted",
        "ts": message_log.format_ts(datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)),
        "cluster": "acme-1000",
        "broker": "acme-1000-0",
        "epoch": 3,
        "direction": "outbound",
        "account": "acme",
        "company": "1000",
        "stream": "orders",
        "seq": 42,
        "msgId": "m-42",
        "attempt": 1,
    }
    record.update(overrides)
    return record


def test_record_round_trips_in_schema_order() -> None:
    record = message_log.validate(_record())
    line = message_log.encode(record)
    assert line.endswith(b"\n")
    assert list(json.loads(line)) == list(message_log.FIELD_NAMES)
    assert message_log.decode(line) == record
    assert record["ts"] == "2026-11-22T12:00:00.123456Z"


def test_lifecycle_record_needs_no_message_fields() -> None:
    record = _record(event="activated", direction=None, stream=None, seq=None, msgId=None, attempt=None)
    assert message_log.validate(record)["event"] == Event.ACTIVATED


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"event": "teleported"}, "unknown message-log event 'teleported'"),
        ({"seq": None}, "a 'accepted' record needs field 'seq'"),
        ({"seq": True}, "field 'seq' must be int"),
        ({"epoch": "3"}, "field 'epoch' must be int"),
        ({"ts": "2026-11-22 12:00:00"}, "is not UTC with microseconds"),
        ({"direction": "sideways"}, "direction 'sideways'"),
        ({"colour": "red"}, "unknown message-log fields ['colour']"),
    ],
)
def test_bad_records_are_refused_with_the_field_named(overrides: dict[str, object], complaint: str) -> None:
    with pytest.raises(MessageLogError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        message_log.validate(_record(**overrides))


def test_missing_field_and_torn_line_are_refused() -> None:
    record = _record()
    del record["attempt"]
    with pytest.raises(MessageLogError, match="lacks field 'attempt'"):
        message_log.validate(record)
    with pytest.raises(MessageLogError, match="not JSON"):
        message_log.decode(b'{"event": "accepted", "ts": "2026-11-')


def test_naive_timestamp_is_refused() -> None:
    with pytest.raises(MessageLogError, match="no time zone"):
        message_log.format_ts(datetime(2026, 11, 22, 12, 0, 0))


def test_unavailability_codes_fit_the_contract_field() -> None:
    assert all(len(code) <= soap.UNAVAILABILITY_CODE_MAX_LEN for code in soap.UnavailabilityCode)


# ---- one definition each: the Heartbeat reply and the broker's environment names ---------------


def wsdl_names(contract: type) -> list[str]:
    """A contract dataclass's fields, in order, spelled as the WSDL spells them (camelCase)."""
    return [re.sub(r"_([a-z])", lambda m: m.group(1).upper(), f.name) for f in dataclasses.fields(contract)]


def test_the_heartbeat_reply_is_the_wsdls_heartbeat_response_field_for_field() -> None:
    tree = ElementTree.parse(wsdl_path())
    xsd = "{http://www.w3.org/2001/XMLSchema}"
    (response,) = [e for e in tree.iter(f"{xsd}element") if e.get("name") == "HeartbeatResponse"]
    in_wsdl = [e.get("name") for e in response.iter(f"{xsd}element") if e is not response]
    assert wsdl_names(soap.HeartbeatReply) == in_wsdl


def test_the_held_message_is_the_wsdls_held_message_type_field_for_field() -> None:
    tree = ElementTree.parse(wsdl_path())
    xsd = "{http://www.w3.org/2001/XMLSchema}"
    (held,) = [e for e in tree.iter(f"{xsd}complexType") if e.get("name") == "HeldMessage"]
    in_wsdl = [e.get("name") for e in held.iter(f"{xsd}element")]
    assert wsdl_names(soap.HeldMessage) == in_wsdl


def test_the_operator_uses_the_contracts_heartbeat_reply() -> None:
    # One class: the client parses into it and the decision core reads it (no copy in the operator).
    assert core_model.HeartbeatReply is soap.HeartbeatReply
    assert heartbeat_client.HeartbeatReply is soap.HeartbeatReply
    assert "class HeartbeatReply" not in Path(core_model.__file__).read_text(encoding="utf-8")


def test_every_variable_the_operator_sets_in_a_broker_pod_is_read_by_the_broker(tmp_path: Path) -> None:
    spec = parse_spec(
        "orders",
        {
            "account": "acme",
            "company": "1000",
            "heartbeat": {"leaseSeconds": 7},
            "delivery": {"maxDeliveries": 3, "onPoison": "Hold"},
            "backend": {"url": "http://erp.example/broker"},
            "cloud": {"url": "https://cloud.example/api"},
        },
    )
    owner = {"metadata": {"name": "orders", "namespace": "erp", "uid": "u"}, "kind": "BrokerCluster"}
    owner["apiVersion"] = "broker.failover.dev/v1alpha1"
    (container,) = builders.build_pod(owner, 1, spec, active=False)["spec"]["containers"]
    names = [variable["name"] for variable in container["env"]]
    assert set(names) <= set(environment.POD_ENVIRONMENT)
    assert set(environment.POD_ENVIRONMENT) <= {env for _, env, _ in broker_settings._ENV_FLAGS}
    # Every variable the broker reads is named in the contract module, none typed on its own.
    declared = {value for name, value in vars(environment).items() if name.startswith("BROKER_")}
    assert {env for _, env, _ in broker_settings._ENV_FLAGS} <= declared
    # And the values round-trip: the broker reads what the operator meant (files and fields
    # resolved here as the kubelet would).
    (tmp_path / "token").write_text(token_verifier("operator"))
    (tmp_path / "backend").write_text(token_verifier("backend"))
    resolved = {variable["name"]: variable.get("value", "orders-1") for variable in container["env"]}
    resolved |= {
        environment.BROKER_HOST: "127.0.0.1",
        environment.BROKER_DATA_DIR: str(tmp_path),
        environment.BROKER_MESSAGE_LOG_DIR: str(tmp_path / "log"),
        environment.BROKER_TOKEN_VERIFIER_FILE: str(tmp_path / "token"),
        environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE: str(tmp_path / "backend"),
    }
    settings = broker_settings.parse_settings([], resolved)
    assert settings.lease_seconds == spec.heartbeat.lease_seconds == 7
    assert (settings.max_deliveries, settings.on_poison.value) == (3, "Hold")
    assert (settings.cluster, settings.name, settings.account, settings.company) == (
        "orders",
        "orders-1",
        "acme",
        "1000",
    )
    assert (settings.backend_url, settings.cloud_url) == (
        "http://erp.example/broker",
        "https://cloud.example/api",
    )


@pytest.mark.parametrize(("handover", "cap"), [(None, 30.0), (12.5, 12.5), (3, 7.0)])
def test_the_pods_max_lease_is_the_granted_handover_lease_and_the_broker_starts_with_it(
    tmp_path: Path, handover: float | None, cap: float
) -> None:
    """What a successor waits out is what the broker may grant: handoverLeaseSeconds, at least the
    lease (a smaller one would be a broker that refuses to start, --max-lease-seconds below the lease)."""
    heartbeat: dict[str, float] = {"leaseSeconds": 7}
    if handover is not None:
        heartbeat["handoverLeaseSeconds"] = handover
    spec = parse_spec(
        "orders",
        {
            "account": "acme",
            "company": "1000",
            "heartbeat": heartbeat,
            "backend": {"url": "http://erp.example/broker"},
            "cloud": {"url": "https://cloud.example/api"},
        },
    )
    env = {
        variable["name"]: variable.get("value")
        for variable in builders.broker_container("orders", spec)["env"]
    }
    (tmp_path / "token").write_text(token_verifier("operator"))
    (tmp_path / "backend").write_text(token_verifier("backend"))
    settings = broker_settings.parse_settings(
        [],
        {
            environment.BROKER_DATA_DIR: str(tmp_path),
            environment.BROKER_LEASE_SECONDS: str(env[environment.BROKER_LEASE_SECONDS]),
            environment.BROKER_MAX_LEASE_SECONDS: str(env.get(environment.BROKER_MAX_LEASE_SECONDS, "")),
            environment.BROKER_TOKEN_VERIFIER_FILE: str(tmp_path / "token"),
            environment.BROKER_BACKEND_TOKEN_VERIFIER_FILE: str(tmp_path / "backend"),
        },
    )
    assert settings.max_lease_cap_seconds == spec.heartbeat.granted_handover_seconds == cap
    assert settings.lease_seconds == 7
