"""Two operator replicas at install, on a real kube-apiserver with no kubelet (issue 40).

Both faults seen in the drain test's CI runs, reproduced here without the nodes:

**The replica that took its priority first joined last.** kopf's peering lets the live replica of
highest priority handle, and the priority was the process's start time. Two replicas start
together; H takes its priority first, but its first API call is slow (a loaded node), so its record
lands seconds later. L, alone in the peering object, resumes and handles; then H's record appears,
higher: L pauses and hands every cluster over, and for the seconds its engines take to stop (and
their status writes land) two engines run one cluster. Here H's API traffic goes through a loopback
proxy that holds its connections until L has resumed. The replica that joins later must rank below
the one already there, so that L keeps handling and H stands by (``controller/peering.py``).

**status.active behind the role=active label.** The replica that handled first (its engine at epoch
1, having activated orders-0) still had a status write on its way when the other replica's engine
allocated epoch 2 and moved the ``-active`` Service and the label to orders-1, and wrote its status.
The older write landed last and named orders-0; the newer engine writes only when its own status
changes, so the status stayed behind the label until then (11 s in CI). A status write is now on
condition that the stored epoch is not above the writer's (``controller/status_fence.py``).

The control plane (etcd, kube-apiserver, kube-controller-manager on loopback) is this module's;
pods are created as objects (nothing runs them), which is all the label needs.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker_operator.controller import names
from broker_operator.controller.kube import KubeApi
from broker_operator.controller.observed import ClusterObservations
from broker_operator.controller.shell import KubernetesClusterShell
from broker_operator.core.status import ClusterStatus
from broker_operator.status_writer import StatusWriter
from local_cluster.cluster import REPO_ROOT
from local_cluster.processes import ManagedProcess
from tests.e2e.support import PlaneAccess, control_plane_only, wait_for
from tests.e2e.test_operator import broker_cluster, new_namespace

pytestmark = pytest.mark.e2e

PEERING = "install"
RESUMED = "Resuming operations after the pause"
PAUSED = "Pausing operations in favour of"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlaneAccess]:
    crds = ("broker.failover.dev_brokerclusters.yaml", "kopf.dev_peerings.yaml")
    with control_plane_only(tmp_path_factory.mktemp("two-replicas"), crds) as access:
        yield access


@pytest.fixture
def namespace(plane: PlaneAccess) -> str:
    return new_namespace(plane, "install")


class HeldProxy:
    """A loopback TCP proxy to the API server that holds every connection until ``release()``: the
    slow first API calls of a replica on a loaded node."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.released = threading.Event()
        self.stopping = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = int(self.server.getsockname()[1])
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def release(self) -> None:
        self.released.set()

    def stop(self) -> None:
        self.stopping.set()
        self.released.set()
        for thread in list(self.threads):
            thread.join(timeout=10)
        self.server.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._pipe, args=(client,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _pipe(self, client: socket.socket) -> None:
        with client:
            self.released.wait(timeout=120)
            if self.stopping.is_set():
                return
            try:
                with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                    ends = {client: upstream, upstream: client}
                    while not self.stopping.is_set():
                        readable, _, _ = select.select(list(ends), [], [], 0.2)
                        for end in readable:
                            data = end.recv(65536)
                            if not data:
                                return
                            ends[end].sendall(data)
            except OSError:  # either side went away: the client reconnects, or the test is over
                return


def kubeconfig_through(plane: PlaneAccess, port: int, path: Path) -> Path:
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


def start_replica(namespace: str, identity: str, kubeconfig: Path, log: Path) -> ManagedProcess:
    """``python -m broker_operator`` as the chart runs a replica with peering (POD_ID, lifetime 15 s)."""
    argv = [sys.executable, "-m", "broker_operator", "--namespace", namespace, "--metrics-port", "0"]
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONUNBUFFERED": "1",
        "POD_ID": identity,
        "OPERATOR_PEERING": PEERING,
        "OPERATOR_PEERING_LIFETIME_SECONDS": "15",
    }
    return ManagedProcess(identity, argv, log_path=log, env=env, cwd=REPO_ROOT)


def log_of(process: ManagedProcess) -> str:
    return process.log_path.read_text(errors="replace")


def records(plane: PlaneAccess, namespace: str) -> dict[str, Any]:
    peering = plane.get_json(namespace, "kopfpeering", PEERING) or {}
    return dict(peering.get("status") or {})


def test_a_replica_that_joins_last_ranks_below_the_one_already_handling(
    plane: PlaneAccess, namespace: str, tmp_path: Path
) -> None:
    manifest = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    plane.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))
    plane.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(broker_cluster("orders")))
    proxy = HeldProxy(plane.plane.apiserver_port)
    replicas: list[ManagedProcess] = []
    try:
        held = kubeconfig_through(plane, proxy.port, tmp_path / "held.kubeconfig")
        first = start_replica(namespace, "operator-h", held, tmp_path / "operator-h.log")
        replicas.append(first)
        # H has its start-time priority; its first API call (the join) is held by the proxy.
        wait_for("H's priority", lambda: "priority" in log_of(first) or first.exited(), timeout=60)
        late = start_replica(namespace, "operator-l", plane.kubeconfig, tmp_path / "operator-l.log")
        replicas.append(late)
        wait_for("L, alone, to resume", lambda: RESUMED in log_of(late) or late.exited(), timeout=60)
        proxy.release()
        wait_for("both records", lambda: set(records(plane, namespace)) == {"operator-h", "operator-l"})
        wait_for("H's kopf peering", lambda: "announced operator-h" in log_of(first), timeout=60)
        # H's kopf keep-alive has run once it rewrote the record the join wrote (a later lastseen).
        announced = records(plane, namespace)["operator-h"]["lastseen"]
        wait_for(
            "H's first keep-alive",
            lambda: records(plane, namespace)["operator-h"]["lastseen"] != announced,
            timeout=30,
        )
        peers = records(plane, namespace)
        assert peers["operator-h"]["priority"] < peers["operator-l"]["priority"], (peers, log_of(first))
        assert PAUSED not in log_of(late), log_of(late)
        assert RESUMED not in log_of(first), log_of(first)
    finally:
        for replica in replicas:
            replica.stop()
        proxy.stop()
        for replica in replicas:
            print(f"--- {replica.name}\n{replica.log_tail(40)}")  # shown by pytest on failure


def pod(namespace: str, cluster: str, ordinal: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod_name(cluster, ordinal),
            "namespace": namespace,
            "labels": {
                names.LABEL_CLUSTER: cluster,
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
                names.LABEL_ROLE: names.ROLE_STANDBY,
            },
        },
        "spec": {"containers": [{"name": "broker", "image": "broker:never-run"}]},
    }


def test_a_late_status_write_of_the_replica_that_handled_first_does_not_undo_the_next_ones(
    plane: PlaneAccess, namespace: str
) -> None:
    plane.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(broker_cluster("orders")))
    for ordinal in (0, 1):
        manifest = json.dumps(pod(namespace, "orders", ordinal))
        plane.kubectl("-n", namespace, "apply", "-f", "-", input=manifest)
    brokers = {"orders-0": 0, "orders-1": 1}

    def labelled_active() -> list[str]:
        listed = plane.get_json(namespace, "pods") or {}
        return [
            item["metadata"]["name"]
            for item in listed.get("items") or []
            if (item["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == names.ROLE_ACTIVE
        ]

    async def two_replicas() -> None:
        api = KubeApi(plane.api_client())

        async def shell() -> KubernetesClusterShell:
            body = await api.read_cluster(namespace, "orders")
            return KubernetesClusterShell(api, body, ClusterObservations(), brokers, manages_pods=True)

        # The replica that handled first: epoch 1, orders-0 activated, pointed at and labelled.
        first = await shell()
        assert await first.allocate_epoch(0, 1) == 1
        await first.point_active("orders-0", 1, "http://10.0.0.10:8080")
        first_status = ClusterStatus(phase="Healthy", active="orders-0", epoch=1, active_epoch=1)
        # The replica that took over: its engine allocates epoch 2 and moves the active to orders-1,
        # the Service and the label first, then its status (written beside its steps).
        second = await shell()
        assert await second.allocate_epoch(1, 2) == 2
        await second.point_active("orders-1", 2, "http://10.0.0.11:8080")
        second_writer = StatusWriter("orders", second.record_status, None)
        second_writer.submit(ClusterStatus(phase="Healthy", active="orders-1", epoch=2, active_epoch=2))
        await second_writer.flush()
        # The first replica's status write that was still on its way lands now (its writer's grace
        # at the pause, or a request already sent).
        first_writer = StatusWriter("orders", first.record_status, None)
        first_writer.submit(first_status)
        await first_writer.flush()

    asyncio.run(two_replicas())
    status = plane.get_json(namespace, "brokercluster", "orders")["status"]
    assert labelled_active() == ["orders-1"]
    recorded = (status.get("active"), status.get("activeEpoch"), status.get("epoch"))
    assert recorded == ("orders-1", 2, 2), status
