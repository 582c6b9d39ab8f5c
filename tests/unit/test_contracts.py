"""The shared contracts: zeep can consume the WSDL, and message-log records round-trip and are checked."""

import json
from datetime import UTC, datetime

import pytest
import zeep

from broker_contracts import message_log, soap, wsdl_path
from broker_contracts.message_log import Event, MessageLogError


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
