"""The kubelet half of the node agent for one pod: a state machine its loop steps.

A ``PodRuntime`` waits for the pod's volumes (``pod_sandbox``), starts each container and
notices its exits (``container_lifecycle``: process groups, ``restartPolicy``, backoff),
steps its readiness and liveness probes (``probes``; failing liveness kills the container,
as the kubelet does), keeps Secret and ConfigMap volumes current, and computes the pod status
the kubelet would report (phase, conditions, containerStatuses with exit codes and restart
counts; ``container_state``). On deletion it sends SIGTERM to every process group and
SIGKILL at the end of the grace period.

What it does not do: init containers, sidecars, startup probes,
resource limits, ``kubectl exec`` (``kubectl logs`` and ``port-forward`` work: ``kubelet_api``),
security contexts or user namespaces.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from local_cluster.container_lifecycle import forget_pgid, reap_container, should_restart, start_container
from local_cluster.container_state import ContainerRuntime, rfc3339
from local_cluster.images import ImageTable, image_key
from local_cluster.pod_references import Body, ContainerConfigError
from local_cluster.pod_sandbox import PodSandbox
from local_cluster.probes import step_probe
from local_cluster.processes import kill_process_group, process_group_alive, wait_group_gone

log = logging.getLogger("node-agent")


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

    # ---- containers and probes ----------------------------------------------------

    def _start(self, container: ContainerRuntime, now: float) -> None:
        start_container(
            container,
            now,
            sandbox=self.sandbox,
            images=self.context.images,
            base_env=self.context.base_env,
            pgid_dir=self.context.pgid_dir,
            uid=self.uid,
            pod_ref=self._pod_ref(),
        )

    def _reap(self, container: ContainerRuntime, now: float) -> None:
        reap_container(
            container,
            now,
            restart_policy=self.restart_policy,
            terminating=self.terminating_deadline is not None,
            pgid_dir=self.context.pgid_dir,
            pod_ref=self._pod_ref(),
        )

    def will_start(self, container: ContainerRuntime) -> bool:
        """True if the container is not running and will be (again): it has not exited for good."""
        if self.terminating_deadline is not None or container.process is not None:
            return False
        return container.current is None or should_restart(self.restart_policy, container.current)

    def _step_probes(self, container: ContainerRuntime, now: float) -> None:
        if container.process is None:
            return
        pool = self.context.probe_pool
        readiness = container.spec.get("readinessProbe")
        if readiness:
            verdict = step_probe(
                container, readiness, container.readiness, now, sandbox=self.sandbox, pool=pool
            )
            if verdict is not None:
                container.ready = verdict
        liveness = container.spec.get("livenessProbe")
        if not liveness:
            return
        if step_probe(container, liveness, container.liveness, now, sandbox=self.sandbox, pool=pool) is False:
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
            if self.will_start(container) and now >= container.next_start_at:
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
                forget_pgid(self.context.pgid_dir, pgid)
                container.process = None

    def alive_pgids(self) -> list[int]:
        return [c.process.pid for c in self.containers if c.process and process_group_alive(c.process.pid)]

    # ---- status -------------------------------------------------------------------

    def _container_status(self, container: ContainerRuntime) -> Body:
        state: Body
        if container.process is not None:
            state = {"running": {"startedAt": rfc3339(container.started_at)}}
        elif container.current is not None and not self.will_start(container):
            state = {"terminated": container.current.as_state()}
        else:
            waiting: Body = {"reason": container.waiting_reason or "ContainerCreating"}
            if container.waiting_message:
                waiting["message"] = container.waiting_message
            state = {"waiting": waiting}
        previous = container.current if container.process is None and self.will_start(container) else None
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
        if any(c.process is not None or self.will_start(c) for c in self.containers):
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
