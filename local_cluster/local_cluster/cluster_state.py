"""The state file of a running cluster's supervisor.

The supervisor (``sealed_cluster``'s, PID 1 of the cluster's namespaces) writes ``cluster.json``
in the workdir once its cluster is ready: the kubeconfigs, the pod logs' directory, the API
server's pid and restarts. ``down`` and ``SealedCluster.stop`` read it to stop the supervisor
(``sealed_cluster.stop_sealed_cluster``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

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
