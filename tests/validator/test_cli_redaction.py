"""``broker-validator`` never prints the credentials of a Spark master URL it was given.

A ``--master`` with userinfo (``k8s://https://user:password@apiserver``) is a credential in a
command line; when the validator cannot use it, its message (stderr, the CronJob's log) names the
master without them. A real process, as a CronJob runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PASSWORD = "MasterPW-leak-3e7f"


def test_an_unusable_master_is_named_without_its_credentials(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    done = subprocess.run(
        [
            sys.executable, "-m", "broker_validator.cli",
            "--store", str(store), "--report-dir", str(tmp_path / "r"),
            "--master", f"spark://spark-user:{PASSWORD}@127.0.0.1:7077?token={PASSWORD}x",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "is not supported" in done.stderr and "127.0.0.1:7077" in done.stderr
    assert PASSWORD not in done.stderr + done.stdout and "spark-user" not in done.stderr
