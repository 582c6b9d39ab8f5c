"""The ``sealed_cluster`` fixture: one real local Kubernetes cluster per test session.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and the
kubelet are built from Go modules by ``make tools``; the node runs our images (``make images``)
on containerd and runc, with kube-proxy and CoreDNS, in network, mount and PID namespaces of
its own with no route out (local_cluster/local_cluster/sealed_cluster.py). See
docs/local-cluster.md.

``sealed_cluster_three_nodes`` is another cluster, of three nodes (``node-1`` ... ``node-3``, each a
kubelet, containerd and kube-proxy in a network namespace of its own), started only by the tests that
ask for it (marked ``three_nodes``), once per module and stopped when the module ends, so that it
does not idle beside the rest of the session; the single-node ``sealed_cluster`` stays the default.

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
from tests.e2e.support import LIVE_RELAYS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries its relays' operator pods, logs and events: taken here,
    before the fixtures' teardown deletes the namespaces they were in."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed:
        return
    for relay in list(LIVE_RELAYS):
        try:
            text = relay.operator_diagnostics()
        except Exception as error:  # a report must not fail for want of its appendix
            text = f"could not gather them: {error!r}"
        report.sections.append((f"operator diagnostics, namespace {relay.namespace}", text))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "three_nodes: runs on a sealed cluster of three nodes (issue 22); part of make test"
    )


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


@pytest.fixture(scope="module")
def sealed_cluster_three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SealedCluster]:
    """A cluster of three nodes (``cluster.nodes``: names, addresses, a command or call in each
    node's network namespace, the pids and cgroup of each node's processes)."""
    reap_on_exit()
    cluster = start_sealed_cluster(
        LocalClusterSettings(
            tools_dir=built_tools_dir(),
            workdir=tmp_path_factory.mktemp("sealed-cluster-three-nodes"),
            nodes=3,
            ready_timeout_seconds=270,  # a failure limit: three nodes import the images each
        )
    )
    try:
        yield cluster
    finally:
        cluster.stop()
