"""``kubectl logs`` on the sealed cluster: our images' output reaches kubectl through the real kubelet.

The real ``kubectl`` asks the API server, which proxies to the real kubelet, which reads the CRI log
files containerd writes for our images' containers: stdout and stderr of a container of the broker
image (``--tail``, ``--limit-bytes``, ``--since``, ``--timestamps``: the kubelet keeps a time per
line), ``-f`` ending when the container exits, and a finished Job's pod of the operator image keeping
its output, which the chart's validator CronJob relies on (``validator.*JobsHistoryLimit``: finished
Jobs and their pods are kept for their logs).

Not here any more: ``--previous`` after a kill -9 (``test_kubelet_node.py``, on a broker pod),
``-c``/``--all-containers`` and the unknown-container error (kubectl's and the API server's own
behaviour; no pod of ours has two containers), and the node agent's kubelet endpoint and log-file
format, which the real kubelet replaced.

Bounds on waits are failure limits, not performance assertions.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import PYTHON_IMAGE, SHELL_IMAGE, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    sealed_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: sealed_cluster.get_json(name, "serviceaccount", "default"))
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def shell_container(name: str, script: str) -> dict[str, Any]:
    """A container of the broker image running Debian's ``sh`` (its entrypoint replaced)."""
    return {"name": name, "image": SHELL_IMAGE, "command": ["sh", "-c", script]}


def apply_pod(cluster: SealedCluster, namespace: str, name: str, container: dict[str, Any]) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container]},
    }
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))


def logs(
    cluster: SealedCluster, namespace: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("-n", namespace, "logs", *args, check=False, timeout=timeout)


def logs_contain(cluster: SealedCluster, namespace: str, text: str, *args: str) -> Callable[[], Any]:
    def probe() -> Any:
        result = logs(cluster, namespace, *args)
        return result.stdout if result.returncode == 0 and text in result.stdout else None

    return probe


def container_state(cluster: SealedCluster, namespace: str, pod: str) -> dict[str, Any]:
    body = cluster.get_json(namespace, "pod", pod) or {}
    statuses = (body.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("state") or {})


def test_logs_print_the_output_with_tail_limit_since_and_timestamps(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    # containerd reads stdout and stderr on two pipes, so their order in the log is the order it read
    # them in. The stderr line waits (bounded) for a file the test creates once stdout is logged.
    script = (
        "for i in 1 2 3 4 5; do echo line-$i; done; "
        "for i in $(seq 600); do [ -e /tmp/stdout-logged ] && break; sleep 0.1; done; "
        "echo 'to stderr' >&2; exec sleep 3600"
    )
    apply_pod(sealed_cluster, namespace, "printer", shell_container("main", script))
    lines = ["line-1", "line-2", "line-3", "line-4", "line-5", "to stderr"]
    everything = "".join(f"{line}\n" for line in lines)
    wait_for("the pod's stdout", logs_contain(sealed_cluster, namespace, "line-5", "printer"))
    sealed_cluster.kubectl("-n", namespace, "exec", "printer", "--", "touch", "/tmp/stdout-logged")
    # Exactly the container's output, stdout and stderr, as containerd recorded it.
    output = wait_for("the pod's output", logs_contain(sealed_cluster, namespace, "to stderr", "printer"))
    assert output == everything
    assert logs(sealed_cluster, namespace, "printer", "--tail=2").stdout == "line-5\nto stderr\n"
    assert logs(sealed_cluster, namespace, "printer", "--tail=0").stdout == ""
    assert logs(sealed_cluster, namespace, "printer", "--limit-bytes=9").stdout == "line-1\nli"
    assert logs(sealed_cluster, namespace, "printer", "--since=1h").stdout == everything

    # The kubelet keeps a time per line (the CRI log format): --timestamps prefixes each line with it.
    stamped = logs(sealed_cluster, namespace, "printer", "--timestamps")
    assert stamped.returncode == 0, stamped.stderr
    now = datetime.datetime.now(datetime.UTC)
    for line, expected in zip(stamped.stdout.splitlines(), lines, strict=True):
        stamp, text = line.split(" ", 1)
        assert text == expected
        written = datetime.datetime.fromisoformat(stamp)
        assert abs((now - written).total_seconds()) < 600, line


def test_follow_streams_until_the_container_exits(sealed_cluster: SealedCluster, namespace: str) -> None:
    script = "echo first; sleep 6; echo second; sleep 1; echo last"
    apply_pod(sealed_cluster, namespace, "follow", shell_container("main", script))
    wait_for("the first line", logs_contain(sealed_cluster, namespace, "first", "follow"))
    # Still running (6 s to go) as -f starts, so "second" and "last" arrive while it follows.
    assert "running" in container_state(sealed_cluster, namespace, "follow")
    followed = logs(sealed_cluster, namespace, "follow", "-f", timeout=60)  # ends by itself, or fails
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "first\nsecond\nlast\n"
    wait_for(
        "the container terminated",
        lambda: container_state(sealed_cluster, namespace, "follow").get("terminated"),
    )


def test_a_finished_jobs_pod_keeps_its_logs(sealed_cluster: SealedCluster, namespace: str) -> None:
    """What the validator's CronJob relies on: its Job's output is readable after the Job is done."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "main",
                            "image": PYTHON_IMAGE,
                            "command": ["python3", "-c", "print('job done', flush=True)"],
                        }
                    ],
                }
            },
        },
    }
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(job))
    sealed_cluster.kubectl(
        "-n", namespace, "wait", "job/once", "--for=condition=Complete", "--timeout=90s", timeout=100
    )
    result = logs(sealed_cluster, namespace, "job/once")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job done\n"
