"""Run images as the chart runs them: Debian's containerd and runc in a sealed namespace of its own.

``SealedContainerd`` starts a supervisor under ``unshare`` (new network, mount and PID namespaces,
``/proc`` mounted anew): inside, the supervisor (``serve``) brings up loopback and a bridge with no
route out, mounts a private ``/run``, and starts containerd with its root, state and socket under
the caller's directory. Callers then

* import the OCI archives ``make images`` wrote (``ctr -n k8s.io images import``);
* run a container with ``run``: ``ctr run`` with the image's own user (every image of ours sets
  ``USER 10001``), a read-only root file system, every capability dropped, no new privileges and
  the runtime's default seccomp profile, the volumes bound at their mount paths, and a network
  namespace of its own that the real CNI bridge plugin (Debian's ``containernetworking-plugins``)
  gives an address on the bridge, as the CRI does for a pod;
* reach it at that address from a thread that joined the sealed network (``call_in_network``).

Everything ends with the supervisor: it is PID 1 of its namespace, so when it exits the kernel
kills containerd, the shims and every container, and frees the namespaces with the bridge and the
containers' network namespaces. runc puts each container in cgroups of the machine's hierarchies;
here they sit under a root of the sandbox's own (``CgroupRoot``), which ``stop`` removes, so
nothing is left behind. What it does not do: pods (one container per
network namespace), probes, restarts or resource limits; the local cluster's real node (a kubelet
on this containerd) is what does those.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from local_cluster import netns
from local_cluster.cgroups import CgroupRoot
from local_cluster.processes import ManagedProcess

T = TypeVar("T")
NAMESPACE = "k8s.io"  # containerd's namespace that the CRI (and so a kubelet) uses
# The local cluster's node addresses, which its certificates name (a control plane a test starts
# in the sandbox listens on the bridge address).
BRIDGE_ADDRESS = netns.NODE_ADDRESS
SUBNET = netns.POD_CIDR
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_PACKAGES = {"containerd": "containerd", "runc": "runc", "ctr": "containerd"}
SEALED_COMMAND = (
    "unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private", "--",
)  # fmt: skip
# containerd's default capability set for a container (oci.defaultUnixCaps); ctr has no "ALL", so
# `capabilities: {drop: [ALL]}` is every one of these dropped.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
)  # fmt: skip
CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
"""
# Without a kubelet, the CRI plugin stays off: ctr talks to containerd's own API.
WITHOUT_CRI = 'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
# For a kubelet (REAL_NODE.md has why each line is there): the pause image ``make images`` builds
# as the sandbox; this VM forbids lowering oom_score_adj even for root; runc with cgroupfs (no
# systemd here); pods may bind ports below 1024 without a capability (containerd 2's default;
# CoreDNS binds 53); Debian's CNI plugins and a bridge conflist of our own.
CRI = """\
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"""
SANDBOX_IMAGE = "localhost/broker-failover/pause:0.1.0"


class ContainerdError(RuntimeError):
    """containerd did not start, or a ctr or CNI step failed; the message carries its output."""


@dataclasses.dataclass(frozen=True)
class Volume:
    """A directory of the machine bound into the container, as a pod's volume at its mountPath."""

    source: Path
    destination: str
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class Container:
    name: str
    image: str
    address: str


def bridge_plugin(ipam_dir: Path, subnet: str = SUBNET) -> dict[str, object]:
    """The CNI bridge plugin's configuration: the bridge ``cni0`` at the node address, host-local
    addresses from the pod CIDR (``subnet``: the node's, when the cluster has several) with their
    leases under ``ipam_dir`` (not /var/lib/cni)."""
    return {
        "type": "bridge",
        "bridge": netns.BRIDGE,
        "isGateway": True,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "subnet": subnet,
            "dataDir": str(ipam_dir),
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }


class SealedContainerd:
    """``cri=True``: containerd's CRI is on, for a kubelet (``kubelet_node``), with the CNI bridge
    conflist under the working directory; otherwise containers are run with ``ctr``."""

    def __init__(self, workdir: Path, *, cri: bool = False) -> None:
        self.workdir = workdir
        self.cri = cri
        self.socket = workdir / "containerd.sock"
        self.ready_file = workdir / "ready.json"
        self.supervisor: ManagedProcess | None = None
        self.pid = 0  # the supervisor's pid on the machine
        self.addresses: dict[str, str] = {}  # container name -> its address on the bridge
        # ctr's containers' cgroups (runc makes one per container in every hierarchy of the
        # machine): under a root of the sandbox's own, removed when it stops.
        self.cgroups = CgroupRoot(f"broker-failover-{workdir.name}-{os.getpid()}")

    # --- lifecycle ---

    def start(self, timeout: float = 60) -> None:
        missing = sorted({pkg for prog, pkg in HOST_PACKAGES.items() if shutil.which(prog) is None})
        missing += [] if (CNI_BIN_DIR / "bridge").exists() else ["containernetworking-plugins"]
        if missing:
            raise ContainerdError(f"running images needs the Debian packages {', '.join(missing)}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        if not self.cri:
            self.cgroups.create()
        argv = [*SEALED_COMMAND, sys.executable, "-m", __name__, "serve", "--workdir", str(self.workdir)]
        argv += ["--cri"] if self.cri else []
        self.supervisor = ManagedProcess("containerd-sandbox", argv, log_path=self.workdir / "supervisor.log")
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.supervisor.popen.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "supervisor.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise ContainerdError(f"containerd did not start in its sealed namespace:\n{log}")
            time.sleep(0.1)
        # `unshare --fork` stays in the machine's PID namespace; its child, the supervisor, is PID 1
        # of the sealed one and the process whose namespaces `nsenter` must join.
        unshare = self.supervisor.popen.pid
        children = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()
        self.pid = int(children[0])

    def stop(self) -> list[Path]:
        """End everything in the namespaces; remove ctr's containers' cgroups; return leftovers."""
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        return self.cgroups.remove() if not self.cri else []

    def __enter__(self) -> SealedContainerd:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # --- commands inside ---

    def inside(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run in the sealed network, mounts and PID namespace."""
        return ["nsenter", "-t", str(self.pid), "--net", "--mount", "--pid", "--", *argv]

    def run_inside(
        self, argv: Sequence[str], *, timeout: float = 120, input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self.inside(argv), capture_output=True, text=True, timeout=timeout, input=input_text, check=False
        )
        if check and result.returncode != 0:
            output = (result.stderr or result.stdout).strip()
            raise ContainerdError(f"{' '.join(argv)} failed (exit {result.returncode}): {output}")
        return result

    def ctr(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run_inside(
            ["ctr", "--address", str(self.socket), "-n", NAMESPACE, *args], timeout=timeout, check=check
        )

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive), timeout=600)

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.split()

    def run(
        self,
        name: str,
        image: str,
        args: Sequence[str] | None = None,
        *,
        entrypoint: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        volumes: Sequence[Volume] = (),
    ) -> Container:
        """Start ``image`` as the chart's securityContext runs it, in a network namespace of its own.

        ``args`` are a pod's: they replace the image's CMD and follow its ENTRYPOINT (``entrypoint``,
        which the caller reads from the image's config), where ``ctr run`` would replace both.
        """
        if image not in self.images():
            raise ContainerdError(
                f"image {image} is not in containerd (never built or never imported): run `make images`"
            )
        address = self.network(name)
        command = [
            "run", "--detach", "--read-only", "--seccomp", "--cgroup", f"/{self.cgroups.name}/{name}",
            "--with-ns", f"network:/run/netns/{name}",
            "--log-uri", f"file://{self.log_path(name)}",
        ]  # fmt: skip
        for capability in DEFAULT_CAPABILITIES:
            command += ["--cap-drop", capability]
        for key, value in (env or {}).items():
            command += ["--env", f"{key}={value}"]
        # /etc/hosts as the kubelet writes it for a pod: the container's own name resolves (Spark
        # looks its host name up), without touching the image.
        hosts = self.workdir / "hosts" / name
        hosts.parent.mkdir(exist_ok=True)
        hosts.write_text(f"127.0.0.1\tlocalhost\n{address}\t{socket.gethostname()} {name}\n")
        hosts.chmod(0o644)
        volumes = [*volumes, Volume(hosts, "/etc/hosts", read_only=True)]
        for volume in volumes:
            options = "rbind:ro" if volume.read_only else "rbind:rw"
            command += [
                "--mount",
                f"type=bind,src={volume.source},dst={volume.destination},options={options}",
            ]
        self.ctr(*command, image, name, *([] if args is None else [*entrypoint, *args]))
        return Container(name=name, image=image, address=address)

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def logs(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def exec(self, name: str, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the running container, with its user, capabilities and root file system."""
        exec_id = f"exec-{time.monotonic_ns()}"
        return self.ctr("task", "exec", "--exec-id", exec_id, name, *argv, timeout=timeout, check=False)

    def task_status(self, name: str) -> str:
        """``RUNNING``, ``STOPPED``, ... as ``ctr task ls`` says; ``""`` when there is no task."""
        for line in self.ctr("task", "list").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == name:
                return fields[-1]
        return ""

    def process_status(self, name: str) -> dict[str, str]:
        """The container's main process ``/proc/<pid>/status`` fields, read from the sealed PID ns."""
        for line in self.ctr("task", "list").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == name:
                text = self.run_inside(["cat", f"/proc/{fields[1]}/status"]).stdout
                return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        raise ContainerdError(f"no running task {name}")

    def call_in_network(self, function: Callable[[], T], timeout: float = 60) -> T:
        return netns.call_in_network_namespace(f"/proc/{self.pid}/ns/net", function, timeout)

    def network(self, name: str) -> str:
        """The network namespace ``name`` runs in, made (and given an address) on first use, as a
        pod's sandbox is before its containers: callers may learn the address before the start."""
        if name not in self.addresses:
            self.run_inside(["ip", "netns", "add", name])
            self.addresses[name] = self._attach_network(name)
        return self.addresses[name]

    def _attach_network(self, name: str) -> str:
        """CNI ADD of the loopback and bridge plugins for the container's network namespace, as
        the CRI does for a pod sandbox; returns the bridge plugin's address."""
        self._cni_add(name, {"cniVersion": "0.4.0", "name": "lo", "type": "loopback"})
        config = {"cniVersion": "0.4.0", "name": "sealed", **bridge_plugin(self.workdir / "cni-ipam")}
        bridge = self._cni_add(name, config)
        return str(bridge["ips"][0]["address"]).split("/")[0]

    def _cni_add(self, name: str, config: Mapping[str, object]) -> dict[str, Any]:
        environment = {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": name,
            "CNI_NETNS": f"/run/netns/{name}",
            "CNI_IFNAME": "eth0" if config["type"] != "loopback" else "lo",
            "CNI_PATH": str(CNI_BIN_DIR),
        }
        plugin = CNI_BIN_DIR / str(config["type"])
        argv = ["env", *(f"{k}={v}" for k, v in environment.items()), str(plugin)]
        result = self.run_inside(argv, input_text=json.dumps(config), check=False)
        if result.returncode != 0:
            raise ContainerdError(
                f"the CNI {config['type']} plugin failed for {name}: {result.stdout} {result.stderr}"
            )
        loaded: dict[str, Any] = json.loads(result.stdout or "{}")
        return loaded


# --- the supervisor, inside the sealed namespaces -------------------------------------------------


def write_config(workdir: Path, cri: bool, run_dir: Path | None = None, subnet: str = SUBNET) -> Path:
    """containerd's configuration, with root, state and socket under ``workdir``, or state and
    socket under ``run_dir`` (a short path: a socket's path has at most 107 bytes); with ``cri``,
    the CRI plugin and the CNI bridge conflist (pods on the bridge, leases under ``workdir``)."""
    config = workdir / "containerd.toml"
    run_dir = run_dir or workdir
    state = run_dir / "state"
    text = CONFIG.format(root=workdir / "root", state=state, socket=run_dir / "containerd.sock")
    if cri:
        conf_dir = workdir / "cni"
        conf_dir.mkdir(parents=True, exist_ok=True)
        plugin = bridge_plugin(workdir / "cni-ipam", subnet)
        conflist = {"cniVersion": "0.4.0", "name": "sealed", "plugins": [plugin]}
        (conf_dir / "10-sealed.conflist").write_text(json.dumps(conflist))
        text += CRI.format(sandbox_image=SANDBOX_IMAGE, cni_bin=CNI_BIN_DIR, cni_conf=conf_dir)
    else:
        text = WITHOUT_CRI + text
    config.write_text(text)
    return config


def start_containerd(
    workdir: Path,
    cri: bool,
    run_dir: Path | None = None,
    timeout: float = 30,
    *,
    subnet: str = SUBNET,
    prefix: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start containerd (in the calling process's namespaces, or where ``prefix`` puts it: a node's
    network namespace and cgroup, ``cluster_nodes``; the prefix must ``exec`` it) and wait for its
    socket, which is ``(run_dir or workdir)/containerd.sock``."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    config = write_config(workdir, cri, run_dir, subnet)
    socket_path = (run_dir or workdir) / "containerd.sock"
    socket_path.unlink(missing_ok=True)  # left by a containerd that was killed (a node crash)
    containerd = subprocess.Popen(
        [*prefix, "containerd", "--config", str(config)],
        stdout=(workdir / "containerd.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while not socket_path.exists():
        if containerd.poll() is not None or time.monotonic() > deadline:
            containerd.kill()
            tail = (workdir / "containerd.log").read_text(errors="replace")[-2000:]
            raise ContainerdError(f"containerd exited or did not open its socket:\n{tail}")
        time.sleep(0.05)
    return containerd


def serve(workdir: Path, cri: bool) -> int:
    """PID 1 of the sealed namespace: network, /run, containerd; exits (ending all) on SIGTERM."""
    if netns.routes():
        raise SystemExit("refusing to run containerd in a namespace that has routes (not sealed?)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run"], check=True, timeout=30)
    netns.NETNS_DIR.mkdir(parents=True, exist_ok=True)
    netns.ip("link", "set", "lo", "up")
    # The bridge and its address before any container: the gateway is where a test's control
    # plane listens. A default route onto it leads nowhere beyond the namespace.
    netns.ip("link", "add", netns.BRIDGE, "type", "bridge")
    netns.ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", netns.BRIDGE)
    netns.ip("link", "set", netns.BRIDGE, "up")
    if cri:
        # The kubelet wants a default route to find the node's address; on the bridge it leads
        # nowhere beyond this namespace.
        netns.ip("route", "add", "default", "dev", netns.BRIDGE)
    try:
        containerd = start_containerd(workdir, cri)
    except ContainerdError as error:
        print(error, file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: containerd.terminate())
    (workdir / "ready.json").write_text(json.dumps({"containerd": containerd.pid}))
    return containerd.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="containerd in a sealed namespace (the supervisor side)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("--workdir", type=Path, required=True)
    serve_parser.add_argument("--cri", action="store_true", help="containerd's CRI on, for a kubelet")
    options = parser.parse_args(argv)
    return serve(options.workdir.resolve(), options.cri)


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
