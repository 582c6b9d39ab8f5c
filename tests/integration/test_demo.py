"""`make demo-local` (the engine without Kubernetes), run small: it must end with PASSED and exit 0.

The demo is the end-to-end path a newcomer sees first (simulators, three real
brokers, the local runner, kill -9, failover, failback, an ordering check), so
it is tested like any other part rather than trusted to keep working.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from local_cluster.cluster import REPO_ROOT

pytestmark = pytest.mark.integration


def test_the_demo_fails_over_fails_back_and_delivers_everything_in_order(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo",
            "--streams",
            "4",
            "--messages-per-stream",
            "300",
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[demo] PASSED: 4 outbound and 2 inbound streams complete, in order, none twice" in output
    # The story the demo tells must have happened, not just its ending.
    assert "event Warning Failover: broker broker-b is active" in output
    assert "event Normal Failback: broker broker-a is active" in output
    assert list(tmp_path.glob("message-log/*/*/*.jsonl")), "no closed message-log segment was written"
