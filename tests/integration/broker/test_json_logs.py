"""A real broker, and the simulators beside it, started with ``BROKER_FAILOVER_LOG_FORMAT=json`` (issue 42).

The processes are started as every integration test starts them, with the variables in their
environment, as a broker pod gets them from the operator. Each line of their output (stdout and
stderr together) must be one JSON object with the documented fields; the broker is driven through
its INFO lines (start, journal, activation, deactivation at SIGTERM) and a WARNING (refused
credentials, whose presented value must appear nowhere), the backend simulator through a WARNING
of its own; at ``WARNING`` no INFO line is left; a wrong value stops the broker at start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker_contracts.environment import BROKER_FAILOVER_LOG_FORMAT, BROKER_FAILOVER_LOG_LEVEL
from broker_contracts.token_verifier import token_verifier
from broker_simulators.local_processes import ProcessSet, RunningProcess
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    heartbeat,
    heartbeat_envelope,
    post_raw,
    start_sending,
    wait_until,
)

pytestmark = pytest.mark.integration

GUESS = "guess-json-logs-5e7d1c0b9a"


def json_lines(process: RunningProcess) -> list[dict[str, object]]:
    """Every line the process wrote, each parsed as one JSON object with the four fields."""
    parsed = []
    for line in process.log_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{process.name} wrote a line that is not JSON: {line!r}")
        assert isinstance(record, dict), line
        assert {"time", "level", "logger", "message"} <= set(record), line
        moment = datetime.strptime(str(record["time"]), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        assert abs((datetime.now(UTC) - moment).total_seconds()) < 600, line
        parsed.append(record)
    return parsed


def refuse_a_guess(broker: RunningProcess) -> None:
    status, _ = post_raw(broker.soap_url, heartbeat_envelope(active=False, epoch=0), token=GUESS)
    assert status == 500
    wait_until(lambda: "refused POST /soap" in broker.log_text(), 10, what="the refusal's warning")


def test_a_broker_and_its_simulators_write_one_json_object_per_line(
    processes: ProcessSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BROKER_FAILOVER_LOG_FORMAT, "json")
    monkeypatch.setenv(BROKER_FAILOVER_LOG_LEVEL, "INFO")
    relay = start_relay(processes, tmp_path, streams=1, messages_per_stream=1)
    broker = relay.broker
    assert heartbeat(broker, active=True, epoch=1).state == "Active"
    wait_until(lambda: "activated with epoch 1" in broker.log_text(), 10, what="the activation's line")
    refuse_a_guess(broker)
    assert broker.stop() == 0  # SIGTERM: deactivate, drain, exit; all of it logged as JSON too

    records = json_lines(broker)
    messages = [(record["level"], record["logger"], str(record["message"])) for record in records]
    assert any(level == "INFO" and text.startswith("event loop: ") for level, _, text in messages), messages
    assert any(level == "INFO" and text.startswith("activated with epoch 1") for level, _, text in messages)
    assert any(level == "INFO" and text.startswith("deactivated (epoch 1)") for level, _, text in messages)
    (refusal,) = [record for record in records if "refused POST /soap" in str(record["message"])]
    assert refusal["level"] == "WARNING" and str(refusal["logger"]).startswith("broker_service")
    assert GUESS not in broker.log_text()
    # The backend simulator reads the same variables: with the broker gone, its sends fail and it
    # says so once, as a JSON WARNING. (The cloud simulator is wired the same way; it logs nothing.)
    start_sending(relay.backend)
    wait_until(lambda: "retrying with backoff" in relay.backend.log_text(), 10, what="the backend's warning")
    (failure,) = [record for record in json_lines(relay.backend) if record["level"] == "WARNING"]
    assert failure["logger"] == "backend-simulator" and broker.url in str(failure["message"])


def test_at_warning_a_broker_writes_no_info_line(
    processes: ProcessSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BROKER_FAILOVER_LOG_FORMAT, "json")
    monkeypatch.setenv(BROKER_FAILOVER_LOG_LEVEL, "WARNING")
    broker = processes.start_broker(tmp_path)
    refuse_a_guess(broker)
    assert broker.stop() == 0
    levels = {str(record["level"]) for record in json_lines(broker)}
    assert "WARNING" in levels and levels <= {"WARNING", "ERROR", "CRITICAL"}, levels


def test_a_wrong_log_format_stops_the_broker_at_start_naming_the_variable(tmp_path: Path) -> None:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("BROKER_")}
    environ |= {
        BROKER_FAILOVER_LOG_FORMAT: "xml",
        "BROKER_TOKEN_VERIFIER": token_verifier("operator"),
        "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("backend"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "broker_service", "--data-dir", str(tmp_path)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--log-format / BROKER_FAILOVER_LOG_FORMAT = 'xml': use one of text, json" in done.stderr
