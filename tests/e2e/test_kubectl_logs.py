"""``kubectl logs`` against the local cluster: the apiserver proxies to the node agent's kubelet API.

The real ``kubectl`` and the real apiserver (``--kubelet-client-certificate``,
``--kubelet-certificate-authority``, the Node's InternalIP and daemonEndpoints port)
reach ``local_cluster/local_cluster/kubelet_api.py``: output of a pod, ``--tail``,
``--limit-bytes``, ``--previous`` after a ``kill -9``, ``-f`` ending with the container,
``-c`` in a multi-container pod, a finished Job's pod, the kubelet's errors, and a
client without a certificate from the cluster CA refused by the kubelet endpoint itself.

Bounds on waits are failure limits, not performance assertions.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import LocalCluster
from local_cluster.container_logs import LogRequestError, PodLogFinder, instance_spans, safe_length
from tests.e2e.support import get_json, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(kube_cluster: LocalCluster) -> Iterator[str]:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: get_json(kube_cluster, name, "serviceaccount", "default"))
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def shell_container(name: str, script: str) -> dict[str, Any]:
    """busybox maps to no entrypoint in images.yaml: ``command`` runs /bin/sh from PATH."""
    return {"name": name, "image": "busybox:1.36", "command": ["sh", "-c", script]}


def apply_pod(
    cluster: LocalCluster, namespace: str, name: str, *containers: dict[str, Any], restart_policy: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart_policy, "containers": list(containers)},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(pod))


def logs(
    cluster: LocalCluster, namespace: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("-n", namespace, "logs", *args, check=False, timeout=timeout)


def logs_contain(cluster: LocalCluster, namespace: str, text: str, *args: str) -> Any:
    def probe() -> Any:
        result = logs(cluster, namespace, *args)
        return result.stdout if result.returncode == 0 and text in result.stdout else None

    return probe


def container_statuses(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, dict[str, Any]]:
    body = get_json(cluster, namespace, "pod", pod) or {}
    return {status["name"]: status for status in (body.get("status") or {}).get("containerStatuses") or []}


def test_logs_print_the_output_with_tail_and_limit(kube_cluster: LocalCluster, namespace: str) -> None:
    script = "for i in 1 2 3 4 5; do echo line-$i; done; echo 'to stderr' >&2; exec sleep 3600"
    apply_pod(kube_cluster, namespace, "printer", shell_container("main", script), restart_policy="Never")
    everything = "line-1\nline-2\nline-3\nline-4\nline-5\nto stderr\n"
    # Exactly the container's output (stdout and stderr): the agent's start marker is not shown.
    assert wait_for("the pod's output", logs_contain(kube_cluster, namespace, "to stderr", "printer")) == (
        everything
    )
    assert logs(kube_cluster, namespace, "printer", "--tail=2").stdout == "line-5\nto stderr\n"
    assert logs(kube_cluster, namespace, "printer", "--tail=0").stdout == ""
    assert logs(kube_cluster, namespace, "printer", "--limit-bytes=9").stdout == "line-1\nli"
    # sinceSeconds is approximate (whole instance or nothing); everything here is recent.
    assert logs(kube_cluster, namespace, "printer", "--since=1h").stdout == everything
    # No per-line times are recorded: refused rather than invented.
    timestamps = logs(kube_cluster, namespace, "printer", "--timestamps")
    assert timestamps.returncode != 0 and "timestamps are not available" in timestamps.stderr


def test_previous_shows_the_instance_before_a_kill_9(kube_cluster: LocalCluster, namespace: str) -> None:
    script = 'echo "instance with pid $$$$"; exec sleep 3600'  # `$$` is Kubernetes' escape for `$`
    apply_pod(kube_cluster, namespace, "restarts", shell_container("main", script), restart_policy="Always")
    wait_for("the first instance's output", logs_contain(kube_cluster, namespace, "instance", "restarts"))
    never_restarted = logs(kube_cluster, namespace, "restarts", "--previous")
    assert never_restarted.returncode != 0
    assert 'previous terminated container "main" in pod "restarts" not found' in never_restarted.stderr

    first = container_statuses(kube_cluster, namespace, "restarts")["main"]
    first_pgid = int(first["containerID"].removeprefix("local://"))
    os.killpg(first_pgid, signal.SIGKILL)

    def restarted() -> Any:
        status = container_statuses(kube_cluster, namespace, "restarts").get("main", {})
        return status if status.get("restartCount") == 1 and status.get("containerID") else None

    second_pgid = int(wait_for("the restart", restarted)["containerID"].removeprefix("local://"))
    assert second_pgid != first_pgid
    current = wait_for(
        "the second instance's output",
        logs_contain(kube_cluster, namespace, f"pid {second_pgid}", "restarts"),
    )
    assert current == f"instance with pid {second_pgid}\n"
    previous = logs(kube_cluster, namespace, "restarts", "--previous")
    assert previous.returncode == 0, previous.stderr
    assert previous.stdout == f"instance with pid {first_pgid}\n"


def test_follow_streams_until_the_container_exits(kube_cluster: LocalCluster, namespace: str) -> None:
    script = "echo first; sleep 6; echo second; sleep 1; echo last"
    apply_pod(kube_cluster, namespace, "follow", shell_container("main", script), restart_policy="Never")
    wait_for("the first line", logs_contain(kube_cluster, namespace, "first", "follow"))
    # Still running (6 s to go) as -f starts, so "second" and "last" arrive while it follows.
    assert "running" in container_statuses(kube_cluster, namespace, "follow")["main"]["state"]
    followed = logs(kube_cluster, namespace, "follow", "-f", timeout=60)  # ends by itself, or fails
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "first\nsecond\nlast\n"
    assert container_statuses(kube_cluster, namespace, "follow")["main"]["state"].get("terminated")


def test_multi_container_pod_and_unknown_container(kube_cluster: LocalCluster, namespace: str) -> None:
    apply_pod(
        kube_cluster,
        namespace,
        "pair",
        shell_container("alpha", "echo alpha speaks; exec sleep 3600"),
        shell_container("beta", "echo beta speaks; exec sleep 3600"),
        restart_policy="Never",
    )
    assert wait_for("beta's output", logs_contain(kube_cluster, namespace, "beta", "pair", "-c", "beta")) == (
        "beta speaks\n"
    )
    assert wait_for(
        "alpha's output", logs_contain(kube_cluster, namespace, "alpha", "pair", "-c", "alpha")
    ) == ("alpha speaks\n")
    both = logs(kube_cluster, namespace, "pair", "--all-containers", "--prefix")
    assert "[pod/pair/alpha] alpha speaks" in both.stdout and "[pod/pair/beta] beta speaks" in both.stdout
    unknown = logs(kube_cluster, namespace, "pair", "-c", "gamma")
    assert unknown.returncode != 0 and "container gamma is not valid for pod pair" in unknown.stderr


def test_a_finished_jobs_pod_keeps_its_logs(kube_cluster: LocalCluster, namespace: str) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [shell_container("main", "echo job done")],
                }
            },
        },
    }
    kube_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(job))
    kube_cluster.kubectl("-n", namespace, "wait", "job/once", "--for=condition=Complete", "--timeout=60s")
    result = logs(kube_cluster, namespace, "job/once")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job done\n"


# ---- the kubelet endpoint itself ---------------------------------------------------------------


def kubelet_address(cluster: LocalCluster) -> tuple[str, int]:
    node = get_json(cluster, "default", "node", cluster.settings.node_name)
    assert node is not None
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    port = int(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])
    assert internal and port > 0
    assert internal[0].startswith("127."), "the tests only talk to loopback"
    return internal[0], port


def kubelet_get(
    address: tuple[str, int], path: str, ca: Path, client_cert: tuple[Path, Path] | None
) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    if client_cert is not None:
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    connection = http.client.HTTPSConnection(*address, context=context, timeout=15)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, reply.read().decode()
    finally:
        connection.close()


def other_ca_client_certificate(directory: Path) -> tuple[Path, Path]:
    """A client certificate with the apiserver's subject, self-signed: not from the cluster CA."""
    cert, key = directory / "impostor.crt", directory / "impostor.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
        ],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def test_kubelet_endpoint_requires_a_cluster_ca_client_certificate(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    apply_pod(
        kube_cluster,
        namespace,
        "quiet",
        shell_container("main", "echo hello; exec sleep 3600"),
        restart_policy="Never",
    )
    wait_for("the pod's output", logs_contain(kube_cluster, namespace, "hello", "quiet"))
    pki = kube_cluster.control_plane.pki
    address = kubelet_address(kube_cluster)
    apiserver_identity = (pki.kubelet_client.cert, pki.kubelet_client.key)
    path = f"/containerLogs/{namespace}/quiet/main"

    assert kubelet_get(address, path, pki.ca_cert, apiserver_identity) == (200, "hello\n")
    # The kubelet's wording for what does not exist.
    assert kubelet_get(
        address, f"/containerLogs/{namespace}/quiet/nope", pki.ca_cert, apiserver_identity
    ) == (
        404,
        'container "nope" not found in pod "quiet"',
    )
    assert kubelet_get(
        address, f"/containerLogs/{namespace}/ghost/main", pki.ca_cert, apiserver_identity
    ) == (
        404,
        'pod "ghost" does not exist',
    )
    # No client certificate, or one from another CA: the TLS handshake fails, no log is served.
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        kubelet_get(address, path, pki.ca_cert, None)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        kubelet_get(address, path, pki.ca_cert, other_ca_client_certificate(tmp_path))


def test_log_file_instances_markers_and_finished_pods_on_disk(tmp_path: Path) -> None:
    """The file rules without a cluster: markers split instances (even after output without a
    newline), a marker still being written is held back, and a pod only on disk is found."""
    data = (
        b"=== node agent: start #0 argv=['sh']\nfirst\nno newline"
        b"=== node agent: start #1 argv=['sh']\nsecond\n=== node agent: sta"
    )
    assert [data[start:end] for start, end in instance_spans(data)] == [b"first\nno newline", b"second\n"]
    assert safe_length(b"out=1\nx == y") == len(b"out=1\nx == y")
    assert safe_length(b"out\n=== node") == 4

    pod_dir = tmp_path / "pods" / "ns_done_0123-uid"
    (pod_dir / "logs").mkdir(parents=True)
    (pod_dir / "logs" / "main.log").write_bytes(b"=== node agent: start #0 argv=['x']\nfinished\n")
    finder = PodLogFinder(lambda: [], tmp_path / "pods")
    assert finder("ns", "done", "main").path == pod_dir / "logs" / "main.log"
    with pytest.raises(LogRequestError, match='container "other" not found in pod "done"'):
        finder("ns", "done", "other")
    with pytest.raises(LogRequestError, match=re.escape('pod "d*" does not exist')):
        finder("ns", "d*", "main")
