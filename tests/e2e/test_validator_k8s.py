"""The ordering validator on Kubernetes: the chart's CronJob, Spark executor pods, status.ordering.

On the sealed cluster (docs/local-cluster.md): the real kubelet on containerd and runc runs the
images ``make images`` built. The chart is installed with the Go-built helm, the operator runs
in-cluster through the chart's RBAC, the SAP backend and the cloud are simulator pods
(``local_cluster.relay``), broker pods write their message-log segments into one shared
ReadWriteMany claim (of the ``shared-path`` class: a hostPath directory that local-path-provisioner
made, which this test finds through the bound PV and reads and writes from the machine), and the
CronJob's pod runs the validator image as the Spark driver. With ``validator.executors: 2`` the
driver asks the API server for two executor pods of the same image (``executor`` mode of
``broker_validator.entrypoint``), owned by the driver pod, each with the memory limit Spark gives it
(``executorMemory`` plus overhead), which runc sets as the container's cgroup limit; the test reads
it back there.

The CronJob is installed suspended, so its schedule cannot start a run beside the ones the test
starts with ``kubectl create job --from=cronjob/...`` (runs share the store's checkpoint).

``record_ordering`` (``broker_validator.status``) is also tested on its own against the API
server: the merge patch leaves the operator's status fields alone, a missing BrokerCluster is a
warning, and a service account without the right is refused with a message saying what it needs.

Waits are bounded failure limits, not performance assertions; the timings are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kubernetes
import pytest
import yaml

from broker_contracts.message_log import CLOSED_SEGMENT_SUFFIX, OPEN_SEGMENT_SUFFIX, format_ts, segment_name
from broker_validator.entrypoint import EntrypointError, command_for
from broker_validator.report_schema import Report
from broker_validator.spark import SparkSettings, SparkSettingsError, kubernetes_conf, local_conf
from broker_validator.status import OrderingStatusError, record_ordering
from local_cluster.cluster import REPO_ROOT, ClusterAccess
from local_cluster.pki import write_kubeconfig
from local_cluster.relay import CLUSTER_NAME, MESSAGE_LOG_CLAIM, Relay, deploy_relay
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import installed_crd, wait_for

pytestmark = pytest.mark.e2e

CHART = REPO_ROOT / "charts" / "broker-failover"
RELEASE = "bf"
CRONJOB = f"{RELEASE}-broker-failover-validator"  # in the render-only tests
STORE_CLAIM = MESSAGE_LOG_CLAIM  # the example BrokerCluster's spec.messageLog.claimName
CLUSTER = CLUSTER_NAME  # the example's BrokerCluster, "orders"
BROKERS = [f"{CLUSTER}-{ordinal}" for ordinal in range(3)]
REPORT_LOCATION = f"pvc/{STORE_CLAIM}/.validator/reports/report.html"
STREAMS, PER_STREAM = 4, 4000  # each way: the cloud sends as many streams inbound
VALIDATOR_IMAGE = "broker-failover/validator"  # imported into the node on demand (1.3 GB)
EXECUTOR_MEMORY = "512m"


def say(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)


# ---- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    """The CRD, applied here (helm skips a CRD that exists, even one being deleted by another module)."""
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture
def namespace(sealed_cluster: SealedCluster, crd: None) -> Iterator[str]:
    name = f"validator-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    wait_for("default ServiceAccount", lambda: sealed_cluster.get_json(name, "serviceaccount", "default"))
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


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


def rendered(cluster: ClusterAccess, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    text = cluster.helm("template", RELEASE, str(CHART), "--set", "validator.enabled=true", *values).stdout
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(text) if doc}


def test_the_chart_runs_local_spark_without_pod_rights_and_refuses_a_missing_store(
    sealed_cluster: SealedCluster,
) -> None:
    local = rendered(sealed_cluster, "--set", f"validator.store.claimName={STORE_CLAIM}")
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
        sealed_cluster, "--set", f"validator.store.claimName={STORE_CLAIM}", "--set", "validator.executors=2"
    )
    assert ("ConfigMap", f"{CRONJOB}-executor") in executors
    assert [rule["resources"] for rule in executors[("Role", CRONJOB)]["rules"]][-1] == [
        "pods",
        "services",
        "configmaps",
    ]
    refused = sealed_cluster.helm(
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
    cluster: ClusterAccess, namespace: str, account: str, path: Path
) -> Callable[[], kubernetes.client.ApiClient]:
    """An API client factory authenticating as ``namespace/account`` (a real bound token)."""
    token = cluster.kubectl("-n", namespace, "create", "token", account, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    write_kubeconfig(
        path, server=admin["server"], ca_cert=Path(admin["certificate-authority"]), user=account, token=token
    )
    return lambda: kubernetes.config.new_client_from_config(config_file=str(path))


def test_record_ordering_patches_only_status_ordering_and_warns_about_missing_clusters(
    sealed_cluster: SealedCluster, namespace: str, tmp_path: Path
) -> None:
    manifest = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "alpha"},
        "spec": {"account": "acme", "company": "9000", "replicas": 1},
    }
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(manifest))
    # What the operator would have written; no operator watches this namespace.
    operator_status = {"phase": "Healthy", "active": "alpha-0", "epoch": 4, "failovers": 1}
    sealed_cluster.kubectl(
        "-n", namespace, "patch", "bc", "alpha", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": operator_status}),
    )  # fmt: skip

    report = synthetic_report({"alpha": ("Passed", 0), "ghost": ("Failed", 2)})
    warnings = record_ordering(
        report, namespace, REPORT_LOCATION, api_client_factory=sealed_cluster.api_client
    )

    assert len(warnings) == 1 and "'ghost'" in warnings[0] and namespace in warnings[0], warnings
    status = sealed_cluster.get_json(namespace, "bc", "alpha")["status"]
    assert status["ordering"] == {
        "lastCheckTime": "2026-11-23T10:11:12Z",
        "result": "Passed",
        "violations": 0,
        "report": REPORT_LOCATION,
    }
    assert {key: status[key] for key in operator_status} == operator_status
    header, row = sealed_cluster.kubectl("-n", namespace, "get", "bc", "alpha").stdout.splitlines()[:2]
    assert row.split()[header.split().index("ORDERING")] == "Passed"

    # A later verdict replaces the earlier one, field by field.
    record_ordering(
        synthetic_report({"alpha": ("Failed", 3)}),
        namespace,
        "elsewhere",
        api_client_factory=sealed_cluster.api_client,
    )
    ordering = sealed_cluster.get_json(namespace, "bc", "alpha")["status"]["ordering"]
    assert (ordering["result"], ordering["violations"], ordering["report"]) == ("Failed", 3, "elsewhere")

    # Without `patch` on brokerclusters/status the write is refused, and the error says what is missing.
    sealed_cluster.kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    forbidden = token_client_factory(sealed_cluster, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    with pytest.raises(
        OrderingStatusError, match=r"forbidden \(403\).*needs `patch` on brokerclusters/status"
    ):
        record_ordering(report, namespace, REPORT_LOCATION, api_client_factory=forbidden)


# ---- the CronJob end to end ------------------------------------------------------------------


def pod_log(cluster: SealedCluster, pod: dict[str, Any]) -> str:
    """A pod's container logs as the kubelet wrote them (``<pod logs>/<ns>_<name>_<uid>/<container>/
    N.log``, on the machine's file system); empty once the kubelet removed a deleted pod's."""
    metadata = pod["metadata"]
    directory = cluster.pod_logs / f"{metadata['namespace']}_{metadata['name']}_{metadata['uid']}"
    texts = []
    for log in sorted(directory.glob("*/*.log")):
        with contextlib.suppress(OSError):  # removed meanwhile, with its pod
            texts.append(log.read_text(errors="replace"))
    return "\n".join(texts)


def job_pods(cluster: ClusterAccess, namespace: str, job: str) -> list[dict[str, Any]]:
    return list((cluster.get_json(namespace, "pods", "-l", f"job-name={job}") or {}).get("items", []))


def executor_pods(cluster: ClusterAccess, namespace: str) -> list[dict[str, Any]]:
    return list((cluster.get_json(namespace, "pods", "-l", "spark-role=executor") or {}).get("items", []))


def job_condition(cluster: ClusterAccess, namespace: str, job: str) -> dict[str, Any] | None:
    """The Job's Complete or Failed condition once it has one."""
    conditions = ((cluster.get_json(namespace, "job", job) or {}).get("status") or {}).get("conditions") or []
    return next(
        (c for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None
    )


QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|k|M|G)?$")
UNITS = {None: 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1000, "M": 1000**2, "G": 1000**3}


def quantity_bytes(quantity: str) -> int:
    """A memory quantity as Spark writes it into a pod spec (``896Mi``), in bytes."""
    match = QUANTITY.match(quantity)
    assert match, f"unexpected memory quantity {quantity!r}"
    return int(match[1]) * UNITS[match[2]]


def container_memory_limit(cluster: SealedCluster, pod: dict[str, Any]) -> int:
    """The memory limit runc set on the pod's running container: ``memory.limit_in_bytes`` of its
    cgroup in the v1 memory hierarchy (the node's cgroupfs driver), found through /proc of its
    main process in the cluster's PID namespace."""
    pid = cluster.container_pid(pod)
    cgroups = subprocess.run(
        cluster.node_command(["cat", f"/proc/{pid}/cgroup"]),
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    (path,) = [line.split(":", 2)[2] for line in cgroups.splitlines() if line.split(":")[1] == "memory"]
    return int(Path(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes").read_text())


def run_validation(
    cluster: SealedCluster, namespace: str, cronjob: str, job: str, started: float
) -> dict[str, Any]:
    """Start a Job from the CronJob, see Spark's two executor pods run, wait for the Job to finish.

    Returns what was seen: the Job's final condition, the executor pods (as they were while
    running), their logs and their containers' cgroup memory limits (read while they ran: Spark
    deletes them when it stops, and the kubelet their logs with them), and the driver pod. Fails
    with the driver's log when something does not happen.
    """
    cluster.kubectl("-n", namespace, "create", "job", f"--from=cronjob/{cronjob}", job)
    seen: dict[str, dict[str, Any]] = {}
    logs: dict[str, str] = {}
    limits: dict[str, int] = {}

    def look() -> None:
        for pod in executor_pods(cluster, namespace):
            name = pod["metadata"]["name"]
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if not any("running" in s.get("state", {}) for s in statuses):
                continue
            seen[name] = pod
            if text := pod_log(cluster, pod):
                logs[name] = text
            if name not in limits:
                try:
                    limits[name] = container_memory_limit(cluster, pod)
                except (subprocess.SubprocessError, OSError, ValueError) as error:
                    print(f"{name}: cgroup not read yet ({error})", flush=True)

    def executors_running() -> bool:
        look()
        return len(seen) >= 2 or job_condition(cluster, namespace, job) is not None

    def finished() -> dict[str, Any] | None:
        look()  # the executors' logs grow until Spark deletes them
        return job_condition(cluster, namespace, job)

    def driver_log() -> str:
        return "\n".join(pod_log(cluster, p)[-6000:] for p in job_pods(cluster, namespace, job))

    try:
        wait_for(f"two executor pods of {job} running", executors_running, timeout=240, interval=0.5)
        if len(seen) < 2:
            pytest.fail(f"{job} finished with {len(seen)} executor pods seen running")
        say(started, f"{job}: executor pods running: {sorted(seen)}")
        condition = wait_for(f"Job {job} to finish", finished, timeout=480, interval=0.5)
    except pytest.fail.Exception:
        pytest.fail(f"{job} did not run as expected; driver log:\n{driver_log()}")
    say(started, f"{job}: {condition['type']} ({condition.get('reason', '')})")
    attempts = job_pods(cluster, namespace, job)
    if len(attempts) != 1:  # the Job retried: a run exited 2 ("could not validate")
        pytest.fail(f"{job} needed {len(attempts)} attempts; their logs:\n{driver_log()}")
    (driver,) = attempts
    return {
        "condition": condition,
        "executors": list(seen.values()),
        "executor_logs": logs,
        "memory_limits": limits,
        "driver": driver,
        "log": driver_log(),
    }


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
    opened.chmod(0o644)  # written by this (root) process; the validator reads it as 10001
    opened.rename(directory / name)  # closed with one rename, as brokers close theirs
    return duplicate


def ordering_of(cluster: ClusterAccess, namespace: str) -> dict[str, Any]:
    return dict(
        ((cluster.get_json(namespace, "bc", CLUSTER) or {}).get("status") or {}).get("ordering") or {}
    )


def ordering_column(cluster: ClusterAccess, namespace: str) -> str:
    """The ORDERING column of ``kubectl get bc``, read at its header's offset: a column left empty
    meanwhile (ACTIVE while the operator fails over) would shift a whitespace split."""
    header, row = cluster.kubectl("-n", namespace, "get", "bc", CLUSTER).stdout.splitlines()[:2]
    return row[header.index("ORDERING") :].split()[0]


def deploy(cluster: SealedCluster, namespace: str) -> Relay:
    """The chart (operator and the validator's CronJob, suspended, two executors), the simulator
    pods and the example BrokerCluster with three brokers, Healthy (``relay.deploy_relay``)."""
    return deploy_relay(
        cluster,
        namespace,
        streams=STREAMS,
        messages_per_stream=PER_STREAM,
        bundle_size=50,
        lanes=2,
        helm_values={
            "validator.enabled": "true",
            "validator.suspend": "true",
            "validator.executors": "2",
            "validator.executorMemory": EXECUTOR_MEMORY,
            "validator.driverMemory": "1g",
            "validator.store.claimName": STORE_CLAIM,
            # A quarter CPU per executor pod instead of executorCores (1): the sealed cluster is
            # one node with 2 allocatable CPUs, and the real scheduler puts the driver (500m), the
            # operator, CoreDNS and the brokers there first, so of two executors asking for a
            # whole CPU each only one would fit (the other Pending, "Insufficient cpu").
            r"validator.sparkConf.spark\.kubernetes\.executor\.request\.cores": "250m",
        },
        # Three brokers; the active stays where the failover put it. A CPU request keeps them out
        # of the BestEffort class (the example sets none): on the real kubelet a BestEffort pod gets
        # 2 CPU shares, and the validator's JVMs beside it starved the brokers past their liveness
        # probes on this 2-core machine.
        spec={
            "replicas": 3,
            "failback": "Manual",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    )


@pytest.mark.timeout(1200)
def test_the_cronjob_validates_a_failover_with_spark_executor_pods(  # noqa: PLR0915  (one story, told in order)
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    cluster = sealed_cluster
    started = time.monotonic()
    relay: Relay | None = None
    # The validator's image is imported (half a minute) while the rest is deployed and runs.
    with ThreadPoolExecutor(1, thread_name_prefix="validator-image") as pool:
        importing = pool.submit(cluster.ensure_images, [VALIDATOR_IMAGE])
        try:
            relay = deploy(cluster, namespace)
            # Where the provisioner put the store: the bound PV's path, as the pods mount it.
            store = cluster.claim_volume_path(namespace, STORE_CLAIM)
            cronjob_name = f"{relay.release}-broker-failover-validator"
            cronjob = cluster.get_json(namespace, "cronjob", cronjob_name)["spec"]
            assert (cronjob["schedule"], cronjob["concurrencyPolicy"]) == ("*/15 * * * *", "Forbid")
            (container,) = cronjob["jobTemplate"]["spec"]["template"]["spec"]["containers"]
            env = {item["name"]: item.get("value") for item in container["env"]}
            assert env["VALIDATOR_SPARK_CONF"] == "spark.kubernetes.executor.request.cores=250m"
            status = relay.status
            # Usually orders-0 (priority 0); a broker that was slow to answer its first heartbeats is
            # passed over, and with failback Manual the active stays where the operator put it.
            first_active = str(status()["active"])
            assert first_active in BROKERS, status()
            say(
                started,
                f"chart, simulator pods, {CLUSTER} Healthy with {first_active} active; sending traffic",
            )

            # Traffic both ways, a kill -9 of the active broker's container mid-way, a failover.
            relay.backend("/sim/start", {})
            total = STREAMS * PER_STREAM
            wait_for(
                "a third of the outbound traffic confirmed",
                lambda: int(relay.backend("/sim/status")["confirmed"]) >= total // 3,
                timeout=120,
                interval=0.05,
            )
            relay.kill_9(first_active)
            confirmed_at_kill = int(relay.backend("/sim/status")["confirmed"])
            say(
                started,
                f"kill -9 of {first_active}'s container with {confirmed_at_kill} of {total} confirmed",
            )
            assert confirmed_at_kill < total, "the traffic was over before the kill: send more"
            after = wait_for(
                "a failover away from the killed broker",
                lambda: (s := status()).get("active") not in (None, first_active) and s,
                timeout=90,
            )
            say(started, f"failed over to {after['active']} (epoch {after.get('epoch')})")
            relay.wait_all_confirmed(timeout=240)
            # Brokers close a segment on an age bound (30 s); the killed one closed its leftover on restart.
            wait_for(
                "every message-log segment closed", lambda: not open_segments(store), timeout=120, interval=1
            )
            segments = sorted(store.glob(f"{CLUSTER}/*/*{CLOSED_SEGMENT_SUFFIX}"))
            assert segments, f"no closed segments in {store}"
            say(started, f"traffic done; {len(segments)} closed segments in the store")
            importing.result(timeout=600)

            # Run 1: the CronJob's Job, Spark with two executor pods, the verdict in report and status.
            first_started = time.monotonic()
            first = run_validation(cluster, namespace, cronjob_name, "check-1", started)
            assert first["condition"]["type"] == "Complete", first["log"]
            driver_uid = first["driver"]["metadata"]["uid"]
            for executor in first["executors"]:
                name = executor["metadata"]["name"]
                owner = executor["metadata"]["ownerReferences"][0]
                assert (owner["kind"], owner["uid"]) == ("Pod", driver_uid), executor["metadata"]
                assert executor["spec"]["automountServiceAccountToken"] is False
                # The validator's image, run by containerd for the kubelet.
                (container,) = executor["spec"]["containers"]
                (running,) = executor["status"]["containerStatuses"]
                assert VALIDATOR_IMAGE in container["image"] and VALIDATOR_IMAGE in running["image"], running
                assert running["containerID"].startswith("containerd://"), running
                # Under a memory limit: Spark's (executorMemory plus its overhead) in the spec,
                # and the same number in the container's cgroup.
                resources = container["resources"]
                limit = quantity_bytes(resources["limits"]["memory"])
                assert limit == quantity_bytes(resources["requests"]["memory"]), resources
                assert limit >= quantity_bytes(EXECUTOR_MEMORY.replace("m", "Mi")), resources
                assert first["memory_limits"].get(name) == limit, (name, first["memory_limits"], resources)
                log = first["executor_logs"].get(name, "")
                assert "KubernetesExecutorBackend" in log, log[-3000:]
            assert any("Finished task" in log for log in first["executor_logs"].values()), (
                "no task ran on an executor pod"
            )
            say(
                started, f"executor pods ran the validator image under memory limits {first['memory_limits']}"
            )
            wait_for(
                "executor pods deleted when Spark stopped", lambda: not executor_pods(cluster, namespace), 90
            )
            report = json.loads((store / ".validator" / "reports" / "report.json").read_text())
            assert (store / ".validator" / "reports" / "report.html").is_file()
            assert report["result"] == "Passed", json.dumps(report["anomalies"])
            assert report["clusters"][CLUSTER]["result"] == "Passed"
            ordering = ordering_of(cluster, namespace)
            assert (ordering["result"], ordering["violations"], ordering["report"]) == (
                "Passed",
                0,
                REPORT_LOCATION,
            )
            assert ordering_column(cluster, namespace) == "Passed"
            # The operator's fields are untouched: the active changes only with a new epoch, which
            # only the operator writes (a broker starved by a loaded machine may fail over again).
            now = status()
            assert now.get("phase") and now.get("active"), now
            assert (now["active"], now["epoch"]) == (after["active"], after["epoch"]) or now["epoch"] > after[
                "epoch"
            ], (now, after)
            first_run = report["run"]
            say(started, f"run 1 Passed in {time.monotonic() - first_started:.1f}s")

            # Run 2, incremental: only the injected segment is new; it holds one duplicate delivery.
            duplicate = inject_duplicate_delivery(store)
            second_started = time.monotonic()
            second = run_validation(cluster, namespace, cronjob_name, "check-2", started)
            # Exit 1 (violations) fails the Job at once through the podFailurePolicy: no retry.
            assert (second["condition"]["type"], second["condition"].get("reason")) == (
                "Failed",
                "PodFailurePolicy",
            )
            report = json.loads((store / ".validator" / "reports" / "report.json").read_text())
            assert report["result"] == "Failed"
            # Only what is new is read (the injected segment, and any a broker closed since).
            assert report["run"]["mode"] == "incremental", report["run"]
            assert 1 <= report["run"]["segmentsRead"] < first_run["segmentsRead"], (first_run, report["run"])
            assert report["run"]["segmentsKnown"] > first_run["segmentsKnown"], (first_run, report["run"])
            assert report["clusters"][CLUSTER]["anomalies"]["duplicate-delivery"] == 1, duplicate
            assert report["violations"] == 1
            ordering = ordering_of(cluster, namespace)
            assert (ordering["result"], ordering["violations"]) == ("Failed", 1)
            assert ordering_column(cluster, namespace) == "Failed"
            say(started, f"run 2 Failed with 1 violation in {time.monotonic() - second_started:.1f}s")
        finally:
            # The BrokerCluster first, while the operator that removes its finalizer still runs.
            cluster.kubectl(
                "-n", namespace, "delete", "bc", "--all", "--wait=true", "--timeout=60s", check=False
            )
            # Also when deploy_relay failed half-way (its release is named so).
            release = relay.release if relay is not None else f"bf-{namespace}"
            cluster.helm(
                "uninstall", release, "--namespace", namespace, "--wait", "--timeout=90s", check=False
            )
            say(started, "torn down")
