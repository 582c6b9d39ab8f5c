"""Tests of the local cluster itself, through the real ``kubectl``.

They prove what the operator's e2e tests rely on: pods run and get their own address,
a ``kill -9`` shows in status, restartPolicy holds, the real controller-manager rolls
out Deployments and garbage-collects dependents, deletion kills whole process groups
within the grace period, Secrets/ConfigMaps/PVCs and service-account tokens reach the
container (with RBAC applied to the pod's own identity), and stopping a cluster
leaves no process behind.

Bounds on waits are failure limits, not performance assertions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.cluster import REPO_ROOT, LocalCluster, built_tools_dir
from local_cluster.control_plane import ControlPlaneSettings, ControlPlaneStartError, start_control_plane
from local_cluster.processes import process_group_alive
from tests.e2e.support import get_json, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(kube_cluster: LocalCluster) -> Iterator[str]:
    name = f"harness-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    # Pods are refused until the controller-manager has created the namespace's default ServiceAccount.
    wait_for("default ServiceAccount", lambda: get_json(kube_cluster, name, "serviceaccount", "default"))
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply(cluster: LocalCluster, namespace: str, *documents: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(documents))


def pod_manifest(name: str, script: str, *, restart_policy: str = "Always", **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11", "args": ["-c", textwrap.dedent(script)]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart_policy, "containers": [container], **spec},
    }


def container_status(pod: dict[str, Any] | None) -> dict[str, Any]:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def pod_pid(pod: dict[str, Any] | None) -> int:
    container_id = container_status(pod).get("containerID", "")
    assert container_id.startswith("local://"), f"unexpected containerID {container_id!r}"
    return int(container_id.removeprefix("local://"))


def phase_is(cluster: LocalCluster, namespace: str, name: str, phase: str) -> Callable[[], Any]:
    def probe() -> Any:
        pod = get_json(cluster, namespace, "pod", name)
        return pod if pod and pod["status"].get("phase") == phase else None

    return probe


SERVE_ON_POD_IP = """
    import http.server, os
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ("pod " + os.environ["POD_NAME"] + " at " + os.environ["POD_IP"]).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
    http.server.HTTPServer((os.environ["POD_IP"], 8080), Hello).serve_forever()
"""


def test_pod_runs_gets_its_own_ip_and_becomes_ready(kube_cluster: LocalCluster, namespace: str) -> None:
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    apply(
        kube_cluster,
        namespace,
        pod_manifest(
            "web",
            SERVE_ON_POD_IP,
            container={
                "env": env,
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": probe,
            },
        ),
    )
    kube_cluster.kubectl("-n", namespace, "wait", "pod/web", "--for=condition=Ready", "--timeout=60s")
    pod = get_json(kube_cluster, namespace, "pod", "web")
    assert pod is not None
    ip = pod["status"]["podIP"]
    assert ip.startswith(f"{kube_cluster.settings.pod_subnet}.") and ip != "127.0.0.1"
    assert pod["spec"]["nodeName"] == kube_cluster.settings.node_name
    assert pod["status"]["phase"] == "Running"
    # The process really listens on the pod's own address, found through the downward API.
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as reply:
        assert reply.read().decode() == f"pod web at {ip}"


def test_kill_9_is_reported_and_restart_policy_is_honoured(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    sleeper = "import time; time.sleep(3600)"
    apply(
        kube_cluster,
        namespace,
        pod_manifest("never", sleeper, restart_policy="Never"),
        pod_manifest("always", sleeper, restart_policy="Always"),
    )
    never = wait_for("pod never Running", phase_is(kube_cluster, namespace, "never", "Running"))
    always = wait_for("pod always Running", phase_is(kube_cluster, namespace, "always", "Running"))
    os.killpg(pod_pid(never), signal.SIGKILL)
    os.killpg(pod_pid(always), signal.SIGKILL)

    failed = wait_for("pod never Failed", phase_is(kube_cluster, namespace, "never", "Failed"))
    terminated = container_status(failed)["state"]["terminated"]
    assert terminated["exitCode"] == 137
    assert container_status(failed)["restartCount"] == 0

    def restarted() -> Any:
        status = container_status(get_json(kube_cluster, namespace, "pod", "always"))
        return status if status.get("restartCount") == 1 and "running" in status.get("state", {}) else None

    status = wait_for("pod always restarted once", restarted)
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert pod_pid(get_json(kube_cluster, namespace, "pod", "always")) != pod_pid(always)


def test_exit_codes_and_on_failure_policy(kube_cluster: LocalCluster, namespace: str) -> None:
    apply(
        kube_cluster,
        namespace,
        pod_manifest("ok", "print('done')", restart_policy="OnFailure"),
        pod_manifest("bad", "import sys; sys.exit(3)", restart_policy="Never"),
    )
    ok = wait_for("pod ok Succeeded", phase_is(kube_cluster, namespace, "ok", "Succeeded"))
    assert container_status(ok)["state"]["terminated"]["exitCode"] == 0
    assert container_status(ok)["restartCount"] == 0
    bad = wait_for("pod bad Failed", phase_is(kube_cluster, namespace, "bad", "Failed"))
    assert container_status(bad)["state"]["terminated"]["exitCode"] == 3


def test_deployment_rolls_out_through_the_controller_manager(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sleepers"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "sleepers"}},
            "template": {
                "metadata": {"labels": {"app": "sleepers"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11",
                            "args": ["-c", "import time; time.sleep(3600)"],
                            "env": [{"name": "REVISION", "value": "1"}],
                        }
                    ],
                },
            },
        },
    }
    apply(kube_cluster, namespace, deployment)
    kube_cluster.kubectl(
        "-n", namespace, "rollout", "status", "deployment/sleepers", "--timeout=90s", timeout=100
    )
    first = get_json(kube_cluster, namespace, "pods", "-l", "app=sleepers")
    assert first is not None and len(first["items"]) == 2
    first_pids = [pod_pid(pod) for pod in first["items"]]

    kube_cluster.kubectl("-n", namespace, "set", "env", "deployment/sleepers", "REVISION=2")
    kube_cluster.kubectl(
        "-n", namespace, "rollout", "status", "deployment/sleepers", "--timeout=90s", timeout=100
    )
    replica_sets = get_json(kube_cluster, namespace, "replicasets", "-l", "app=sleepers")
    assert replica_sets is not None and len(replica_sets["items"]) == 2
    wait_for(
        "old pods' processes to be killed",
        lambda: not any(process_group_alive(pid) for pid in first_pids),
    )


def test_deleting_an_owner_garbage_collects_dependents(kube_cluster: LocalCluster, namespace: str) -> None:
    kube_cluster.kubectl("-n", namespace, "create", "configmap", "owner", "--from-literal=k=v")
    owner = get_json(kube_cluster, namespace, "configmap", "owner")
    assert owner is not None
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    dependent = pod_manifest("dependent", "import time; time.sleep(3600)")
    dependent["metadata"]["ownerReferences"] = [reference]
    dependent["spec"]["terminationGracePeriodSeconds"] = 2
    apply(kube_cluster, namespace, dependent)
    pid = pod_pid(wait_for("dependent Running", phase_is(kube_cluster, namespace, "dependent", "Running")))

    kube_cluster.kubectl("-n", namespace, "delete", "configmap", "owner")
    wait_for(
        "the garbage collector to delete the pod",
        lambda: get_json(kube_cluster, namespace, "pod", "dependent") is None,
    )
    assert not process_group_alive(pid)


def test_deletion_kills_the_whole_process_group_within_the_grace_period(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    # The container ignores SIGTERM and leaves a grandchild: only SIGKILL of the group ends both.
    stubborn = """
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen(["sleep", "3600"])
        time.sleep(3600)
    """
    manifest = pod_manifest("stubborn", stubborn)
    manifest["spec"]["terminationGracePeriodSeconds"] = 2
    apply(kube_cluster, namespace, manifest)
    pid = pod_pid(wait_for("stubborn Running", phase_is(kube_cluster, namespace, "stubborn", "Running")))
    wait_for("the grandchild to start", lambda: len(_group_members(pid)) >= 2)

    kube_cluster.kubectl("-n", namespace, "delete", "pod", "stubborn", "--timeout=30s", timeout=40)
    assert get_json(kube_cluster, namespace, "pod", "stubborn") is None
    # The leader and the grandchild were SIGKILLed; allow init a moment to reap the orphan.
    wait_for("the container's process group to be gone", lambda: not process_group_alive(pid), timeout=5)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except ProcessLookupError:
                continue
    return members


def test_secrets_config_maps_and_claims_reach_the_container(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    kube_cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", "creds", "--from-literal=password=s3cret"
    )
    kube_cluster.kubectl("-n", namespace, "create", "configmap", "settings", "--from-literal=mode=active")
    # The claim binds to a volume from the default StorageClass (the node agent's provisioner).
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "journal"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    apply(kube_cluster, namespace, claim)
    check = """
        import os, pathlib, sys
        assert os.environ["PASSWORD"] == "s3cret", os.environ.get("PASSWORD")
        assert pathlib.Path(sys.argv[1]).read_text() == "active"
        journal = pathlib.Path(os.environ["JOURNAL"])
        previous = journal.read_text() if journal.exists() else ""
        journal.write_text(previous + "x")
        print("journal now", journal.read_text())
    """
    volumes = [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "journal"}},
    ]
    container = {
        "args": ["-c", textwrap.dedent(check), "/etc/app/mode"],
        "env": [
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "JOURNAL", "value": "/data/journal.txt"},
        ],
        "volumeMounts": [
            {"name": "settings", "mountPath": "/etc/app"},
            {"name": "data", "mountPath": "/data"},
        ],
    }
    for attempt in ("first", "second"):
        apply(kube_cluster, namespace, pod_manifest(attempt, "", restart_policy="Never", container=container,
                                                    volumes=volumes))  # fmt: skip
        wait_for(f"pod {attempt} Succeeded", phase_is(kube_cluster, namespace, attempt, "Succeeded"))
    # The claim outlives the pod: the second pod found what the first wrote, in the claim's volume.
    journal = kube_cluster.state_dir / "claims" / namespace / "journal" / "journal.txt"
    assert journal.read_text() == "xx"


def test_missing_secret_and_unknown_image_are_reported(kube_cluster: LocalCluster, namespace: str) -> None:
    missing_secret = pod_manifest(
        "nosecret",
        "print(1)",
        container={"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]},
    )
    unknown_image = pod_manifest("noimage", "print(1)", container={"image": "example.com/unknown:1"})
    apply(kube_cluster, namespace, missing_secret, unknown_image)

    def waiting_reason(name: str) -> Callable[[], Any]:
        return lambda: (
            container_status(get_json(kube_cluster, namespace, "pod", name)).get("state", {}).get("waiting")
        )

    secret_wait = wait_for(
        "nosecret waiting", lambda: (w := waiting_reason("nosecret")()) and w.get("message") and w
    )
    assert secret_wait["reason"] == "CreateContainerConfigError"
    assert "absent" in secret_wait["message"]
    image_wait = wait_for(
        "noimage waiting", lambda: (w := waiting_reason("noimage")()) and w.get("message") and w
    )
    assert image_wait["reason"] == "ErrImagePull"
    assert "images.yaml" in image_wait["message"]


IN_CLUSTER_CLIENT = """
    import sys
    from kubernetes import client, config
    config.load_config()  # the KUBECONFIG the node agent wrote, holding this pod's token
    namespace = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    pods = client.CoreV1Api().list_namespaced_pod(namespace)
    print("listed", len(pods.items), "pods as the pod's service account")
"""


def test_service_account_token_gives_in_cluster_access_under_rbac(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    # Without a RoleBinding the default ServiceAccount may not list pods: proves the pod
    # talks as itself, not as the agent's admin.
    apply(kube_cluster, namespace, pod_manifest("denied", IN_CLUSTER_CLIENT, restart_policy="Never"))
    wait_for("pod denied Failed", phase_is(kube_cluster, namespace, "denied", "Failed"))

    kube_cluster.kubectl("-n", namespace, "create", "role", "pod-reader", "--verb=list", "--resource=pods")
    kube_cluster.kubectl(
        "-n", namespace, "create", "rolebinding", "pod-reader", "--role=pod-reader",
        f"--serviceaccount={namespace}:default",
    )  # fmt: skip
    apply(kube_cluster, namespace, pod_manifest("allowed", IN_CLUSTER_CLIENT, restart_policy="Never"))
    wait_for("pod allowed Succeeded", phase_is(kube_cluster, namespace, "allowed", "Succeeded"))


def test_cluster_up_and_down_leave_no_process_behind(tmp_path: Path) -> None:
    """The developer CLI: up prints the export line; down stops every process, even a dead agent's pods."""
    workdir = tmp_path / "cluster"
    cli = [sys.executable, "-m", "local_cluster.cluster"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    up = subprocess.run([*cli, "up", f"--workdir={workdir}"], capture_output=True, text=True, env=env,
                        cwd=REPO_ROOT, timeout=150, check=False)  # fmt: skip
    assert up.returncode == 0, up.stderr
    export = up.stdout.strip().splitlines()[-1]
    assert export.startswith("export KUBECONFIG=")
    kubeconfig = export.removeprefix("export KUBECONFIG=")
    state = json.loads((workdir / "cluster.json").read_text())
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    try:
        pod = pod_manifest("survivor-check", "import time; time.sleep(3600)")
        subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(pod), check=True, text=True,
                       capture_output=True, timeout=30)  # fmt: skip

        def running_pod() -> Any:
            command = [*kubectl, "get", "pod", "survivor-check", "-o", "json"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            body = json.loads(result.stdout) if result.returncode == 0 else None
            return body if body and body["status"].get("phase") == "Running" else None

        pod_group = pod_pid(wait_for("survivor-check Running", running_pod))
        # The agent dies without cleaning up: its recorded pod process groups must still be swept.
        os.kill(state["pids"][-1], signal.SIGKILL)
    finally:
        down = subprocess.run([*cli, "down", f"--workdir={workdir}"], capture_output=True, text=True, env=env,
                              cwd=REPO_ROOT, timeout=60, check=False)  # fmt: skip
    assert down.returncode == 0, down.stderr
    survivors = [pid for pid in [state["supervisor"], *state["pids"], pod_group] if process_group_alive(pid)]
    assert survivors == []


def test_helm_installs_a_chart_that_requires_this_kubernetes_version(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    # kubeVersion makes helm check the server's /version: proves the tools are version-stamped.
    chart = tmp_path / "probe-chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe-chart\nversion: 0.1.0\nkubeVersion: '>=1.33.0-0 <1.34.0-0'\n"
    )
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-helm\n"
        "data:\n  release: {{ .Release.Name }}\n"
    )
    kube_cluster.helm("install", "probe", str(chart), "--namespace", namespace, "--wait", "--timeout=60s")
    config_map = get_json(kube_cluster, namespace, "configmap", "from-helm")
    assert config_map is not None and config_map["data"] == {"release": "probe"}


def test_a_sigstopped_pod_turns_unready_and_recovers(kube_cluster: LocalCluster, namespace: str) -> None:
    """The partition the failover tests use: SIGSTOP fails the readiness probe, SIGCONT heals it."""
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    # httpGet, not tcpSocket: the kernel still completes TCP handshakes for a stopped
    # process's listening socket, but nothing answers the HTTP request.
    probe = {
        "httpGet": {"path": "/", "port": 8080},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 1,
    }
    apply(
        kube_cluster,
        namespace,
        pod_manifest("frozen", SERVE_ON_POD_IP, container={"env": env, "readinessProbe": probe}),
    )
    kube_cluster.kubectl("-n", namespace, "wait", "pod/frozen", "--for=condition=Ready", "--timeout=60s")
    pid = pod_pid(get_json(kube_cluster, namespace, "pod", "frozen"))

    def ready_is(expected: str) -> Callable[[], bool]:
        def ready_condition_matches() -> bool:
            pod = get_json(kube_cluster, namespace, "pod", "frozen") or {}
            conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
            return conditions.get("Ready") == expected

        return ready_condition_matches

    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_for("the stopped pod to turn unready", ready_is("False"))
        pod = get_json(kube_cluster, namespace, "pod", "frozen")
        assert pod is not None and pod["status"]["phase"] == "Running"  # stopped is not dead
        assert container_status(pod)["restartCount"] == 0
    finally:
        os.killpg(pid, signal.SIGCONT)
    wait_for("the resumed pod to be ready again", ready_is("True"))


def test_missing_tools_fail_with_the_command_to_run(tmp_path: Path) -> None:
    settings = ControlPlaneSettings(tools_dir=tmp_path / "empty", workdir=tmp_path / "work")
    with pytest.raises(ControlPlaneStartError, match=r"etcd not found in tools dir .*run `make tools`"):
        start_control_plane(settings)


def test_a_component_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    """Real etcd, unusable data dir: the launcher names the component and shows its log."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "etcd").write_text("a file where etcd wants its data directory\n")
    settings = ControlPlaneSettings(tools_dir=built_tools_dir(), workdir=workdir, ready_timeout_seconds=30)
    with pytest.raises(ControlPlaneStartError, match=r"etcd exited with \d+ while waiting for etcd /health"):
        start_control_plane(settings)


def test_a_failing_liveness_probe_kills_and_restarts_the_container(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    probe = {
        "httpGet": {"path": "/", "port": 8080},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "failureThreshold": 2,
    }
    apply(
        kube_cluster,
        namespace,
        pod_manifest("hung", SERVE_ON_POD_IP, container={"env": env, "livenessProbe": probe}),
    )
    first = pod_pid(wait_for("hung Running", phase_is(kube_cluster, namespace, "hung", "Running")))
    os.killpg(first, signal.SIGSTOP)  # hung, not dead: only the liveness probe can notice

    def restarted() -> Any:
        pod = get_json(kube_cluster, namespace, "pod", "hung")
        status = container_status(pod)
        return pod if status.get("restartCount") == 1 and "running" in status.get("state", {}) else None

    pod = wait_for("the liveness probe to restart the container", restarted)
    assert container_status(pod)["lastState"]["terminated"]["exitCode"] == 137
    assert pod_pid(pod) != first
    assert not process_group_alive(first)
