"""The state file of a running cluster's supervisor.

The supervisor (``sealed_supervisor``, PID 1 of the cluster's namespaces) writes ``cluster.json``
in the workdir once its cluster is ready: the kubeconfigs, the pod logs' directory, the API
server's pid and restarts. ``down`` and ``SealedCluster.stop`` read it to stop the supervisor
(``sealed_cluster.stop_sealed_cluster``). The other files here pass between the two sides: the
pids the machine knows the supervisor by, and the requests to boot a crashed node again.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

STATE_FILE = "cluster.json"
# Written by the side that started a sealed cluster's supervisor: the pids of ``unshare`` (its
# process group is the supervisor's) and of the supervisor as the machine sees them (inside it is
# PID 1).
PIDS_FILE = "sealed-pids.json"
# A file per node to boot again after a crash, read by the supervisor (its content: the tools
# directory); a failure leaves the other file, with the error.
RESTART_NODE_REQUEST = "restart-node-"
RESTART_NODE_FAILED = "failed-restart-node-"  # not matched by the requests' glob


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
        state.update(json.loads((workdir / PIDS_FILE).read_text()))
    return state
