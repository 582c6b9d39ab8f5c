"""``python -m broker_operator`` takes its log format and level before anything else (issue 42).

No API server here (the e2e tests run the operator against one): the process is started with no
kubeconfig and no service account, so it stops at its first step that needs one. That is enough to
see the real entrypoint read ``BROKER_FAILOVER_LOG_FORMAT``, and that even the crash comes out as
JSON lines a pipeline can read; a wrong level stops it at start with a usage error (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def run_operator(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("BROKER_", "OPERATOR_", "KUBERNETES_"))
    }
    environ |= {"KUBECONFIG": str(tmp_path / "no-kubeconfig"), **variables}
    return subprocess.run(
        [sys.executable, "-m", "broker_operator", "--metrics-port", "0", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_a_cluster_the_operator_still_says_why_in_json(tmp_path: Path) -> None:
    done = run_operator(tmp_path, BROKER_FAILOVER_LOG_FORMAT="json")
    assert done.returncode == 1, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line, or this fails
    crash = lines[-1]
    assert (crash["level"], crash["logger"], crash["message"]) == (
        "CRITICAL",
        "uncaught",
        "uncaught exception",
    )
    assert "ConfigException" in str(crash["exception"])


def test_a_wrong_level_stops_the_operator_at_start(tmp_path: Path) -> None:
    done = run_operator(tmp_path, "--log-level", "loud")
    assert done.returncode == 2
    assert (
        "--log-level / BROKER_FAILOVER_LOG_LEVEL = 'loud': use one of DEBUG, INFO, WARNING, ERROR"
        in done.stderr
    )
