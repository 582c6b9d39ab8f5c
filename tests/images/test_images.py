"""The images ``make images`` builds, run by containerd and runc as the chart runs them, without a
kubelet: the images' own contract (entry points, users, what they write) and the build's errors.

Each container runs in a sealed namespace (``SealedContainerd``) with the security settings the
operator gives it: the image's non-root user, a read-only root file system, every capability
dropped, no privilege escalation, the runtime's seccomp profile, and its volumes bound at their
mount paths, from the operator's own pod builder. The operator's image and the validator's as a
driver run as pods of the sealed cluster's real kubelet (every ``sealed_cluster`` test runs the
chart's operator; ``make demo`` runs the validator's CronJob), so they are not repeated here.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from broker_operator.controller import builders, names, verifiers
from broker_operator.controller.spec import parse_spec
from broker_operator.engine import BrokerTarget, HeartbeatClient
from local_cluster.containerd_sandbox import BRIDGE_ADDRESS, ContainerdError, Volume
from local_cluster.image_archives import archive_for
from local_cluster.image_build import ImageBuildError
from local_cluster.image_build import main as image_build_main
from tests.e2e.support import wait_for
from tests.images.conftest import ImageRunner

UID = 10001
TOKEN = "image-test-operator-token"
BACKEND_TOKEN = "image-test-backend-token"
STREAMS, MESSAGES = 4, 50
CLUSTER = "acme-1000"


def owned_dir(path: Path, mode: int = 0o755) -> Path:
    """A volume as fsGroup leaves it: owned by the pod's user."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, UID, UID)
    path.chmod(mode)
    return path


def secret_dir(path: Path, files: dict[str, str]) -> Path:
    """A Secret volume: ``files`` (key to content) the pod's user can read."""
    path.mkdir(parents=True, exist_ok=True)
    for key, value in files.items():
        (path / key).write_text(value + "\n")
        (path / key).chmod(0o444)
    return path


def http_get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def probe_get(images: ImageRunner, url: str) -> bytes | None:
    """GET ``url`` from inside the sealed network; None while nothing answers yet."""

    def get() -> bytes | None:
        try:
            return http_get(url, timeout=2)
        except OSError:
            return None

    return images.sandbox.call_in_network(get)


def pod_env(
    container: Mapping[str, Any], pod_name: str, pod_ip: str, namespace: str = "default"
) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (values and the downward API)."""
    fields = {"status.podIP": pod_ip, "metadata.name": pod_name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def assert_enforced(images: ImageRunner, name: str, security: Mapping[str, Any]) -> None:
    """What the securityContext asks, read back from the running container (runc enforced it)."""
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    status = images.sandbox.process_status(name)
    assert status["Uid"].split()[:2] == [str(UID), str(UID)], status["Uid"]
    assert status["Gid"].split()[0] == str(UID), status["Gid"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # filter mode: the runtime's default profile


# --- the broker and the simulators --------------------------------------------------------------


class RelayRun:
    """Cloud and backend simulators and one broker from their images, heartbeated to Active."""

    def __init__(self, images: ImageRunner, root: Path) -> None:
        self.images = images
        self.root = root
        sandbox = images.sandbox
        self.broker_ip = sandbox.network("broker-0")
        self.backend_ip = sandbox.network("backend")
        self.cloud_ip = sandbox.network("cloud")
        self.data = owned_dir(root / "journal")
        self.message_log = owned_dir(root / "message-log", 0o775)
        spec = parse_spec(
            CLUSTER,
            {
                "account": "acme",
                "company": "1000",
                "backend": {"url": f"http://{self.backend_ip}:8081"},
                "cloud": {"url": f"http://{self.cloud_ip}:8082"},
                "heartbeat": {"leaseSeconds": 30},
            },
        )
        self.container = builders.broker_container(CLUSTER, spec)
        self.pod_security = builders.pod_security_context(spec)
        self.volumes = {
            names.JOURNAL_VOLUME: self.data,
            names.MESSAGE_LOG_VOLUME: self.message_log,
            # What the operator's <cluster>-broker-verifiers holds: the tokens' verifiers, no token.
            names.VERIFIER_VOLUME: secret_dir(
                root / "verifiers", verifiers.verifier_data(TOKEN, BACKEND_TOKEN)
            ),
        }

    def start(self) -> None:
        images, sandbox = self.images, self.images.sandbox
        cloud = images.prepare("cloud-simulator")
        sandbox.run(
            "cloud",
            cloud,
            ["--host", "0.0.0.0", "--port", "8082", "--record-dir", "/tmp/records"],
            entrypoint=images.entrypoint("cloud-simulator"),
            volumes=[Volume(owned_dir(self.root / "cloud-tmp"), "/tmp")],
        )
        backend = images.prepare("backend-simulator")
        backend_secret = secret_dir(self.root / "backend-secret", {names.TOKEN_FILE_KEY: BACKEND_TOKEN})
        sandbox.run(
            "backend",
            backend,
            [
                "--host",
                "0.0.0.0",
                "--port",
                "8081",
                "--broker-url",
                f"http://{self.broker_ip}:{names.BROKER_PORT}",
                "--streams",
                str(STREAMS),
                "--messages-per-stream",
                str(MESSAGES),
                "--backend-token-file",
                "/etc/backend/token",
                "--record-dir",
                "/tmp/records",
            ],
            entrypoint=images.entrypoint("backend-simulator"),
            volumes=[
                Volume(owned_dir(self.root / "backend-tmp"), "/tmp"),
                Volume(backend_secret, "/etc/backend", read_only=True),
            ],
        )
        broker = images.prepare("broker")
        mounts = [
            Volume(self.volumes[mount["name"]], mount["mountPath"], bool(mount.get("readOnly")))
            for mount in self.container["volumeMounts"]
        ]
        sandbox.run(
            "broker-0", broker, env=pod_env(self.container, "broker-0", self.broker_ip), volumes=mounts
        )

    @property
    def main_url(self) -> str:
        return f"http://{self.broker_ip}:{names.BROKER_PORT}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.broker_ip}:{names.BROKER_ADMIN_PORT}"

    def heartbeat(self, active: bool, epoch: int) -> str:
        async def call() -> str:
            client = HeartbeatClient(TOKEN, "image-test", 5.0)
            try:
                reply = await client.heartbeat(
                    BrokerTarget("broker-0", self.admin_url + "/soap", 0), active, epoch
                )
            finally:
                await client.close()
            return str(reply.state)

        return self.images.sandbox.call_in_network(lambda: asyncio.run(call()))

    def received(self) -> dict[str, list[int]]:
        raw = probe_get(self.images, f"http://{self.cloud_ip}:8082/sim/received")
        return json.loads(raw) if raw else {}


@pytest.fixture(scope="module")
def relay(images: ImageRunner, tmp_path_factory: pytest.TempPathFactory) -> RelayRun:
    run = RelayRun(images, tmp_path_factory.mktemp("relay"))
    run.start()
    for name, url in (("broker", run.main_url + "/readyz"), ("cloud", f"http://{run.cloud_ip}:8082/healthz")):
        wait_for(f"{name} answering at {url}", lambda url=url: probe_get(images, url), 60)
    return run


def test_broker_serves_its_wsdl_and_goes_active_on_a_heartbeat(relay: RelayRun, images: ImageRunner) -> None:
    wsdl = probe_get(images, relay.admin_url + "/soap?wsdl")
    assert wsdl is not None and b"Heartbeat" in wsdl and b"definitions" in wsdl
    state = wait_for(
        "the broker Active after active=true", lambda: relay.heartbeat(True, 1) == "Active", 30, 0.5
    )
    assert state
    assert_enforced(images, "broker-0", relay.container["securityContext"])
    assert relay.pod_security["runAsUser"] == UID and relay.pod_security["runAsNonRoot"] is True


def test_simulator_images_take_traffic_through_the_broker_image(relay: RelayRun, images: ImageRunner) -> None:
    wait_for("the broker Active", lambda: relay.heartbeat(True, 1) == "Active", 30, 0.5)
    started = images.sandbox.call_in_network(
        lambda: (
            urllib.request.urlopen(
                urllib.request.Request(
                    f"http://{relay.backend_ip}:8081/sim/start", data=b"{}", method="POST"
                ),
                timeout=5,
            ).status
        )
    )
    assert started == 200
    expected = list(range(1, MESSAGES + 1))

    def all_delivered() -> bool:
        received = relay.received()
        return len(received) == STREAMS and all(seqs == expected for seqs in received.values())

    wait_for("every message at the cloud, in order, once", all_delivered, 90, 0.5)
    for name in ("backend", "cloud"):
        assert_enforced(images, name, builders.DEFAULT_CONTAINER_SECURITY_CONTEXT)


def test_broker_writes_only_its_volumes(relay: RelayRun, images: ImageRunner) -> None:
    wait_for("the broker Active", lambda: relay.heartbeat(True, 1) == "Active", 30, 0.5)
    journal = [p for p in relay.data.rglob("*") if p.is_file()]
    assert journal, f"nothing written to the journal volume {relay.data}"
    assert all(p.stat().st_uid == UID for p in journal), [(p, p.stat().st_uid) for p in journal]
    segments = [p for p in relay.message_log.rglob("*") if p.is_file()]
    assert segments, "no message-log segment on the message-log volume"
    assert any(b'"activated"' in p.read_bytes() for p in segments)
    for target in ("/probe", "/opt/venv/probe", "/app/probe"):
        result = images.sandbox.exec("broker-0", ["python", "-c", f"open({target!r}, 'w')"])
        assert result.returncode != 0
        assert "Read-only file system" in result.stderr + result.stdout, result


# --- the validator ------------------------------------------------------------------------------


def test_validator_image_as_executor_starts_the_spark_executor_backend(
    images: ImageRunner, tmp_path: Path
) -> None:
    """No driver listens: the JVM must start Spark's executor backend and try the driver's URL."""
    validator = images.prepare("validator")
    address = images.sandbox.network("validator-executor")
    driver_url = f"spark://CoarseGrainedScheduler@{BRIDGE_ADDRESS}:7078"
    env = {
        "SPARK_DRIVER_URL": driver_url,
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-image-test",
        "SPARK_EXECUTOR_POD_IP": address,
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "validator-exec-1",
        "SPARK_EXECUTOR_MEMORY": "512m",
    }
    images.sandbox.run(
        "validator-executor",
        validator,
        ["executor"],
        entrypoint=images.entrypoint("validator"),
        env=env,
        volumes=[Volume(owned_dir(tmp_path / "tmp"), "/tmp")],
    )
    logs = wait_for(
        "the executor backend's log naming the driver",
        lambda: (
            (text := images.sandbox.logs("validator-executor")) and driver_url.split("@")[1] in text and text
        ),
        120,
        0.5,
    )
    assert "KubernetesExecutorBackend" in logs or "CoarseGrainedExecutorBackend" in logs, logs[-3000:]


# --- build errors ------------------------------------------------------------------------------


def test_a_broken_dockerfile_fails_with_its_step_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], built_images: object
) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM debian:bookworm-slim\nRUN echo about to fail && ls /no/such/directory\nRUN true\n"
    )
    code = image_build_main(
        ["--dockerfile", f"broker-failover/broken={dockerfile}", "--context", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    assert "RUN echo about to fail" in err  # the failing step
    assert "No such file or directory" in err  # and its output
    assert "full log:" in err


def test_an_image_never_built_is_a_clear_error(images: ImageRunner) -> None:
    with pytest.raises(ContainerdError, match="make images"):
        images.sandbox.run("ghost", "localhost/broker-failover/never-built:0.1.0")
    with pytest.raises(ImageBuildError, match="not one that `make images` builds"):
        archive_for("localhost/broker-failover/never-built:0.1.0")


def test_a_second_build_with_nothing_changed_rebuilds_nothing(built_images: dict[str, Any]) -> None:
    before = {slug: (image.key, image.archive.stat().st_mtime_ns) for slug, image in built_images.items()}
    code = image_build_main([])
    assert code == 0
    after = {slug: (image.key, image.archive.stat().st_mtime_ns) for slug, image in built_images.items()}
    assert after == before
