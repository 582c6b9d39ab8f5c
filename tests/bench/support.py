"""Running a benchmark script the way ``make bench-*`` does, small, and reading what it printed.

Each smoke test runs ``bench/<script>`` as a real subprocess with this interpreter (the
virtualenv's), bounded by a timeout, and checks the exit status, the headline ``name=value`` on
the last line and the correctness lines. Never a timing: the figures are read, not judged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# After a timeout: SIGINT first, so the bench unwinds its `finally` blocks and stops the brokers,
# simulators or cluster it started (they run in sessions of their own), then SIGKILL.
INTERRUPT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class BenchRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def explain(self) -> str:
        """The command and the end of its output, for a failure message."""
        return (
            f"{' '.join(self.argv)} exited {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout (end) ---\n{self.stdout[-4000:]}\n--- stderr (end) ---\n{self.stderr[-6000:]}"
        )


def run_bench(script: str, *args: str, timeout: float) -> BenchRun:
    """``python bench/<script> <args>`` from the repository root; fails the test past ``timeout``."""
    argv = [sys.executable, str(REPO_ROOT / "bench" / script), *args]
    began = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=INTERRUPT_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        run = BenchRun(argv, process.returncode, stdout, stderr, time.monotonic() - began)
        pytest.fail(f"gave up after {timeout:.0f} s (interrupted)\n{run.explain()}")
    return BenchRun(argv, process.returncode, stdout, stderr, time.monotonic() - began)


def assert_succeeded(run: BenchRun) -> None:
    assert run.returncode == 0, run.explain()


def headline(run: BenchRun, name: str) -> float:
    """The value of the last stdout line, which must be ``name=<number>``."""
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines, f"no output\n{run.explain()}"
    match = re.fullmatch(rf"{re.escape(name)}=(-?\d+(?:\.\d+)?)", lines[-1].strip())
    assert match, f"last line {lines[-1]!r} is not {name}=<number>\n{run.explain()}"
    return float(match.group(1))


def counts(run: BenchRun, pattern: str, text: str | None = None) -> dict[str, int]:
    """The named integer groups of the first line ``pattern`` matches (in stdout unless ``text``)."""
    match = re.search(pattern, run.stdout if text is None else text, re.MULTILINE)
    assert match, f"no line matching {pattern!r}\n{run.explain()}"
    return {name: int(value) for name, value in match.groupdict().items()}
