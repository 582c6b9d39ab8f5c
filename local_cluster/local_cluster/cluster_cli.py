"""The ``make cluster-up/shell/down`` CLI: a ``kind create cluster`` experience for developers.

``python -m local_cluster.cluster up --workdir W --tools-dir T`` starts a detached
supervisor (``run``) that owns the cluster, waits for it, and prints the
``export KUBECONFIG=...`` line; with ``--pod-network`` the cluster is a sealed one
(``sealed_cluster``) and ``shell`` enters its network. ``down --workdir W`` stops it and
everything it started. The workdir is recreated by the next ``up``: nothing persists across
``down``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from local_cluster import netns
from local_cluster.cluster import (
    REPO_ROOT,
    LocalClusterSettings,
    built_tools_dir,
    start_local_cluster,
    sweep_pod_process_groups,
)
from local_cluster.cluster_state import STATE_FILE, read_state, stop_supervisor
from local_cluster.control_plane import ControlPlaneStartError
from local_cluster.processes import kill_process_group, process_group_alive, reap_on_exit
from local_cluster.sealed_cluster import start_sealed_cluster, stop_sealed_cluster


def _run_supervisor(workdir: Path, tools_dir: Path) -> int:
    """Own the cluster until SIGTERM; ``up`` starts this detached."""
    reap_on_exit()
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.set())
    cluster = start_local_cluster(LocalClusterSettings(tools_dir=tools_dir, workdir=workdir))
    try:
        state = {
            "supervisor": os.getpid(),
            "pids": cluster.pids(),
            "kubeconfig": str(cluster.kubeconfig),
            "readySeconds": round(cluster.ready_seconds, 1),
            "podSubnet": cluster.settings.pod_subnet,
        }
        (workdir / STATE_FILE).write_text(json.dumps(state))
        while not stop_requested.wait(1.0):
            if cluster.node_agent.exited():
                print(f"node agent exited; log {cluster.node_agent.log_path}", file=sys.stderr)
                break
    finally:
        cluster.stop()
        (workdir / STATE_FILE).unlink(missing_ok=True)
    return 0


def _up(workdir: Path, tools_dir: Path, pod_network: bool) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state and process_group_alive(int(str(state["supervisor"]))):
        print(f"cluster already running (supervisor pid {state['supervisor']})", file=sys.stderr)
        print(f"export KUBECONFIG={state['kubeconfig']}")
        return 0
    if workdir.exists():
        shutil.rmtree(workdir)  # a stopped cluster's leftovers: certificates, etcd data, pod dirs
    workdir.mkdir(parents=True)
    if pod_network:
        try:
            # The validator's image too, in the background: the chart's CronJob may be enabled.
            settings = LocalClusterSettings(
                tools_dir=tools_dir, workdir=workdir, background_images=("broker-failover/validator",)
            )
            sealed = start_sealed_cluster(settings)
        except ControlPlaneStartError as error:
            print(error, file=sys.stderr)
            return 1
        print(
            f"local cluster ready in {sealed.ready_seconds}s, pods on {netns.POD_CIDR} in a sealed "
            "namespace; `make shell` enters it; stop it with `make cluster-down`",
            file=sys.stderr,
        )
        print(f"export KUBECONFIG={sealed.kubeconfig}")
        return 0
    with (workdir / "supervisor.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "local_cluster.cluster",
                "run",
                f"--workdir={workdir}",
                f"--tools-dir={tools_dir}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while (state := read_state(workdir)) is None:
        if supervisor.poll() is not None or time.monotonic() > deadline:
            print(f"cluster did not start; see {workdir / 'supervisor.log'}:", file=sys.stderr)
            print((workdir / "supervisor.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            kill_process_group(supervisor.pid, signal.SIGTERM)
            return 1
        time.sleep(0.2)
    print(
        f"local cluster ready in {state['readySeconds']}s; stop it with `make cluster-down`", file=sys.stderr
    )
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0


def _down(workdir: Path) -> int:
    workdir = workdir.resolve()
    state = read_state(workdir)
    if state is None:
        print(f"no cluster running in {workdir}", file=sys.stderr)
        sweep_pod_process_groups(workdir / "node")
        return 0
    if "namespacePid" in state:  # a sealed cluster: its supervisor is PID 1 of its own namespace
        left = stop_sealed_cluster(workdir, state)
    else:
        left = [f"process group {pgid}" for pgid in stop_supervisor(workdir, state)]
    if left:
        print(f"still there after SIGKILL: {', '.join(left)}", file=sys.stderr)
        return 1
    print("local cluster stopped", file=sys.stderr)
    return 0


def _shell(workdir: Path, argv: Sequence[str]) -> int:
    """Run ``argv`` (default: an interactive shell) in the sealed cluster's network and mounts."""
    state = read_state(workdir.resolve())
    if state is None or "nodeKubeconfig" not in state:
        print(f"no pod-network cluster running in {workdir}: run `make cluster-up`", file=sys.stderr)
        return 1
    pid = int(str(state["namespacePid"]))
    command = list(argv) or [os.environ.get("SHELL", "/bin/bash")]
    env = {**os.environ, "KUBECONFIG": str(state["nodeKubeconfig"]), "PS1": "(local-cluster) \\w\\$ "}
    nsenter = ["nsenter", "-t", str(pid), "--net", "--mount", "--pid", "--", *command]
    return subprocess.run(nsenter, env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Kubernetes cluster for broker-failover (see docs)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "run"):
        command = commands.add_parser(name)
        command.add_argument("--workdir", type=Path, required=True)
        command.add_argument("--tools-dir", type=Path, default=None)
    commands.choices["up"].add_argument(
        "--pod-network",
        action="store_true",
        help="real pod network (kube-proxy, CoreDNS) in a sealed namespace",
    )
    commands.add_parser("down").add_argument("--workdir", type=Path, required=True)
    shell = commands.add_parser("shell", help="a shell (or COMMAND) inside the pod-network cluster")
    shell.add_argument("--workdir", type=Path, required=True)
    shell.add_argument("command_args", nargs=argparse.REMAINDER, metavar="COMMAND")
    options = parser.parse_args(argv)
    if options.command == "down":
        return _down(options.workdir)
    if options.command == "shell":
        return _shell(options.workdir, [arg for arg in options.command_args if arg != "--"])
    tools_dir = options.tools_dir or built_tools_dir()
    if options.command == "up":
        return _up(options.workdir, tools_dir, options.pod_network)
    return _run_supervisor(options.workdir.resolve(), tools_dir)
