"""Waiting for the prerequisites that ``make test`` builds behind the tests.

``hack/test-behind-prerequisites.sh`` builds the groups of ``TEST_PREREQ_GROUPS`` (Makefile) in
their order (the first two side by side) while pytest runs, and writes into
``$BROKER_FAILOVER_PREREQS_DIR``, per group, its log, its make command and, once done, its exit
status. A test that needs a group waits here until the group is done, showing the build's latest
progress line now and then, and fails (never skips) with the end of the log if the build failed or
stopped (``tests/conftest.py`` waits before the test's timeout starts, and fails the test in its
setup). Without the variable (plain ``pytest``, ``make e2e``) the prerequisites were built before
pytest started, and nothing waits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "BROKER_FAILOVER_PREREQS_DIR"
STREAM_ENV = "BROKER_FAILOVER_TEST_STREAM"  # "second" in the second pytest process of make test
WAIT_LIMIT_SECONDS = 3600.0  # a failure limit: a fresh machine's whole build takes about half of it
POLL_SECONDS = 2.0
PROGRESS_EVERY_SECONDS = 60.0


def prerequisites_dir() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def group_order() -> list[str]:
    """The groups in the order they are built (empty when nothing builds behind the tests)."""
    folder = prerequisites_dir()
    if folder is None or not (folder / "order").is_file():
        return []
    return (folder / "order").read_text().split()


def _builder_alive(folder: Path) -> bool:
    try:
        os.kill(int((folder / "builder.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _latest_progress(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if line.startswith(">>")]
    return lines[-1] if lines else "(no progress line yet)"


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


QUIET_DONE = "quiet-tests-done"  # the main stream reached its first test that needs a group
CLAIMS = "claims"  # one file per shared module, made by the stream that runs it


def second_stream() -> bool:
    return os.environ.get(STREAM_ENV) == "second"


def mark_quiet_tests_done() -> None:
    """Called by the main stream when it reaches its first test that needs a prerequisite: the
    tests before it (integration, with sub-second timeouts) are done, so the second stream's
    clusters may start beside it."""
    folder = prerequisites_dir()
    if folder is not None and not second_stream():
        (folder / QUIET_DONE).touch()


def wait_for_quiet_tests(say: Callable[[str], None]) -> None:
    """In the second stream: wait (bounded) until the main stream's quiet tests are done. On a
    fresh machine they end long before the cluster is built; on a warm one this keeps the second
    stream's clusters from running beside them."""
    folder = prerequisites_dir()
    if folder is None or not second_stream():
        return
    started = time.monotonic()
    if not (folder / QUIET_DONE).exists():
        say("waiting for the main stream's tests that need no prerequisite to finish")
    while not (folder / QUIET_DONE).exists() and time.monotonic() - started < WAIT_LIMIT_SECONDS:
        time.sleep(POLL_SECONDS)


def wait_for_group(group: str, say: Callable[[str], None]) -> str | None:
    """Wait until ``group`` and the groups built before it are built (a later group may use an
    earlier one's output: skaffold builds the images); why the test cannot run if one of them
    failed, stopped or took too long, else None."""
    folder = prerequisites_dir()
    if folder is None:
        return None
    order = group_order()
    if group not in order:
        return f"no prerequisite group {group!r} in {folder / 'order'}: see TEST_PREREQ_GROUPS (Makefile)"
    for built_first in order[: order.index(group) + 1]:
        if problem := _wait_for_one(folder, built_first, say):
            return problem
    return None


def _wait_for_one(folder: Path, group: str, say: Callable[[str], None]) -> str | None:
    status, log = folder / f"{group}.rc", folder / f"{group}.log"
    targets = folder / f"{group}.targets"
    command = targets.read_text().strip() if targets.exists() else group
    started = time.monotonic()
    next_progress = 0.0
    while not status.exists():
        waited = time.monotonic() - started
        if waited >= next_progress:
            say(f"waiting for `{command}` ({waited:.0f} s so far; log {log}): {_latest_progress(log)}")
            next_progress = waited + PROGRESS_EVERY_SECONDS
        if not _builder_alive(folder) and not status.exists():
            return f"the builder of `{command}` stopped before it finished; end of {log}:\n{_tail(log)}"
        if waited > WAIT_LIMIT_SECONDS:
            return f"`{command}` still not built after {waited:.0f} s; end of {log}:\n{_tail(log)}"
        time.sleep(POLL_SECONDS)
    code = status.read_text().strip()
    if code != "0":
        return f"`{command}` failed (exit status {code}); end of {log}:\n{_tail(log)}"
    if time.monotonic() - started > POLL_SECONDS:
        say(f"`{command}` built after {time.monotonic() - started:.0f} s of waiting")
    return None


def claim_module(module_id: str) -> bool:
    """Whether this stream runs ``module_id`` (a test file's node id), one of the modules both
    streams collect (tests/conftest.py): the first stream to ask gets it, the other leaves it out.
    Outside make test there is one stream, which runs everything."""
    folder = prerequisites_dir()
    if folder is None:
        return True
    claims = folder / CLAIMS
    claims.mkdir(exist_ok=True)
    stream = "second" if second_stream() else "main"
    try:
        descriptor = os.open(
            claims / module_id.replace("/", "__"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
        )
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as claim:
        claim.write(f"{stream}\n")
    return True
