"""Readiness and liveness probes: exec, tcpSocket and httpGet, counted against their thresholds.

Each probe runs on a thread pool, never on the agent's loop: a SIGSTOPped broker must not
stall it. ``step_probe`` collects a finished probe, counts it against ``successThreshold`` /
``failureThreshold`` and starts the next one every ``periodSeconds``; what a verdict does
(ready, or killed for failing liveness) is the pod runtime's business.

Exec probes run inside the pod (``PodSandbox.launcher``), with its mounts and working
directory; HTTPS probes do not verify certificates, as the kubelet's do not. grpc probes are
not supported: a container with one is never ready, visibly.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from local_cluster.container_state import ContainerRuntime, ProbeState
from local_cluster.pod_references import Body
from local_cluster.pod_sandbox import PodSandbox


def run_probe(container: ContainerRuntime, probe: Body, sandbox: PodSandbox) -> bool:
    """Run ``probe`` once against ``container``; True if it passed."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if probe.get("exec"):
        return _exec_probe(container, probe["exec"], timeout, sandbox)
    if probe.get("tcpSocket"):
        return _tcp_probe(container, probe["tcpSocket"], timeout, sandbox.pod_ip)
    if probe.get("httpGet"):
        return _http_probe(container, probe["httpGet"], timeout, sandbox.pod_ip)
    return False  # grpc probes are not supported: never ready, visibly.


def _exec_probe(container: ContainerRuntime, action: Body, timeout: float, sandbox: PodSandbox) -> bool:
    argv = [sandbox.rewrite_paths(part, container.mounts) for part in action["command"]]
    # Exec probes run inside the pod, with its mounts and working directory.
    argv = [*sandbox.launcher(container.mounts, container.spec.get("workingDir")), *argv]
    try:
        result = subprocess.run(argv, env=container.env, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _tcp_probe(container: ContainerRuntime, action: Body, timeout: float, pod_ip: str) -> bool:
    address = (action.get("host") or pod_ip, _port(container, action["port"]))
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def _http_probe(container: ContainerRuntime, action: Body, timeout: float, pod_ip: str) -> bool:
    scheme = str(action.get("scheme") or "HTTP").lower()
    host = action.get("host") or pod_ip
    url = f"{scheme}://{host}:{_port(container, action['port'])}{action.get('path', '/')}"
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


def _port(container: ContainerRuntime, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.spec.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container {container.name} has no port named {port!r}")


def step_probe(
    container: ContainerRuntime,
    probe: Body,
    state: ProbeState,
    now: float,
    *,
    sandbox: PodSandbox,
    pool: ThreadPoolExecutor,
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
        state.in_flight = pool.submit(run_probe, container, probe, sandbox)
    return verdict
