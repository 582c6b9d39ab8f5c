"""What the pod runtime knows of one container: its process, terminations, restarts and probe counters.

``containerID`` is ``local://<pid>``: the pid is the process group id, so a test can
``kill -9`` exactly the container it means, as ``crictl`` would let it.
"""

from __future__ import annotations

import datetime
import subprocess
from concurrent.futures import Future
from dataclasses import dataclass, field

from local_cluster.pod_references import Body
from local_cluster.pod_volumes import Mount


def rfc3339(epoch_seconds: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Termination:
    exit_code: int
    reason: str
    started_at: float
    finished_at: float
    message: str = ""

    def as_state(self) -> Body:
        state: Body = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
        }
        if self.message:
            state["message"] = self.message
        return state


def describe_exit(returncode: int) -> tuple[int, str]:
    """Popen's returncode to the (exitCode, reason) a container runtime reports."""
    if returncode < 0:
        # Killed by a signal: runtimes report 128 + signal number (137 for SIGKILL).
        return 128 - returncode, "Error"
    return returncode, "Completed" if returncode == 0 else "Error"


@dataclass
class ProbeState:
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    in_flight: Future[bool] | None = None


@dataclass
class ContainerRuntime:
    spec: Body
    restart_count: int = 0
    backoff_steps: int = 0  # doublings of the restart delay; reset after a long enough run
    started_once: bool = False
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    next_start_at: float = 0.0
    current: Termination | None = None
    last: Termination | None = None
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    ready: bool = False
    readiness: ProbeState = field(default_factory=ProbeState)
    liveness: ProbeState = field(default_factory=ProbeState)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])
