"""Restart the API server when it exits, as a static pod's kubelet restarts a crashed kube-apiserver.

On a kubeadm node kube-apiserver is a static pod: when its process dies (OOM kill, crash,
``kill -9``) the kubelet starts the container again with the same manifest, so the same
flags, etcd data and certificates, on the same address. ``ProcessKeeper`` does that for the
sealed cluster's supervisor (``sealed_supervisor.serve``): a thread waits for the process to
exit, starts the same command again (``ManagedProcess.respawn``), and waits until it is ready.

Backoff, bounded like the kubelet's CrashLoopBackOff but shorter: the first restart is
immediate; a process that exits again before it got ready is restarted after 1, 2, 4, 8 s;
after ``max_failures`` such starts in a row the keeper gives up and says why (exit code and
log tail) in ``failure``: the supervisor then stops the cluster, as it does when the node
agent exits. A start that got ready resets the count. A start that is not ready within
``ready_timeout_seconds`` counts as a failure and is killed (the kubelet's liveness probe).

What it does not do: restart anything but the process it was given (etcd and the
controller-manager are not watched), or survive the supervisor itself.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from local_cluster.control_plane import ApiProbe, ControlPlane
from local_cluster.processes import ManagedProcess, kill_process_group


@dataclass(frozen=True)
class RestartPolicy:
    backoff_seconds: float = 1.0  # before the 2nd start in a row that did not get ready; doubles
    max_backoff_seconds: float = 8.0
    max_failures: int = 5  # starts in a row that exited (or hung) before ready: give up
    ready_timeout_seconds: float = 90.0

    def delay(self, failures: int) -> float:
        return (
            0.0
            if failures == 0
            else min(self.backoff_seconds * 2 ** (failures - 1), self.max_backoff_seconds)
        )


def _say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class ProcessKeeper:
    """Keep ``process`` running: restart it whenever it exits (see the module doc)."""

    def __init__(
        self,
        process: ManagedProcess,
        ready: Callable[[], bool],
        on_restart: Callable[[ManagedProcess], None] = lambda process: None,
        policy: RestartPolicy | None = None,
    ) -> None:
        self.process = process
        self.ready = ready
        self.on_restart = on_restart
        self.policy = policy or RestartPolicy()
        self.restarts = 0
        self.failure: str | None = None  # set once it gave up
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"keep-{process.name}", daemon=True)

    def start(self) -> ProcessKeeper:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the process itself is stopped, or the keeper would restart it)."""
        self.stopping.set()
        self.thread.join(timeout=10)

    def _wait_exit(self) -> bool:
        while self.process.popen.poll() is None:
            if self.stopping.wait(0.1):
                return False
        return True

    def _wait_ready(self) -> bool:
        """True once ready; False when the new process exited or hung (then it is killed)."""
        deadline = time.monotonic() + self.policy.ready_timeout_seconds
        while not self.stopping.is_set():
            if self.process.exited():
                return False
            if self.ready():
                return True
            if time.monotonic() > deadline:
                timeout = self.policy.ready_timeout_seconds
                _say(f"{self.process.name} not ready {timeout:.0f}s after its start; killing it")
                kill_process_group(self.process.pid, signal.SIGKILL)
                self.process.popen.wait()
                return False
            self.stopping.wait(0.2)
        return True

    def _run(self) -> None:
        failures = 0  # starts in a row that did not get ready
        while self._wait_exit():
            pid, code = self.process.pid, self.process.popen.returncode
            if failures >= self.policy.max_failures:
                self.failure = (
                    f"{self.process.name} exited (code {code}) {failures} times in a row before it got "
                    f"ready; not restarting it again. Log {self.process.log_path}:\n"
                    f"{self.process.log_tail(15)}"
                )
                _say(self.failure)
                return
            delay = self.policy.delay(failures)
            _say(f"{self.process.name} (pid {pid}) exited with code {code}; restarting it in {delay:.1f}s")
            if self.stopping.wait(delay):
                return
            started = time.monotonic()
            try:
                self.process.respawn()
            except RuntimeError as error:  # stopped meanwhile (the supervisor's teardown)
                _say(f"not restarting {self.process.name}: {error}")
                return
            self.restarts += 1
            self.on_restart(self.process)
            ready = self._wait_ready()
            if self.stopping.is_set():
                return
            if ready:
                failures = 0
                _say(
                    f"{self.process.name} restarted (pid {self.process.pid}), ready in "
                    f"{time.monotonic() - started:.1f}s; {self.restarts} restart(s) so far"
                )
            else:
                failures += 1


def keep_apiserver(plane: ControlPlane, on_restart: Callable[[ManagedProcess], None]) -> ProcessKeeper:
    """A keeper (not started yet) for the control plane's kube-apiserver, ready meaning ``/readyz`` ok."""
    apiserver = next(process for process in plane.processes if process.name == "kube-apiserver")
    probe = ApiProbe(plane.server, plane.pki)
    return ProcessKeeper(apiserver, lambda: probe.status("/readyz") == 200, on_restart)
