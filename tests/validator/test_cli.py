"""``broker-validator`` as a user runs it: a real process, its summary, its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.validator.logbuilder import History

VALIDATOR = [sys.executable, "-m", "broker_validator.cli"]


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VALIDATOR, *map(str, args), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_exit_codes_summary_and_reports(tmp_path: Path) -> None:
    h = History(tmp_path / "store")
    h.log("activated", "b0", 1)
    h.relay("b0", 1, "s1", range(1, 6))
    h.close()
    passed = run_cli("--store", h.store, "--report-dir", tmp_path / "r1")
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.startswith("ordering Passed: 0 violations in 1 clusters (full run: 1 new segments")
    assert "c1: Passed" in passed.stdout and str(tmp_path / "r1" / "report.html") in passed.stdout

    h.log("delivered", "b0", 1, "outbound", "s1", 2)  # the target took seq 2 twice
    h.close()
    failed = run_cli("--store", h.store, "--report-dir", tmp_path / "r2")
    assert failed.returncode == 1, failed.stderr
    assert "ordering Failed: 1 violations" in failed.stdout and "incremental run" in failed.stdout
    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert report["result"] == "Failed"
    assert (report["violations"], report["anomalies"]["duplicate-delivery"]) == (1, 1)


def test_an_unreadable_store_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    missing = run_cli("--store", tmp_path / "nowhere", "--report-dir", tmp_path / "r")
    assert missing.returncode == 2
    assert f"message-log store {tmp_path / 'nowhere'} does not exist" in missing.stderr
    assert not (tmp_path / "r").exists()

    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_dir = run_cli("--store", a_file, "--report-dir", tmp_path / "r")
    assert not_dir.returncode == 2 and "is not a directory" in not_dir.stderr


def test_bad_arguments_are_refused_naming_the_flag(tmp_path: Path) -> None:
    result = run_cli("--store", tmp_path, "--report-dir", tmp_path / "r", "--settle-seconds", "-1")
    assert result.returncode == 2 and "--settle-seconds (-1.0) must not be negative" in result.stderr


def test_read_bounds_must_be_positive_and_are_documented(tmp_path: Path) -> None:
    for flag in ("--max-segment-bytes", "--max-record-bytes"):
        result = run_cli("--store", tmp_path, "--report-dir", tmp_path / "r", flag, "0")
        assert result.returncode == 2 and f"{flag} (0) must be at least 1" in result.stderr
    helped = subprocess.run([*VALIDATOR, "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "default 268435456" in helped.stdout and "default 65536" in helped.stdout
