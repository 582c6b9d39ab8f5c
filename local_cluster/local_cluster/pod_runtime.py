"""The kubelet half of the node agent for one pod: processes, restarts, readiness, status.

A ``PodRuntime`` is a small state machine stepped by the agent's loop: start each
container as a local process group (argv from the image table), notice exits, apply
``restartPolicy`` with a capped exponential backoff, run readiness and liveness probes
on a thread pool (a SIGSTOPped broker must not stall the loop; failing liveness kills
the container, as the kubelet does), and compute the pod status the
kubelet would report (phase, conditions, containerStatuses with exit codes and
restart counts). On deletion it sends SIGTERM to every process group and SIGKILL at
the end of the grace period.

``containerID`` is ``local://<pid>``: the pid is the process group id, so a test can
``kill -9`` exactly the container it means, as ``crictl`` would let it.

What it does not do: init containers, sidecars, startup probes,
resource limits, ``kubectl exec`` (``kubectl logs`` works: ``kubelet_api`` serves the log files),
security contexts or user namespaces. The restart backoff is 1 s doubling to 10 s (reset, as the
kubelet resets it, once a container ran twice the cap without trouble),
not the kubelet's 10 s to 5 min, so tests see restarts quickly.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from local_cluster.images import ImageNotMappedError, ImageTable, image_key
from local_cluster.pod_sandbox import (
    Body,
    ContainerConfigError,
    Mount,
    PodSandbox,
    expand_references,
)
from local_cluster.processes import kill_process_group, process_group_alive, wait_group_gone

log = logging.getLogger("node-agent")
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 10.0


def container_log_path(pod_dir: Path, container_name: str) -> Path:
    """One file per container; each start appends a ``=== node agent: start #N`` line, then the output."""
    return pod_dir / "logs" / f"{container_name}.log"


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


@dataclass(frozen=True)
class PodRuntimeContext:
    """What every PodRuntime shares: the image table, base env, pgid registry dir, probe pool."""

    images: ImageTable
    base_env: dict[str, str]
    pgid_dir: Path
    probe_pool: ThreadPoolExecutor
    # Secret/ConfigMap volumes are re-read this often (the kubelet's sync: about a minute) on a
    # pool of their own, so a slow API server never delays a probe.
    volume_pool: ThreadPoolExecutor
    volume_resync_seconds: float = 3.0


class PodRuntime:
    def __init__(self, pod: Body, sandbox: PodSandbox, context: PodRuntimeContext) -> None:
        self.pod = pod
        self.sandbox = sandbox
        self.context = context
        self.containers = [ContainerRuntime(spec=spec) for spec in pod["spec"]["containers"]]
        self.start_time = time.time()
        self.volumes_ready = False
        self.volume_retry_at = 0.0
        self.volume_resync: Future[list[str]] | None = None
        self.volume_resync_at = 0.0
        self.terminating_deadline: float | None = None
        self.condition_times: dict[str, tuple[str, str]] = {}

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    def _pod_ref(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def restart_policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy") or "Always")

    # ---- process control ----------------------------------------------------------

    def _record_pgid(self, pgid: int) -> None:
        # The launcher sweeps these if the agent itself is SIGKILLed.
        self.context.pgid_dir.mkdir(parents=True, exist_ok=True)
        (self.context.pgid_dir / str(pgid)).write_text(self.uid)

    def _forget_pgid(self, pgid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.context.pgid_dir / str(pgid)).unlink()

    def _start(self, container: ContainerRuntime, now: float) -> None:
        spec = container.spec
        try:
            container.mounts = self.sandbox.mounts(spec)
            container.env = self.sandbox.container_env(spec, self.context.base_env, container.mounts)
            argv = self.context.images.argv(spec["image"], spec.get("command"), spec.get("args"))
        except (ContainerConfigError, ImageNotMappedError) as error:
            reason = (
                "ErrImagePull" if isinstance(error, ImageNotMappedError) else "CreateContainerConfigError"
            )
            container.waiting_reason, container.waiting_message = reason, str(error)
            container.next_start_at = now + 2.0
            return
        argv = [
            self.sandbox.rewrite_paths(expand_references(part, container.env), container.mounts)
            for part in argv
        ]
        # In pod-network mode the launcher enters workingDir as written, once the volumes are mounted.
        argv = [*self.sandbox.launcher(container.mounts, spec.get("workingDir")), *argv]
        working_dir = self.sandbox.pod_dir
        if not self.sandbox.isolated and spec.get("workingDir"):
            working_dir = Path(self.sandbox.rewrite_paths(spec["workingDir"], container.mounts))
            if not working_dir.is_dir():
                working_dir = self.sandbox.pod_dir
        log_path = container_log_path(self.sandbox.pod_dir, container.name)
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
                container.next_start_at = now + self._backoff(container)
                container.backoff_steps += 1
                return
        self._record_pgid(container.process.pid)
        log.info(
            "%s: started container %s as process group %d",
            self._pod_ref(),
            container.name,
            container.process.pid,
        )
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

    def _backoff(self, container: ContainerRuntime) -> float:
        return float(min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(container.backoff_steps, 10)))

    def _should_restart(self, termination: Termination) -> bool:
        return self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and termination.exit_code != 0
        )

    def _reap(self, container: ContainerRuntime, now: float) -> None:
        process = container.process
        if process is None or process.poll() is None:
            return
        exit_code, reason = describe_exit(process.returncode)
        # The leader is gone; anything it forked into the group goes with it, as in a container.
        kill_process_group(process.pid, signal.SIGKILL)
        self._forget_pgid(process.pid)
        container.process = None
        container.ready = False
        container.current = Termination(exit_code, reason, container.started_at, time.time())
        # As the kubelet: a container that ran twice the longest back-off without trouble
        # starts its back-off afresh; one that keeps failing backs off longer each time.
        if container.current.finished_at - container.current.started_at >= 2 * BACKOFF_MAX_SECONDS:
            container.backoff_steps = 0
        log.info("%s: container %s exited with %d", self._pod_ref(), container.name, exit_code)
        if self._should_restart(container.current) and self.terminating_deadline is None:
            container.next_start_at = now + self._backoff(container)
            container.waiting_reason = "CrashLoopBackOff"
            container.waiting_message = (
                f"back-off {self._backoff(container):.0f}s restarting failed container"
            )
            container.backoff_steps += 1

    def _will_start(self, container: ContainerRuntime) -> bool:
        if self.terminating_deadline is not None or container.process is not None:
            return False
        return container.current is None or self._should_restart(container.current)

    # ---- readiness ----------------------------------------------------------------

    def _probe_once(self, container: ContainerRuntime, probe: Body) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if probe.get("exec"):
            return self._exec_probe(container, probe["exec"], timeout)
        if probe.get("tcpSocket"):
            return self._tcp_probe(container, probe["tcpSocket"], timeout)
        if probe.get("httpGet"):
            return self._http_probe(container, probe["httpGet"], timeout)
        return False  # grpc probes are not supported: never ready, visibly.

    def _exec_probe(self, container: ContainerRuntime, action: Body, timeout: float) -> bool:
        argv = [self.sandbox.rewrite_paths(part, container.mounts) for part in action["command"]]
        # Exec probes run inside the pod, with its mounts and working directory.
        argv = [*self.sandbox.launcher(container.mounts, container.spec.get("workingDir")), *argv]
        try:
            result = subprocess.run(
                argv, env=container.env, capture_output=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def _tcp_probe(self, container: ContainerRuntime, action: Body, timeout: float) -> bool:
        address = (action.get("host") or self.sandbox.pod_ip, self._port(container, action["port"]))
        try:
            with socket.create_connection(address, timeout=timeout):
                return True
        except OSError:
            return False

    def _http_probe(self, container: ContainerRuntime, action: Body, timeout: float) -> bool:
        scheme = str(action.get("scheme") or "HTTP").lower()
        host = action.get("host") or self.sandbox.pod_ip
        url = f"{scheme}://{host}:{self._port(container, action['port'])}{action.get('path', '/')}"
        headers = {header["name"]: header["value"] for header in action.get("httpHeaders") or []}
        # The kubelet does not verify probe certificates either.
        context = ssl._create_unverified_context() if scheme == "https" else None
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:
                return 200 <= int(reply.status) < 400
        except urllib.error.HTTPError as error:
            return 200 <= error.code < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    @staticmethod
    def _port(container: ContainerRuntime, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for declared in container.spec.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise ValueError(f"container {container.name} has no port named {port!r}")

    def _step_probe(
        self, container: ContainerRuntime, probe: Body, state: ProbeState, now: float
    ) -> bool | None:
        """Advance one probe; True/False once a success/failure threshold is reached, else None."""
        verdict = None
        if state.in_flight is not None:
            if not state.in_flight.done():
                return None
            try:
                passed = state.in_flight.result()
            except Exception:  # a probe bug is a failed probe, never a dead agent
                passed = False
            state.in_flight = None
            if passed:
                state.successes, state.failures = state.successes + 1, 0
                if state.successes >= int(probe.get("successThreshold", 1)):
                    verdict = True
            else:
                state.failures, state.successes = state.failures + 1, 0
                if state.failures >= int(probe.get("failureThreshold", 3)):
                    verdict = False
        if now >= state.next_at:
            state.next_at = now + float(probe.get("periodSeconds", 10))
            state.in_flight = self.context.probe_pool.submit(self._probe_once, container, probe)
        return verdict

    def _step_probes(self, container: ContainerRuntime, now: float) -> None:
        if container.process is None:
            return
        readiness = container.spec.get("readinessProbe")
        if readiness:
            verdict = self._step_probe(container, readiness, container.readiness, now)
            if verdict is not None:
                container.ready = verdict
        liveness = container.spec.get("livenessProbe")
        if liveness and self._step_probe(container, liveness, container.liveness, now) is False:
            # As the kubelet: a container that fails liveness is killed and restartPolicy
            # decides what follows. SIGKILL at once, since a stopped (SIGSTOP) process
            # would never act on SIGTERM.
            log.info(
                "%s: container %s failed its liveness probe; killing it", self._pod_ref(), container.name
            )
            kill_process_group(container.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                container.process.wait(timeout=5)
            self._reap(container, now)

    # ---- the loop step ------------------------------------------------------------

    def step(self, now: float) -> None:
        if self.terminating_deadline is not None:
            for container in self.containers:
                self._reap(container, now)
            return
        if not self.volumes_ready:
            if now < self.volume_retry_at:
                return
            try:
                self.sandbox.materialize_volumes()
                self.volumes_ready = True
            except ContainerConfigError as error:
                for container in self.containers:
                    container.waiting_reason, container.waiting_message = (
                        error.reason,  # ContainerCreating while a claim is not bound yet
                        str(error),
                    )
                self.volume_retry_at = now + 2.0
                return
        self._resync_volumes(now)
        for container in self.containers:
            self._reap(container, now)
            if self._will_start(container) and now >= container.next_start_at:
                self._start(container, now)
            self._step_probes(container, now)

    def _resync_volumes(self, now: float) -> None:
        """Refresh Secret/ConfigMap volumes every ``volume_resync_seconds``, off the agent's loop."""
        if self.volume_resync is not None:
            if not self.volume_resync.done():
                return
            try:
                changed = self.volume_resync.result()
            except Exception:  # an unreadable object leaves the volume as it was; tried again later
                log.exception("%s: refreshing volumes failed", self._pod_ref())
            else:
                if changed:
                    log.info("%s: volumes updated: %s", self._pod_ref(), ", ".join(changed))
            self.volume_resync = None
        if now >= self.volume_resync_at:
            self.volume_resync_at = now + self.context.volume_resync_seconds
            self.volume_resync = self.context.volume_pool.submit(self.sandbox.refresh_volumes)

    def begin_termination(self, grace_seconds: float, now: float) -> None:
        """SIGTERM every container's group; ``finished_terminating`` says when all are gone."""
        if self.terminating_deadline is not None:
            return
        self.terminating_deadline = now + grace_seconds
        for container in self.containers:
            container.ready = False
            if container.process is not None:
                kill_process_group(container.process.pid, signal.SIGTERM)

    def finished_terminating(self, now: float) -> bool:
        assert self.terminating_deadline is not None
        self.step(now)
        running = [c for c in self.containers if c.process is not None]
        if running and now >= self.terminating_deadline:
            self.kill_now()
            return True
        return not running

    def kill_now(self) -> None:
        """SIGKILL every container group at once (pod force-deleted, or agent shutting down)."""
        for container in self.containers:
            if container.process is not None:
                pgid = container.process.pid
                kill_process_group(pgid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    container.process.wait(timeout=5)
                # Grandchildren are reaped by init, not by us; the kubelet too reports a
                # container stopped only once nothing of it is left.
                wait_group_gone(pgid, 2.0)
                self._forget_pgid(pgid)
                container.process = None

    def alive_pgids(self) -> list[int]:
        return [c.process.pid for c in self.containers if c.process and process_group_alive(c.process.pid)]

    # ---- status -------------------------------------------------------------------

    def _container_status(self, container: ContainerRuntime) -> Body:
        state: Body
        if container.process is not None:
            state = {"running": {"startedAt": rfc3339(container.started_at)}}
        elif container.current is not None and not self._will_start(container):
            state = {"terminated": container.current.as_state()}
        else:
            waiting: Body = {"reason": container.waiting_reason or "ContainerCreating"}
            if container.waiting_message:
                waiting["message"] = container.waiting_message
            state = {"waiting": waiting}
        previous = container.current if container.process is None and self._will_start(container) else None
        last = previous or container.last
        status: Body = {
            "name": container.name,
            "image": container.spec["image"],
            "imageID": f"local://{image_key(container.spec['image'])}",
            "ready": container.ready,
            "started": container.process is not None,
            "restartCount": container.restart_count,
            "state": state,
            "lastState": {"terminated": last.as_state()} if last else {},
        }
        if container.process is not None:
            status["containerID"] = f"local://{container.process.pid}"
        return status

    def phase(self) -> str:
        if not all(c.started_once for c in self.containers):
            return "Pending"
        if any(c.process is not None or self._will_start(c) for c in self.containers):
            return "Running"
        failed = any(c.current is not None and c.current.exit_code != 0 for c in self.containers)
        return "Failed" if failed else "Succeeded"

    def _condition(self, kind: str, true: bool) -> Body:
        status = "True" if true else "False"
        previous = self.condition_times.get(kind)
        if previous is None or previous[0] != status:
            self.condition_times[kind] = (status, rfc3339(time.time()))
        return {"type": kind, "status": status, "lastTransitionTime": self.condition_times[kind][1]}

    def status(self) -> Body:
        ready = self.terminating_deadline is None and all(c.ready for c in self.containers)
        ip = self.sandbox.pod_ip
        return {
            "phase": self.phase(),
            "hostIP": self.sandbox.host_ip,
            "hostIPs": [{"ip": self.sandbox.host_ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": rfc3339(self.start_time),
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", True),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }


def minimal_base_env() -> dict[str, str]:
    """What every container starts from: never the agent's own env (it holds the admin KUBECONFIG)."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
