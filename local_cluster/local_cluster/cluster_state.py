"""The state file of a running cluster's supervisor, and stopping that supervisor.

The supervisor (``cluster_cli``'s ``run`` for a loopback cluster, ``sealed_cluster``'s for a
pod-network one) writes ``cluster.json`` in the workdir once its cluster is ready: its pid,
its children's process groups, the kubeconfigs. ``down`` and ``SealedCluster.stop`` read it
to stop the supervisor and, if it died without tearing down, everything it started.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from pathlib import Path

from local_cluster.cluster import sweep_pod_process_groups
from local_cluster.processes import kill_process_group, wait_group_gone

STATE_FILE = "cluster.json"


def read_state(workdir: Path) -> dict[str, object] | None:
    """The running cluster's state file (supervisor pid, its children, kubeconfigs), if any."""
    try:
        state = json.loads((workdir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    # A sealed cluster's supervisor is PID 1 of its own namespace; the side that started it
    # writes the pids the machine knows it by ("supervisor", "namespacePid").
    with contextlib.suppress(OSError, ValueError):
        state.update(json.loads((workdir / "sealed-pids.json").read_text()))
    return state


def stop_supervisor(
    workdir: Path, state: dict[str, object], popen: subprocess.Popen[bytes] | None = None
) -> list[int]:
    """SIGTERM the supervisor, SIGKILL what is left of it and its children; the groups still alive.

    ``popen``: the supervisor when this process started it; it must be reaped here, or its
    zombie keeps the process group alive in the eyes of ``wait_group_gone``.
    """
    supervisor = int(str(state["supervisor"]))
    kill_process_group(supervisor, signal.SIGTERM)
    if popen is not None:
        try:
            popen.wait(timeout=45)
        except subprocess.TimeoutExpired:
            kill_process_group(supervisor, signal.SIGKILL)
            popen.wait(timeout=30)
    elif not wait_group_gone(supervisor, 45):
        kill_process_group(supervisor, signal.SIGKILL)
    # If the supervisor died without tearing down, its children are still ours to stop.
    pids = state.get("pids")
    groups = [int(pid) for pid in pids] if isinstance(pids, list) else []
    for pid in groups:
        kill_process_group(pid, signal.SIGKILL)
    groups += sweep_pod_process_groups(workdir / "node")
    (workdir / STATE_FILE).unlink(missing_ok=True)
    # SIGKILL is not instant on a loaded machine: the groups still there after a grace.
    return [pid for pid in [supervisor, *groups] if not wait_group_gone(pid, 15)]
