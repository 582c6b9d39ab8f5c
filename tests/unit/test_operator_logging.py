"""The operator's logging (kopf_logging.py): kopf's lines in the shared format and level, events as before.

kopf's object records and the operator's event calls go through kopf's real machinery (its
``K8sPoster`` on ``kopf.objects`` and ``kopf.info``/``kopf.warn``) into an event queue of the test's
own, as kopf's posting engine would read them: neither the level nor the format may change which
events are posted or what they say.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging

import kopf
import pytest
from kopf._core.engines import posting

from broker_contracts.logs import parse_log_settings
from broker_operator.controller.handlers import configure_kopf
from broker_operator.controller.settings import parse_settings
from broker_operator.kopf_logging import configure_operator_logging

BODY = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}


pytestmark = pytest.mark.usefixtures("restored_logging")  # tests/unit/conftest.py


async def log_through_kopf(format: str, level: str) -> tuple[str, list[tuple[str, str, str]]]:
    """What reaches stderr, and the events kopf queues (type, reason, message), in this configuration."""
    stream = io.StringIO()
    configure_operator_logging(parse_log_settings(format, level), stream=stream)
    settings = kopf.OperatorSettings()
    configure_kopf(settings)
    queue: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    posting.event_queue_var.set(queue)
    posting.settings_var.set(settings)
    body = kopf.Body(BODY)
    logger = kopf.ObjectLogger(body=body, settings=settings)
    logger.debug("Something has changed, but we are not interested.")
    logger.info("Handler 'reconcile-on-create' succeeded.")
    logger.warning("spec refused: replicas must be at least 2")
    logging.getLogger("broker_operator.engine").info("orders: heartbeat to orders-0 answered")
    kopf.info(body, reason="Created", message="created Pod/orders-0 (priority 0)")
    kopf.warn(body, reason="InvalidSpec", message="spec.replicas: must be at least 2")
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    return stream.getvalue(), [(event.type, event.reason, event.message) for event in events]


EVENTS = [
    ("Normal", "Created", "created Pod/orders-0 (priority 0)"),
    ("Warning", "InvalidSpec", "spec.replicas: must be at least 2"),
]


@pytest.mark.parametrize(
    ("format", "level"), [("text", "INFO"), ("json", "INFO"), ("json", "WARNING"), ("json", "DEBUG")]
)
async def test_the_events_are_the_same_whatever_the_format_and_level(format: str, level: str) -> None:
    # The operator's events are kopf calls, not log records; kopf's bridge from log records to
    # events is off (kopf's default), so a handler's log line was never an event and is not now.
    _, events = await log_through_kopf(format, level)
    assert events == EVENTS


async def test_kopfs_object_lines_carry_the_object_and_the_operators_own_lines_the_same_fields() -> None:
    written, _ = await log_through_kopf("json", "INFO")
    lines = [json.loads(line) for line in written.splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("INFO", "kopf.objects", "Handler 'reconcile-on-create' succeeded."),
        ("WARNING", "kopf.objects", "spec refused: replicas must be at least 2"),
        ("INFO", "broker_operator.engine", "orders: heartbeat to orders-0 answered"),
    ]
    for line in lines[:2]:
        assert line["object"] == {
            "apiVersion": "broker.failover.dev/v1alpha1",
            "kind": "BrokerCluster",
            "name": "orders",
            "uid": "uid-1",
            "namespace": "erp",
        }
        assert not {"settings", "k8s_skip", "k8s_ref"} & set(line)
    assert set(lines[2]) == {"time", "level", "logger", "message"}


async def test_the_level_applies_to_kopfs_lines_as_to_the_operators() -> None:
    written, _ = await log_through_kopf("json", "WARNING")
    assert [json.loads(line)["message"] for line in written.splitlines()] == [
        "spec refused: replicas must be at least 2"
    ]
    written, _ = await log_through_kopf("json", "DEBUG")
    assert json.loads(written.splitlines()[0])["level"] == "DEBUG"
    written, _ = await log_through_kopf("text", "INFO")
    assert written.splitlines()[0].endswith(" INFO kopf.objects: Handler 'reconcile-on-create' succeeded.")


def test_the_operator_reads_its_log_settings_from_flags_and_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    environ = {"BROKER_FAILOVER_LOG_FORMAT": "json", "BROKER_FAILOVER_LOG_LEVEL": "warning"}
    settings = parse_settings([], environ)
    assert (settings.log.format.value, settings.log.level) == ("json", "WARNING")
    settings = parse_settings(["--log-format", "text", "--log-level", "DEBUG"], environ)
    assert (settings.log.format.value, settings.log.level) == ("text", "DEBUG")
    assert parse_settings([], {}).log == parse_log_settings(None, None)
    with pytest.raises(SystemExit) as stopped:
        parse_settings(["--log-format", "logfmt"], {})
    assert stopped.value.code == 2
    assert (
        "--log-format / BROKER_FAILOVER_LOG_FORMAT = 'logfmt': use one of text, json"
        in capsys.readouterr().err
    )
