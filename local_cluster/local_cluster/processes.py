"""Child processes that never outlive the harness: own process group, log file, bounded stop.

Why process groups: a child may start a tree of its own (containerd its shims, a shell its
command, ...). Each child starts in a new session, so ``killpg`` reaches everything it spawned,
and a Ctrl-C in the terminal reaches only us, letting teardown run in order (the node first, so
it can stop its pods; then controller-manager, apiserver, etcd).

``reap_on_exit`` registers an atexit hook and SIGTERM/SIGINT/SIGHUP handlers that
stop every process still registered, so an interrupted test run or a killed
``cluster up`` supervisor leaves nothing behind. What it cannot cover: SIGKILL of the
harness itself; ``cluster down`` covers that (and for the sealed cluster the kernel does: its
namespace ends with its supervisor).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

_LIVE: list[ManagedProcess] = []
# Other things to stop on exit (a sealed cluster's supervisor), newest last; each removes itself
# once stopped by its owner.
_CLEANUPS: list[Callable[[], None]] = []


class ManagedProcess:
    """One child in its own process group, its output in ``log_path``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.argv = list(argv)
        self.environment = dict(env) if env is not None else None
        self.cwd = cwd
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.popen = self._spawn()
        _LIVE.append(self)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment,
                cwd=self.cwd,
                start_new_session=True,
            )

    def respawn(self) -> None:
        """Start the same command again (same argv, env, cwd; output appended to the same log)
        once the previous one exited, as a kubelet restarts a static pod's container."""
        if self.popen.poll() is None:
            raise RuntimeError(f"{self.name} (pid {self.popen.pid}) is still running")
        if self not in _LIVE:
            raise RuntimeError(f"{self.name} was stopped; it is not restarted")
        # Whatever the old leader forked may still hold its group; a new session starts clean.
        kill_process_group(self.popen.pid, signal.SIGKILL)
        self.popen = self._spawn()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_seconds``, and reap the leader."""
        if self in _LIVE:
            _LIVE.remove(self)
        kill_process_group(self.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_seconds)
        # The leader may be gone while children it forked still hold the group.
        kill_process_group(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


def kill_process_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a whole process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_group_gone(pgid: int, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if not process_group_alive(pgid):
            return True
        time.sleep(0.05)
    return not process_group_alive(pgid)


def on_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run ``cleanup`` when ``reap_on_exit``'s hooks fire (unless ``cancel_on_exit`` came first)."""
    _CLEANUPS.append(cleanup)
    return cleanup


def cancel_on_exit(cleanup: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        _CLEANUPS.remove(cleanup)


def stop_all_live(grace_seconds: float = 3.0) -> None:
    """Stop every registered cleanup and child, newest first (the reverse of start order)."""
    for cleanup in reversed(list(_CLEANUPS)):
        cancel_on_exit(cleanup)
        with contextlib.suppress(Exception):  # the others must still run
            cleanup()
    for process in reversed(list(_LIVE)):
        process.stop(grace_seconds)


_hooks_installed = False


def reap_on_exit() -> None:
    """Stop all registered children at interpreter exit and on SIGTERM/SIGINT/SIGHUP."""
    global _hooks_installed  # noqa: PLW0603 - one process-wide hook, installed once
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop_all_live)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_all_live()
        # Re-raise with the default action so our exit status says what killed us.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    # SIGINT stays a KeyboardInterrupt (pytest needs it); atexit then cleans up.


def host_pid_of(namespace_init: int, pid: int) -> int:
    """The machine's pid of the process whose pid is ``pid`` in the PID namespace whose init (PID 1)
    is the machine's ``namespace_init``, or in one nested in it (a container's).

    ``NSpid`` lists a process's pid in each namespace from the machine's down; the init's list
    says at which depth to look. Another namespace may have a process of that pid at that depth,
    so the match must also descend from the init (its parents lead there).
    """

    def status(entry: str) -> dict[str, list[str]]:
        lines = Path(f"/proc/{entry}/status").read_text().splitlines()
        return {key: value.split() for key, _, value in (line.partition(":") for line in lines)}

    depth = len(status(str(namespace_init))["NSpid"]) - 1
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, KeyError, ValueError):
            nspids = status(entry.name)["NSpid"]
            if len(nspids) <= depth or int(nspids[depth]) != pid:
                continue
            ancestor = int(entry.name)
            for _ in range(64):  # bounded: a process tree is never this deep here
                if ancestor == namespace_init:
                    return int(entry.name)
                if ancestor <= 1:
                    break
                ancestor = int(status(str(ancestor))["PPid"][0])
    raise ProcessLookupError(f"no process with pid {pid} in the PID namespace of {namespace_init}")
