"""``broker-local-runner`` as a real process against real brokers: the demo's path.

It reads a BrokerCluster manifest (endpoints mode), activates the first broker,
fails over when that broker is killed (no pod facts: after the lease), follows a
``preferredActive`` edit with a switchover, keeps the epoch in its state file,
and exits 0 on SIGTERM. Its stdout lines are the evidence.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_simulators.local_processes import DEFAULT_TOKEN, ProcessSet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def manifest(brokers: dict[str, str], preferred: str | None = None) -> str:
    spec: dict[str, object] = {
        "account": "acme",
        "company": "1000",
        "endpoints": [{"name": n, "url": u, "priority": i} for i, (n, u) in enumerate(brokers.items())],
        "heartbeat": {
            "intervalSeconds": 0.5,
            "timeoutSeconds": 0.5,
            "failureThreshold": 2,
            "leaseSeconds": 2,
        },
        "failback": "Manual",
    }
    if preferred:
        spec["preferredActive"] = preferred
    return yaml.safe_dump(
        {
            "apiVersion": "broker.failover.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": "acme-1000"},
            "spec": spec,
        }
    )


def wait_for_line(log: Path, text: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"no line with {text!r} within {within}s; runner output:\n{log.read_text()}")


def saved_state_naming(path: Path, active: str, within: float) -> dict[str, Any]:
    """The runner's state file once it names ``active`` (or as it last was, after ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        state = dict(yaml.safe_load(path.read_text()) or {})
        if (state.get("status") or {}).get("active") == active or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def test_local_runner_fails_over_switches_over_and_stops_cleanly(
    processes: ProcessSet, tmp_path: Path
) -> None:
    cloud = processes.start_cloud_simulator()
    backend = processes.start_backend_simulator()
    brokers = {
        name: processes.start_broker(name=name, backend_url=backend.url, cloud_url=cloud.url, lease_seconds=2)
        for name in ("b0", "b1", "b2")
    }
    urls = {name: broker.soap_url for name, broker in brokers.items()}
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(manifest(urls))
    token_file = tmp_path / "token"
    token_file.write_text(DEFAULT_TOKEN)
    log = tmp_path / "runner.out"
    with open(log, "wb") as out:
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker_operator.local_runner",
                str(cluster_file),
                "--token-file",
                str(token_file),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(log, "active=b0 epoch=1", 20)
        wait_for_line(log, "status phase=Healthy", 10)
        brokers["b0"].kill(signal.SIGKILL)
        wait_for_line(log, "event Warning Failover: broker b1 is active", 20)
        cluster_file.write_text(manifest(urls, preferred="b2"))
        wait_for_line(log, "event Normal Switchover: broker b2 is active", 20)
        # The event is logged in the step that moves the active; the state file is saved after it.
        state = saved_state_naming(tmp_path / "cluster.yaml.state.json", "b2", within=10)
        assert state["epoch"] >= 3 and state["status"]["active"] == "b2"
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=15) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=10)


def test_local_runner_refuses_a_bad_manifest(tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("kind: BrokerCluster\nmetadata: {name: x}\nspec: {replicas: 2}\n")
    result = subprocess.run(
        [sys.executable, "-m", "broker_operator.local_runner", str(cluster_file)],
        env={"BROKER_TOKEN": "t", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "spec.endpoints must list" in result.stderr
