"""Starting a container as a local process group, noticing its exit, and the restart backoff.

Each container is a process group (argv from the image table), its output appended to one
log file per container after a ``=== node agent: start #N`` marker line (``kubelet_api``
splits the file into instances at these). Every group is recorded under the pgid directory,
so the launcher can sweep them if the agent itself is SIGKILLed.

On exit, ``restartPolicy`` decides, with a capped exponential backoff: 1 s doubling to 10 s
(reset, as the kubelet resets it, once a container ran twice the cap without trouble), not
the kubelet's 10 s to 5 min, so tests see restarts quickly.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from pathlib import Path

from local_cluster.container_env import expand_references
from local_cluster.container_state import ContainerRuntime, ProbeState, Termination, describe_exit
from local_cluster.images import ImageNotMappedError, ImageTable
from local_cluster.pod_references import ContainerConfigError
from local_cluster.pod_sandbox import PodSandbox
from local_cluster.processes import kill_process_group

log = logging.getLogger("node-agent")
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 10.0


def container_log_path(pod_dir: Path, container_name: str) -> Path:
    """One file per container; each start appends a ``=== node agent: start #N`` line, then the output."""
    return pod_dir / "logs" / f"{container_name}.log"


def record_pgid(pgid_dir: Path, pgid: int, uid: str) -> None:
    # The launcher sweeps these if the agent itself is SIGKILLed.
    pgid_dir.mkdir(parents=True, exist_ok=True)
    (pgid_dir / str(pgid)).write_text(uid)


def forget_pgid(pgid_dir: Path, pgid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (pgid_dir / str(pgid)).unlink()


def backoff_seconds(container: ContainerRuntime) -> float:
    """The delay before the container's next start: doubling with each failure, capped."""
    return float(min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(container.backoff_steps, 10)))


def should_restart(restart_policy: str, termination: Termination) -> bool:
    return restart_policy == "Always" or (restart_policy == "OnFailure" and termination.exit_code != 0)


def start_container(
    container: ContainerRuntime,
    now: float,
    *,
    sandbox: PodSandbox,
    images: ImageTable,
    base_env: dict[str, str],
    pgid_dir: Path,
    uid: str,
    pod_ref: str,
) -> None:
    """Start the container's process group, or record why it cannot start (and when to retry)."""
    spec = container.spec
    try:
        container.mounts = sandbox.mounts(spec)
        container.env = sandbox.container_env(spec, base_env, container.mounts)
        argv = images.argv(spec["image"], spec.get("command"), spec.get("args"))
    except (ContainerConfigError, ImageNotMappedError) as error:
        reason = "ErrImagePull" if isinstance(error, ImageNotMappedError) else "CreateContainerConfigError"
        container.waiting_reason, container.waiting_message = reason, str(error)
        container.next_start_at = now + 2.0
        return
    argv = [sandbox.rewrite_paths(expand_references(part, container.env), container.mounts) for part in argv]
    # In pod-network mode the launcher enters workingDir as written, once the volumes are mounted.
    argv = [*sandbox.launcher(container.mounts, spec.get("workingDir")), *argv]
    working_dir = sandbox.pod_dir
    if not sandbox.isolated and spec.get("workingDir"):
        working_dir = Path(sandbox.rewrite_paths(spec["workingDir"], container.mounts))
        if not working_dir.is_dir():
            working_dir = sandbox.pod_dir
    log_path = container_log_path(sandbox.pod_dir, container.name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if container.started_once:
        container.restart_count += 1
    container.started_once = True
    with log_path.open("ab") as log_file:
        log_file.write(f"=== node agent: start #{container.restart_count} argv={argv}\n".encode())
        log_file.flush()
        try:
            container.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=container.env,
                cwd=working_dir,
                start_new_session=True,
            )
        except OSError as error:
            container.process = None
            container.last = container.current or container.last
            container.current = Termination(
                128, "StartError", time.time(), time.time(), f"{argv[0]}: {error}"
            )
            container.next_start_at = now + backoff_seconds(container)
            container.backoff_steps += 1
            return
    record_pgid(pgid_dir, container.process.pid, uid)
    log.info("%s: started container %s as process group %d", pod_ref, container.name, container.process.pid)
    container.started_at = time.time()  # wall clock for status; `now` is monotonic, for scheduling
    container.last = container.current or container.last
    container.current = None
    container.waiting_reason = container.waiting_message = ""
    container.ready = "readinessProbe" not in spec or not spec["readinessProbe"]
    container.readiness = ProbeState(
        next_at=now + float((spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0))
    )
    container.liveness = ProbeState(
        next_at=now + float((spec.get("livenessProbe") or {}).get("initialDelaySeconds", 0))
    )


def reap_container(
    container: ContainerRuntime,
    now: float,
    *,
    restart_policy: str,
    terminating: bool,
    pgid_dir: Path,
    pod_ref: str,
) -> None:
    """If the container's process exited: record how, and schedule its restart as the policy says."""
    process = container.process
    if process is None or process.poll() is None:
        return
    exit_code, reason = describe_exit(process.returncode)
    # The leader is gone; anything it forked into the group goes with it, as in a container.
    kill_process_group(process.pid, signal.SIGKILL)
    forget_pgid(pgid_dir, process.pid)
    container.process = None
    container.ready = False
    container.current = Termination(exit_code, reason, container.started_at, time.time())
    # As the kubelet: a container that ran twice the longest back-off without trouble
    # starts its back-off afresh; one that keeps failing backs off longer each time.
    if container.current.finished_at - container.current.started_at >= 2 * BACKOFF_MAX_SECONDS:
        container.backoff_steps = 0
    log.info("%s: container %s exited with %d", pod_ref, container.name, exit_code)
    if should_restart(restart_policy, container.current) and not terminating:
        container.next_start_at = now + backoff_seconds(container)
        container.waiting_reason = "CrashLoopBackOff"
        container.waiting_message = f"back-off {backoff_seconds(container):.0f}s restarting failed container"
        container.backoff_steps += 1
