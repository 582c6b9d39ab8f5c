"""A broker holds verifiers, never tokens, and counts and logs the calls it refuses (issue 39 items 5, 11).

A real broker process, started the way the local runs and tests start every broker. Whoever
reads what the broker holds (its environment, its command line, every file under its work
directory) finds no token there, so a compromised broker cannot call its peers; the operator's
token still opens Heartbeat, and guesses are refused, counted in ``/metrics`` by role and reason,
and logged once per window with the caller's address and never the value guessed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker_contracts.token_verifier import token_verifier
from broker_simulators.local_processes import DEFAULT_BACKEND_TOKEN, DEFAULT_TOKEN, ProcessSet
from tests.integration.broker.conftest import start_relay
from tests.integration.broker.helpers import (
    get_text,
    heartbeat_envelope,
    post_raw,
    raw_fault_code,
    reply_state,
)

pytestmark = pytest.mark.integration

GUESSES = 25


def labelled_metric(text: str, name: str, labels: dict[str, str]) -> float:
    """The sample of ``name`` with exactly ``labels``; 0 when the series does not exist yet."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_the_broker_holds_no_token_and_counts_and_logs_refusals(
    processes: ProcessSet, tmp_path: Path
) -> None:
    relay = start_relay(processes, tmp_path, streams=1, messages_per_stream=1)
    broker = relay.broker
    tokens = (DEFAULT_TOKEN.encode(), DEFAULT_BACKEND_TOKEN.encode())

    # What the process holds: its environment, its command line, and every file it was given.
    environ = Path(f"/proc/{broker.pid}/environ").read_bytes()
    cmdline = Path(f"/proc/{broker.pid}/cmdline").read_bytes()
    workdir = tmp_path / "broker-0"
    files = {path: path.read_bytes() for path in workdir.rglob("*") if path.is_file()}
    named = [Path(arg) for arg in cmdline.decode().split("\0") if arg.startswith(str(tmp_path))]
    assert any(path.name.endswith(".sha256") for path in named), cmdline
    for token in tokens:
        assert token not in environ, "a token in the broker's environment"
        assert token not in cmdline, "a token on the broker's command line"
        for path, content in files.items():
            assert token not in content, f"a token in {path}"
    verifiers = b"".join(content for path, content in files.items() if path.name.endswith(".sha256"))
    assert token_verifier(DEFAULT_TOKEN).encode() in verifiers
    assert token_verifier(DEFAULT_BACKEND_TOKEN).encode() in verifiers

    # The operator's token opens Heartbeat; its verifier, a guess, none or the backend's do not.
    body = heartbeat_envelope(active=False, epoch=0)
    status, reply = post_raw(broker.soap_url, body, token=DEFAULT_TOKEN)
    assert (status, reply_state(reply)[0]) == (200, "Inactive")
    guesses = [f"guess-{n}-{'x' * 40}" for n in range(GUESSES)]
    for guess in [*guesses, token_verifier(DEFAULT_TOKEN)]:
        status, reply = post_raw(broker.soap_url, body, token=guess)
        assert (status, raw_fault_code(reply)) == (500, "UNAUTHENTICATED")
    assert raw_fault_code(post_raw(broker.soap_url, body, token=None)[1]) == "UNAUTHENTICATED"
    assert (
        raw_fault_code(post_raw(broker.soap_url, body, token=DEFAULT_BACKEND_TOKEN)[1]) == "UNAUTHENTICATED"
    )

    _, metrics = get_text(broker.url + "/metrics")
    failures = "broker_auth_failures_total"
    # One port serves both roles here, so the role a refused call needed is "any" until the
    # operation is known; the backend's credential on Heartbeat is refused for the operator's role.
    assert labelled_metric(metrics, failures, {"role": "any", "reason": "unknown"}) == GUESSES + 1
    assert labelled_metric(metrics, failures, {"role": "any", "reason": "missing"}) == 1
    assert labelled_metric(metrics, failures, {"role": "operator", "reason": "wrong_role"}) == 1
    assert "guess-" not in metrics

    # One warning for the whole burst (the window is a minute), naming the caller and the call.
    log = broker.log_text()
    warnings = [line for line in log.splitlines() if "refused POST /soap" in line]
    assert len(warnings) == 1, warnings
    assert re.search(r"from 127\.\d+\.\d+\.\d+", warnings[0]), warnings[0]
    for secret in [*guesses, DEFAULT_TOKEN, DEFAULT_BACKEND_TOKEN]:
        assert secret not in log
