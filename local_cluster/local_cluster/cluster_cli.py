"""The ``make cluster-up/shell/down`` CLI: a ``kind create cluster`` experience for developers.

``python -m local_cluster.cluster up --workdir W --tools-dir T`` starts a sealed cluster
(``sealed_cluster``: its supervisor is PID 1 of namespaces of its own and outlives ``up``), waits
for it, and prints the ``export KUBECONFIG=...`` line (``--nodes N``: N nodes, ``node-1`` ...
``node-N``; default one, ``local-node``); ``shell`` enters its network. ``down
--workdir W`` stops it and everything it started. The workdir is recreated by the next ``up``:
nothing persists across ``down``. ``--pod-network`` is still accepted and changes nothing (every
cluster has the pod network now).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from local_cluster import netns
from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.cluster_state import read_state
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.processes import process_group_alive
from local_cluster.sealed_cluster import start_sealed_cluster, stop_sealed_cluster


def _up(workdir: Path, tools_dir: Path, nodes: int = 1) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state and process_group_alive(int(str(state["supervisor"]))):
        print(f"cluster already running (supervisor pid {state['supervisor']})", file=sys.stderr)
        print(f"export KUBECONFIG={state['kubeconfig']}")
        return 0
    if workdir.exists():
        shutil.rmtree(workdir)  # a stopped cluster's leftovers: certificates, etcd data, claims
    workdir.mkdir(parents=True)
    try:
        # The validator's image too, in the background: the chart's CronJob may be enabled.
        settings = LocalClusterSettings(
            tools_dir=tools_dir,
            workdir=workdir,
            background_images=("broker-failover/validator",),
            nodes=nodes,
            # A failure limit, not a figure: each node imports the images and starts a kubelet.
            ready_timeout_seconds=90.0 * nodes,
        )
        sealed = start_sealed_cluster(settings)
    except ControlPlaneStartError as error:
        print(error, file=sys.stderr)
        return 1
    pods = netns.POD_CIDR if nodes == 1 else f"{netns.CLUSTER_POD_CIDR} ({nodes} nodes)"
    print(
        f"local cluster ready in {sealed.ready_seconds}s, pods on {pods} in a sealed "
        "namespace; `make shell` enters it; stop it with `make cluster-down`",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={sealed.kubeconfig}")
    return 0


def _down(workdir: Path) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state is None:
        print(f"no cluster running in {workdir}", file=sys.stderr)
        return 0
    left = stop_sealed_cluster(workdir, state)  # its supervisor is PID 1 of its own namespaces
    if left:
        print(f"still there after SIGKILL: {', '.join(left)}", file=sys.stderr)
        return 1
    print("local cluster stopped", file=sys.stderr)
    return 0


def _shell(workdir: Path, argv: Sequence[str]) -> int:
    """Run ``argv`` (default: an interactive shell) in the sealed cluster's network and mounts."""
    state = read_state(workdir.resolve())
    if state is None or "nodeKubeconfig" not in state:
        print(f"no cluster running in {workdir}: run `make cluster-up`", file=sys.stderr)
        return 1
    pid = int(str(state["namespacePid"]))
    command = list(argv) or [os.environ.get("SHELL", "/bin/bash")]
    env = {**os.environ, "KUBECONFIG": str(state["nodeKubeconfig"]), "PS1": "(local-cluster) \\w\\$ "}
    nsenter = ["nsenter", "-t", str(pid), "--net", "--mount", "--pid", "--", *command]
    return subprocess.run(nsenter, env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Kubernetes cluster for broker-failover (see docs)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a cluster in a sealed namespace; prints export KUBECONFIG=...")
    up.add_argument("--workdir", type=Path, required=True)
    up.add_argument("--tools-dir", type=Path, default=None)
    up.add_argument("--nodes", type=int, default=1, help="how many nodes (kubelets); default 1")
    # Every cluster has the real pod network now; the flag is accepted so old command lines work.
    up.add_argument("--pod-network", action="store_true", help=argparse.SUPPRESS)
    commands.add_parser("down").add_argument("--workdir", type=Path, required=True)
    shell = commands.add_parser("shell", help="a shell (or COMMAND) inside the cluster's network")
    shell.add_argument("--workdir", type=Path, required=True)
    shell.add_argument("command_args", nargs=argparse.REMAINDER, metavar="COMMAND")
    options = parser.parse_args(argv)
    if options.command == "down":
        return _down(options.workdir)
    if options.command == "shell":
        return _shell(options.workdir, [arg for arg in options.command_args if arg != "--"])
    if not 1 <= options.nodes <= netns.MAX_NODES:
        parser.error(f"--nodes must be 1 to {netns.MAX_NODES}, not {options.nodes}")
    return _up(options.workdir, options.tools_dir or built_tools_dir(), options.nodes)
