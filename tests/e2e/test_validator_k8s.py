"""The ordering validator on Kubernetes: the chart's CronJob, Spark executor pods, status.ordering.

Everything is real except the node agent (the fixture's documented fake kubelet): the chart is
installed with the Go-built helm, the operator runs in-cluster through the chart's RBAC, broker
pods write their message-log segments into one shared claim (a directory every pod of the
namespace that mounts it shares, see docs/local-cluster.md), and the CronJob's pod runs the
validator image's entrypoint as a local process. With ``validator.executors: 2`` its Spark driver
asks the API server for two executor pods of the same image, which the node agent runs as local
processes too (``executor`` mode of ``broker_validator.entrypoint``), owned by the driver pod.

The CronJob is installed suspended, so its schedule cannot start a run beside the ones the test
starts with ``kubectl create job --from=cronjob/...`` (runs share the store's checkpoint).

``record_ordering`` (``broker_validator.status``) is also tested on its own against the API
server: the merge patch leaves the operator's status fields alone, a missing BrokerCluster is a
warning, and a service account without the right is refused with a message saying what it needs.

Waits are bounded failure limits, not performance assertions; the timings are printed.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kubernetes
import pytest
import yaml

from broker_contracts.message_log import CLOSED_SEGMENT_SUFFIX, OPEN_SEGMENT_SUFFIX, format_ts, segment_name
from broker_simulators.local_processes import free_port as free_port_on
from broker_simulators.local_processes import loopback_host
from broker_validator.entrypoint import EntrypointError, command_for
from broker_validator.report_schema import Report
from broker_validator.spark import SparkSettings, SparkSettingsError, kubernetes_conf, local_conf
from broker_validator.status import OrderingStatusError, record_ordering
from local_cluster.cluster import REPO_ROOT, LocalCluster
from local_cluster.pki import write_kubeconfig
from tests.e2e.support import LocalProcess, free_port, get_json, installed_crd, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
VENV_BIN = REPO_ROOT / ".venv" / "bin"
RELEASE = "bf"
CRONJOB = f"{RELEASE}-broker-failover-validator"
STORE_CLAIM = "message-log"
CLUSTER = "orders"
BROKERS = [f"{CLUSTER}-{ordinal}" for ordinal in range(3)]
REPORT_LOCATION = f"pvc/{STORE_CLAIM}/.validator/reports/report.html"
STREAMS, PER_STREAM, INBOUND_STREAMS = 4, 4000, 2


def say(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)


# ---- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crd(kube_cluster: LocalCluster) -> Iterator[None]:
    """The CRD, applied here (helm skips a CRD that exists, even one being deleted by another module)."""
    with installed_crd(kube_cluster):
        yield


@pytest.fixture
def namespace(kube_cluster: LocalCluster, crd: None) -> Iterator[str]:
    name = f"validator-{uuid.uuid4().hex[:6]}"
    kube_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: get_json(kube_cluster, name, "serviceaccount", "default"))
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def http_json(url: str, payload: dict[str, Any] | None = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


def answers(url: str) -> bool:
    try:
        http_json(url)
    except OSError:
        return False
    return True


# ---- the pieces that need no cluster: settings, Spark properties, executor argv, the chart ----------


def test_settings_come_from_validator_variables_and_name_the_bad_one() -> None:
    settings = SparkSettings.from_env(
        {
            "VALIDATOR_NAMESPACE": "ns",
            "VALIDATOR_POD_NAME": "driver-abc",
            "VALIDATOR_POD_IP": "127.1.2.3",
            "VALIDATOR_IMAGE": "broker-failover/validator:1",
            "VALIDATOR_EXECUTORS": "3",
            "VALIDATOR_EXECUTOR_MEMORY": "768m",
            "VALIDATOR_STORE_CLAIM": "message-log",
            "VALIDATOR_STORE_MOUNT": "/store",
            "VALIDATOR_EXECUTOR_POD_TEMPLATE": "/etc/t.yaml",
            "VALIDATOR_SPARK_CONF": "spark.network.timeout=300s",
        }
    )
    conf = kubernetes_conf("k8s://https://127.0.0.1:6443", settings)
    assert conf["spark.submit.deployMode"] == "client"
    assert (conf["spark.driver.host"], conf["spark.driver.bindAddress"]) == ("127.1.2.3", "127.1.2.3")
    assert conf["spark.kubernetes.driver.pod.name"] == "driver-abc"
    assert (conf["spark.executor.instances"], conf["spark.executor.memory"]) == ("3", "768m")
    volume = "spark.kubernetes.executor.volumes.persistentVolumeClaim.store"
    assert (conf[f"{volume}.options.claimName"], conf[f"{volume}.mount.path"]) == ("message-log", "/store")
    assert conf["spark.kubernetes.executor.podTemplateFile"] == "/etc/t.yaml"
    assert conf["spark.network.timeout"] == "300s"
    assert local_conf("*", settings)["spark.driver.host"] == "127.0.0.1"  # local mode stays on loopback

    with pytest.raises(SparkSettingsError, match="VALIDATOR_POD_NAME, VALIDATOR_POD_IP, VALIDATOR_IMAGE"):
        kubernetes_conf("k8s://https://127.0.0.1:6443", SparkSettings(namespace="ns"))
    with pytest.raises(SparkSettingsError, match="VALIDATOR_EXECUTORS='two'"):
        SparkSettings.from_env({"VALIDATOR_EXECUTORS": "two"})
    with pytest.raises(SparkSettingsError, match="VALIDATOR_DRIVER_MEMORY='lots'"):
        SparkSettings.from_env({"VALIDATOR_DRIVER_MEMORY": "lots"})


def test_the_executor_mode_starts_the_kubernetes_executor_backend_as_spark_does() -> None:
    env = {
        "PATH": os.environ["PATH"],
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.1.2.3:7078",
        "SPARK_EXECUTOR_ID": "2",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_APPLICATION_ID": "spark-app",
        "SPARK_EXECUTOR_POD_IP": "127.1.2.4",
        "SPARK_EXECUTOR_POD_NAME": "broker-validator-exec-2",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_CONF_DIR": "/opt/spark/conf",
        "SPARK_JAVA_OPT_10": "-Dten",
        "SPARK_JAVA_OPT_2": "-Dtwo",
    }
    argv, executor_env = command_for(["executor"], env)
    assert argv[1:5] == ["-Dtwo", "-Dten", "-Xms512m", "-Xmx512m"]
    classpath = argv[argv.index("-cp") + 1].split(":")
    assert classpath[0] == "/opt/spark/conf" and classpath[-1].endswith("pyspark/jars/*")
    backend = argv.index("org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend")
    assert argv[backend + 1 :] == [
        "--driver-url", env["SPARK_DRIVER_URL"], "--executor-id", "2", "--cores", "1",
        "--app-id", "spark-app", "--hostname", "127.1.2.4", "--resourceProfileId", "0",
        "--podName", "broker-validator-exec-2",
    ]  # fmt: skip
    assert executor_env["SPARK_LOCAL_IP"] == "127.1.2.4"
    assert command_for(["driver", "--store", "/s"], env)[0] == ["broker-validator", "--store", "/s"]
    with pytest.raises(EntrypointError, match="SPARK_DRIVER_URL"):
        command_for(["executor"], {"PATH": os.environ["PATH"]})


def rendered(cluster: LocalCluster, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    text = cluster.helm("template", RELEASE, str(CHART), "--set", "validator.enabled=true", *values).stdout
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(text) if doc}


def test_the_chart_runs_local_spark_without_pod_rights_and_refuses_a_missing_store(
    kube_cluster: LocalCluster,
) -> None:
    local = rendered(kube_cluster, "--set", f"validator.store.claimName={STORE_CLAIM}")
    container = local[("CronJob", CRONJOB)]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["args"][container["args"].index("--master") + 1] == "local[*]"
    assert ("ConfigMap", f"{CRONJOB}-executor") not in local
    rules = local[("Role", CRONJOB)]["rules"]
    assert [(rule["resources"], rule["verbs"]) for rule in rules] == [
        (["brokerclusters"], ["get", "list"]),
        (["brokerclusters/status"], ["patch"]),
    ]
    executors = rendered(
        kube_cluster, "--set", f"validator.store.claimName={STORE_CLAIM}", "--set", "validator.executors=2"
    )
    assert ("ConfigMap", f"{CRONJOB}-executor") in executors
    assert [rule["resources"] for rule in executors[("Role", CRONJOB)]["rules"]][-1] == [
        "pods",
        "services",
        "configmaps",
    ]
    refused = kube_cluster.helm(
        "template", RELEASE, str(CHART), "--set", "validator.enabled=true", check=False
    )
    assert refused.returncode != 0 and "validator.store.claimName must name" in refused.stderr


# ---- status.ordering on its own ------------------------------------------------------------


def synthetic_report(clusters: dict[str, tuple[str, int]]) -> Report:
    """A report with just what ``record_ordering`` reads: the time and each cluster's verdict."""
    return cast(
        Report,
        {
            "generatedAt": "2026-11-23T10:11:12.345678Z",
            "clusters": {
                name: {"result": result, "violations": violations}
                for name, (result, violations) in clusters.items()
            },
        },
    )


def token_client_factory(
    cluster: LocalCluster, namespace: str, account: str, path: Path
) -> Callable[[], kubernetes.client.ApiClient]:
    """An API client factory authenticating as ``namespace/account`` (a real bound token)."""
    token = cluster.kubectl("-n", namespace, "create", "token", account, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    write_kubeconfig(
        path, server=admin["server"], ca_cert=Path(admin["certificate-authority"]), user=account, token=token
    )
    return lambda: kubernetes.config.new_client_from_config(config_file=str(path))


def test_record_ordering_patches_only_status_ordering_and_warns_about_missing_clusters(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    manifest = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "alpha"},
        "spec": {"account": "acme", "company": "9000", "replicas": 1},
    }
    kube_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))
    # What the operator would have written; no operator watches this namespace.
    operator_status = {"phase": "Healthy", "active": "alpha-0", "epoch": 4, "failovers": 1}
    kube_cluster.kubectl(
        "-n", namespace, "patch", "bc", "alpha", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": operator_status}),
    )  # fmt: skip

    report = synthetic_report({"alpha": ("Passed", 0), "ghost": ("Failed", 2)})
    warnings = record_ordering(report, namespace, REPORT_LOCATION, api_client_factory=kube_cluster.api_client)

    assert len(warnings) == 1 and "'ghost'" in warnings[0] and namespace in warnings[0], warnings
    status = get_json(kube_cluster, namespace, "bc", "alpha")["status"]
    assert status["ordering"] == {
        "lastCheckTime": "2026-11-23T10:11:12Z",
        "result": "Passed",
        "violations": 0,
        "report": REPORT_LOCATION,
    }
    assert {key: status[key] for key in operator_status} == operator_status
    header, row = kube_cluster.kubectl("-n", namespace, "get", "bc", "alpha").stdout.splitlines()[:2]
    assert row.split()[header.split().index("ORDERING")] == "Passed"

    # A later verdict replaces the earlier one, field by field.
    record_ordering(
        synthetic_report({"alpha": ("Failed", 3)}),
        namespace,
        "elsewhere",
        api_client_factory=kube_cluster.api_client,
    )
    ordering = get_json(kube_cluster, namespace, "bc", "alpha")["status"]["ordering"]
    assert (ordering["result"], ordering["violations"], ordering["report"]) == ("Failed", 3, "elsewhere")

    # Without `patch` on brokerclusters/status the write is refused, and the error says what is missing.
    kube_cluster.kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    forbidden = token_client_factory(kube_cluster, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    with pytest.raises(
        OrderingStatusError, match=r"forbidden \(403\).*needs `patch` on brokerclusters/status"
    ):
        record_ordering(report, namespace, REPORT_LOCATION, api_client_factory=forbidden)


# ---- the CronJob end to end ------------------------------------------------------------------


def pod_log(cluster: LocalCluster, namespace: str, pod: dict[str, Any]) -> str:
    """A pod's container logs, read from the node agent's state directory (no kubelet API here)."""
    metadata = pod["metadata"]
    directory = cluster.state_dir / "pods" / f"{namespace}_{metadata['name']}_{metadata['uid']}" / "logs"
    return "\n".join(log.read_text(errors="replace") for log in sorted(directory.glob("*.log")))


def job_pods(cluster: LocalCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return list((get_json(cluster, namespace, "pods", "-l", f"job-name={job}") or {}).get("items", []))


def executor_pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return list((get_json(cluster, namespace, "pods", "-l", "spark-role=executor") or {}).get("items", []))


def job_condition(cluster: LocalCluster, namespace: str, job: str) -> dict[str, Any] | None:
    """The Job's Complete or Failed condition once it has one."""
    conditions = ((get_json(cluster, namespace, "job", job) or {}).get("status") or {}).get(
        "conditions"
    ) or []
    return next(
        (c for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None
    )


def run_validation(cluster: LocalCluster, namespace: str, job: str, started: float) -> dict[str, Any]:
    """Start a Job from the CronJob, see Spark's two executor pods run, wait for the Job to finish.

    Returns what was seen: the Job's final condition, the executor pods (as they were while
    running) and the driver pod. Fails with the driver's log when something does not happen.
    """
    cluster.kubectl("-n", namespace, "create", "job", f"--from=cronjob/{CRONJOB}", job)
    seen: dict[str, dict[str, Any]] = {}

    def executors_running() -> bool:
        for pod in executor_pods(cluster, namespace):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if any("running" in s.get("state", {}) for s in statuses):
                seen[pod["metadata"]["name"]] = pod
        return len(seen) >= 2 or job_condition(cluster, namespace, job) is not None

    def driver_log() -> str:
        return "\n".join(pod_log(cluster, namespace, p)[-6000:] for p in job_pods(cluster, namespace, job))

    try:
        wait_for(f"two executor pods of {job} running", executors_running, timeout=240, interval=0.5)
        if len(seen) < 2:
            pytest.fail(f"{job} finished with {len(seen)} executor pods seen running")
        say(started, f"{job}: executor pods running: {sorted(seen)}")
        condition = wait_for(
            f"Job {job} to finish", lambda: job_condition(cluster, namespace, job), timeout=480, interval=1
        )
    except pytest.fail.Exception:
        pytest.fail(f"{job} did not run as expected; driver log:\n{driver_log()}")
    say(started, f"{job}: {condition['type']} ({condition.get('reason', '')})")
    attempts = job_pods(cluster, namespace, job)
    if len(attempts) != 1:  # the Job retried: a run exited 2 ("could not validate")
        pytest.fail(f"{job} needed {len(attempts)} attempts; their logs:\n{driver_log()}")
    (driver,) = attempts
    return {"condition": condition, "executors": list(seen.values()), "driver": driver, "log": driver_log()}


def open_segments(store: Path) -> list[Path]:
    return [path for path in store.glob(f"*/*/*{OPEN_SEGMENT_SUFFIX}") if path.stat().st_size > 0]


def inject_duplicate_delivery(store: Path) -> dict[str, Any]:
    """Append a closed segment holding a second `delivered` record of an already delivered message.

    The copy keeps the newest delivery's epoch and broker (so it is no split brain) and gets a
    later ts: in target order it comes after the original, a second `ok` from the target.
    """
    newest: dict[str, Any] | None = None
    for segment in store.glob(f"{CLUSTER}/*/*{CLOSED_SEGMENT_SUFFIX}"):
        for line in segment.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "delivered" and (
                newest is None or (record["epoch"], record["ts"]) > (newest["epoch"], newest["ts"])
            ):
                newest = record
    assert newest is not None, f"no delivered record in {store / CLUSTER}"
    duplicate = {**newest, "ts": format_ts()}
    directory = store / CLUSTER / newest["broker"]
    name = segment_name(newest["broker"], datetime.now(UTC), 999_999)
    opened = directory / (name.removesuffix(CLOSED_SEGMENT_SUFFIX) + OPEN_SEGMENT_SUFFIX)
    opened.write_text(json.dumps(duplicate, separators=(",", ":")) + "\n")
    opened.rename(directory / name)  # closed with one rename, as brokers close theirs
    return duplicate


def ordering_of(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    return dict(
        ((get_json(cluster, namespace, "bc", CLUSTER) or {}).get("status") or {}).get("ordering") or {}
    )


def ordering_column(cluster: LocalCluster, namespace: str) -> str:
    header, row = cluster.kubectl("-n", namespace, "get", "bc", CLUSTER).stdout.splitlines()[:2]
    return row.split()[header.split().index("ORDERING")]


@pytest.mark.timeout(1200)
def test_the_cronjob_validates_a_failover_with_spark_executor_pods(  # noqa: PLR0915  (one story, told in order)
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    store = kube_cluster.state_dir / "claims" / namespace / STORE_CLAIM
    simulators: list[LocalProcess] = []
    installed = False
    try:
        # The shared store: one ReadWriteMany claim that the brokers and the validator mount (the
        # local provisioner binds it to one directory, <state-dir>/claims/<namespace>/<claim>).
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": STORE_CLAIM},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        kube_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(claim))
        kube_cluster.helm(
            "install", RELEASE, str(CHART),
            "--namespace", namespace,
            "--set", f"operator.watchNamespaces={{{namespace}}}",
            # Pods share this host's ports: the operator's must be free on it.
            "--set", f"operator.metricsPort={free_port()}",
            "--set", f"operator.healthPort={free_port()}",
            "--set", "validator.enabled=true",
            "--set", "validator.suspend=true",
            "--set", "validator.executors=2",
            "--set", "validator.executorMemory=512m",
            "--set", "validator.driverMemory=1g",
            "--set", f"validator.store.claimName={STORE_CLAIM}",
            "--wait", "--timeout=120s",
        )  # fmt: skip
        installed = True
        cronjob = get_json(kube_cluster, namespace, "cronjob", CRONJOB)["spec"]
        assert (cronjob["schedule"], cronjob["concurrencyPolicy"]) == ("*/15 * * * *", "Forbid")
        say(started, "chart installed (operator, validator CronJob, RBAC)")

        # Simulators: the cloud first; the backend needs the broker pods' addresses, and the
        # brokers the backend's, so the brokers read its URL from a Secret created once it runs
        # (until then their containers wait in CreateContainerConfigError, as on a real node).
        cloud_host, backend_host = loopback_host(), loopback_host()
        cloud_port, backend_port = free_port_on(cloud_host), free_port_on(backend_host)
        cloud_url, backend_url = f"http://{cloud_host}:{cloud_port}", f"http://{backend_host}:{backend_port}"
        simulators.append(
            LocalProcess(
                [
                    str(VENV_BIN / "cloud-simulator"), "--host", cloud_host, "--port", str(cloud_port),
                    "--inbound-streams", str(INBOUND_STREAMS),
                    "--inbound-messages-per-stream", str(PER_STREAM),
                ],
                tmp_path / "cloud.log",
            )
        )  # fmt: skip
        manifest = {
            "apiVersion": "broker.failover.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": CLUSTER},
            "spec": {
                "account": "acme",
                "company": "1000",
                "replicas": 3,
                "failback": "Manual",  # the active stays where the failover put it
                "backend": {"urlSecretRef": {"name": "backend-url"}},
                "cloud": {"url": cloud_url},
                "messageLog": {"claimName": STORE_CLAIM},
                # The backend's own credential: brokers refuse SendMessages without it.
                "auth": {"backendTokenSecretRef": {"name": "backend-token"}},
            },
        }
        backend_token = tmp_path / "backend-token"
        backend_token.write_text(uuid.uuid4().hex)
        kube_cluster.kubectl(
            "-n",
            namespace,
            "create",
            "secret",
            "generic",
            "backend-token",
            f"--from-file=token={backend_token}",
        )
        kube_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))

        def broker_ips() -> list[str] | None:
            ips = [
                ((get_json(kube_cluster, namespace, "pod", name) or {}).get("status") or {}).get("podIP")
                for name in BROKERS
            ]
            return [str(ip) for ip in ips] if all(ips) else None

        ips = wait_for("three broker pods with addresses", broker_ips, timeout=90)
        backend_argv = [
            str(VENV_BIN / "backend-simulator"), "--host", backend_host, "--port", str(backend_port),
            "--streams", str(STREAMS), "--messages-per-stream", str(PER_STREAM),
            "--bundle-size", "50", "--per-stream-in-bundle", "10", "--lanes", "2",
            "--backend-token-file", str(backend_token),
        ]  # fmt: skip
        for ip in ips:
            backend_argv += ["--broker-url", f"http://{ip}:8080"]
        simulators.append(LocalProcess(backend_argv, tmp_path / "backend.log"))
        wait_for(
            "simulators answering",
            lambda: answers(f"{cloud_url}/sim/status") and answers(f"{backend_url}/sim/status"),
        )
        kube_cluster.kubectl(
            "-n", namespace, "create", "secret", "generic", "backend-url", f"--from-literal=url={backend_url}"
        )

        def status() -> dict[str, Any]:
            return dict((get_json(kube_cluster, namespace, "bc", CLUSTER) or {}).get("status") or {})

        wait_for(
            f"{BROKERS[0]} active and the cluster Healthy",
            lambda: (s := status()).get("phase") == "Healthy" and s.get("active") == BROKERS[0],
            timeout=180,
        )
        say(started, f"{CLUSTER} Healthy with {BROKERS[0]} active; sending traffic")

        # Traffic both ways, a kill -9 of the active broker's container mid-way, a failover.
        (container,) = get_json(kube_cluster, namespace, "pod", BROKERS[0])["status"]["containerStatuses"]
        active_pgid = int(container["containerID"].removeprefix("local://"))
        http_json(f"{backend_url}/sim/start", {})
        total = STREAMS * PER_STREAM
        wait_for(
            "a third of the outbound traffic confirmed",
            lambda: int(http_json(f"{backend_url}/sim/status")["confirmed"]) >= total // 3,
            timeout=120,
            interval=0.05,
        )
        os.killpg(active_pgid, signal.SIGKILL)
        confirmed_at_kill = int(http_json(f"{backend_url}/sim/status")["confirmed"])
        say(started, f"kill -9 of {BROKERS[0]}'s container with {confirmed_at_kill} of {total} confirmed")
        assert confirmed_at_kill < total, "the traffic was over before the kill: send more"
        after = wait_for(
            "a failover away from the killed broker",
            lambda: (s := status()).get("active") not in (None, BROKERS[0]) and s,
            timeout=90,
        )
        say(started, f"failed over to {after['active']} (epoch {after.get('epoch')})")
        wait_for(
            "every message confirmed both ways",
            lambda: (
                bool(http_json(f"{backend_url}/sim/status")["allConfirmed"])
                and bool(http_json(f"{cloud_url}/sim/status")["inboundAllConfirmed"])
            ),
            timeout=240,
            interval=1,
        )
        # Brokers close a segment on an age bound (30 s); the killed one closed its leftover on restart.
        wait_for(
            "every message-log segment closed", lambda: not open_segments(store), timeout=120, interval=1
        )
        segments = sorted(store.glob(f"{CLUSTER}/*/*{CLOSED_SEGMENT_SUFFIX}"))
        assert segments, f"no closed segments in {store}"
        say(started, f"traffic done; {len(segments)} closed segments in the store")

        # Run 1: the CronJob's Job, Spark with two executor pods, the verdict in report and status.
        first_started = time.monotonic()
        first = run_validation(kube_cluster, namespace, "check-1", started)
        assert first["condition"]["type"] == "Complete", first["log"]
        driver_uid = first["driver"]["metadata"]["uid"]
        for executor in first["executors"]:
            owner = executor["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["uid"]) == ("Pod", driver_uid), executor["metadata"]
            assert executor["spec"]["automountServiceAccountToken"] is False
            (running,) = executor["status"]["containerStatuses"]
            assert running["containerID"].startswith("local://")  # a process the node agent runs
            log = pod_log(kube_cluster, namespace, executor)
            assert "KubernetesExecutorBackend" in log, log[-3000:]
        assert any("Finished task" in pod_log(kube_cluster, namespace, e) for e in first["executors"]), (
            "no task ran on an executor pod"
        )
        wait_for(
            "executor pods deleted when Spark stopped", lambda: not executor_pods(kube_cluster, namespace), 90
        )
        report = json.loads((store / ".validator" / "reports" / "report.json").read_text())
        assert (store / ".validator" / "reports" / "report.html").is_file()
        assert report["result"] == "Passed", json.dumps(report["anomalies"])
        assert report["clusters"][CLUSTER]["result"] == "Passed"
        ordering = ordering_of(kube_cluster, namespace)
        assert (ordering["result"], ordering["violations"], ordering["report"]) == (
            "Passed",
            0,
            REPORT_LOCATION,
        )
        assert ordering_column(kube_cluster, namespace) == "Passed"
        assert status()["active"] == after["active"]  # the operator's fields are untouched
        say(started, f"run 1 Passed in {time.monotonic() - first_started:.1f}s")

        # Run 2, incremental: only the injected segment is new; it holds one duplicate delivery.
        duplicate = inject_duplicate_delivery(store)
        second_started = time.monotonic()
        second = run_validation(kube_cluster, namespace, "check-2", started)
        # Exit 1 (violations) fails the Job at once through the podFailurePolicy: no retry.
        assert (second["condition"]["type"], second["condition"].get("reason")) == (
            "Failed",
            "PodFailurePolicy",
        )
        report = json.loads((store / ".validator" / "reports" / "report.json").read_text())
        assert report["result"] == "Failed"
        # Only what is new is read (the injected segment, and any a broker closed since).
        assert report["run"]["mode"] == "incremental", report["run"]
        assert 1 <= report["run"]["segmentsRead"] < len(segments) <= report["run"]["segmentsKnown"], report[
            "run"
        ]
        assert report["clusters"][CLUSTER]["anomalies"]["duplicate-delivery"] == 1, duplicate
        assert report["violations"] == 1
        ordering = ordering_of(kube_cluster, namespace)
        assert (ordering["result"], ordering["violations"]) == ("Failed", 1)
        assert ordering_column(kube_cluster, namespace) == "Failed"
        say(started, f"run 2 Failed with 1 violation in {time.monotonic() - second_started:.1f}s")
    finally:
        # The BrokerCluster first, while the operator that removes its finalizer still runs.
        kube_cluster.kubectl(
            "-n", namespace, "delete", "bc", "--all", "--wait=true", "--timeout=60s", check=False
        )
        if installed:
            kube_cluster.helm(
                "uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout=90s", check=False
            )
        for simulator in simulators:
            simulator.stop()
            print(f"--- {simulator.log.name}\n{simulator.tail()}")
        say(started, "torn down")
