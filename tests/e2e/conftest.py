"""The ``sealed_cluster`` fixture: one real local Kubernetes cluster per test session.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and the
kubelet are built from Go modules by ``make tools``; the node runs our images (``make images``)
on containerd and runc, with kube-proxy and CoreDNS, in network, mount and PID namespaces of
its own with no route out (local_cluster/local_cluster/sealed_cluster.py). See
docs/local-cluster.md.

Session scope because starting costs seconds and the tests isolate themselves by
namespace. If the tools are not built the fixture fails with the command to run
(``make tools``), never skips: a missing control plane is a broken setup.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_cluster.cluster import LocalClusterSettings, built_tools_dir
from local_cluster.processes import reap_on_exit
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster


@pytest.fixture(scope="session")
def sealed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SealedCluster]:
    """The cluster with a real pod network (kube-proxy, CoreDNS) in a namespace with no route out."""
    reap_on_exit()  # Ctrl-C or SIGTERM of pytest still stops every process we start
    cluster = start_sealed_cluster(
        LocalClusterSettings(tools_dir=built_tools_dir(), workdir=tmp_path_factory.mktemp("sealed-cluster"))
    )
    try:
        yield cluster
    finally:
        cluster.stop()
