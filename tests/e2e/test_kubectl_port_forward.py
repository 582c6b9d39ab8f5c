"""``kubectl port-forward`` against the sealed cluster: kubectl, the API server, the real kubelet.

The real kubectl (v1.32: WebSocket) reaches the real API server through the loopback
forwarder; the API server tunnels SPDY to the kubelet's ``/portForward``, and containerd's CRI
connects inside the pod's network namespace. The pod's server listens on 127.0.0.1 only, so
nothing but a connection made inside its namespace can reach it: an answer proves where the
kubelet side connected.

Covered: ``pod/NAME`` with a random local port, two connections through one kubectl (two
stream pairs), ``svc/NAME`` (kubectl maps the Service port to the pod's targetPort), a
port nothing listens on (the kubelet's error reaches kubectl's stderr), and what
docs/kubectl-plugin.md tells a user to do: ``kubectl broker held list --url`` through a
forward of a real broker pod's admin port (a BrokerCluster in endpoints mode, no operator:
the plugin needs the object and the token Secret, the broker needs nothing else).

Traffic: only 127.0.0.1 on this machine and addresses inside the cluster's namespaces. Every
kubectl started here is stopped here; waits are failure limits.
"""

from __future__ import annotations

import contextlib
import json
import re
import selectors
import subprocess
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from broker_contracts.token_verifier import token_verifier
from local_cluster.cluster import REPO_ROOT
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import PYTHON_IMAGE, installed_crd, wait_for

pytestmark = pytest.mark.e2e

# Answers with its pod's name, on 127.0.0.1 only: unreachable from the node, or another pod.
LOOPBACK_SERVER = textwrap.dedent(
    """
    import http.server, os
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.reply((os.environ["HOSTNAME"] + " " + self.path).encode())
        def do_POST(self):  # echo, reversed: bytes really went to the pod and back
            self.reply(self.rfile.read(int(self.headers["Content-Length"]))[::-1])
        def reply(self, body):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.ThreadingHTTPServer(("127.0.0.1", 8080), Hello).serve_forever()
    """
)
# Readiness from inside the pod (exec probes run there): the node cannot reach 127.0.0.1 of the pod.
READY = "import socket; socket.create_connection(('127.0.0.1', 8080), timeout=1).close()"
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 direct, always
VENV_BIN = REPO_ROOT / ".venv" / "bin"
OPERATOR_TOKEN = "port-forward-test-operator-token"


@pytest.fixture
def namespace(sealed_cluster: SealedCluster) -> Iterator[str]:
    name = f"pf-{uuid.uuid4().hex[:6]}"
    sealed_cluster.kubectl("create", "namespace", name)
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _web_pod(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": PYTHON_IMAGE,
                        "command": ["python3", "-c", LOOPBACK_SERVER],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"exec": {"command": ["python3", "-c", READY]}, "periodSeconds": 1},
                    }
                ]
            },
        }
    )


@dataclass
class Forwarding:
    local_port: int
    pod_port: int
    stderr: list[str]  # complete once the block has ended


@contextlib.contextmanager
def port_forward(cluster: SealedCluster, namespace: str, target: str, remote: int) -> Iterator[Forwarding]:
    """Run ``kubectl port-forward TARGET :REMOTE`` (a random local port) until the block ends."""
    command = [
        "kubectl", f"--kubeconfig={cluster.kubeconfig}", "-n", namespace,
        "port-forward", "--address", "127.0.0.1", target, f":{remote}",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    try:
        assert process.stdout is not None and process.stderr is not None
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        local = pod_port = None
        while local is None and time.monotonic() < deadline and process.poll() is None:
            if selector.select(timeout=0.5):
                line = process.stdout.readline()
                print(f"kubectl port-forward: {line.rstrip()}")
                match = FORWARDING.search(line)
                if match:
                    local, pod_port = int(match.group(1)), int(match.group(2))
        selector.close()
        if local is None or pod_port is None:
            process.kill()
            pytest.fail(
                f"kubectl port-forward {target} did not start forwarding: {process.communicate(timeout=10)}"
            )
        yield Forwarding(local, pod_port, stderr)
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            _, rest = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            _, rest = process.communicate(timeout=10)
        stderr.extend(rest.splitlines())
        print("kubectl port-forward stderr:\n" + "\n".join(stderr))


def _ready(cluster: SealedCluster, namespace: str, name: str) -> bool:
    status = (cluster.get_json(namespace, "pod", name) or {}).get("status") or {}
    return any(container.get("ready") for container in status.get("containerStatuses") or [])


def fetch(port: int, path: str) -> str:
    with NO_PROXY.open(f"http://127.0.0.1:{port}{path}", timeout=15) as reply:
        assert reply.status == 200
        return str(reply.read().decode())


def echo(port: int, body: bytes) -> bytes:
    with NO_PROXY.open(f"http://127.0.0.1:{port}/echo", data=body, timeout=30) as reply:
        return bytes(reply.read())


def test_port_forward_reaches_a_port_bound_inside_the_pod(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=_web_pod("web"))
    wait_for("pod web ready", lambda: _ready(sealed_cluster, namespace, "web"), timeout=90)

    with port_forward(sealed_cluster, namespace, "pod/web", 8080) as forwarding:
        # Two connections: two stream pairs (requestIDs) on the one upgraded connection.
        assert fetch(forwarding.local_port, "/first") == "web /first"
        assert fetch(forwarding.local_port, "/second") == "web /second"
        # Megabytes both ways: many SPDY data frames and TLS records per direction.
        payload = bytes(range(256)) * 8192
        assert echo(forwarding.local_port, payload) == payload[::-1]

    sealed_cluster.kubectl("-n", namespace, "create", "service", "clusterip", "web", "--tcp=80:8080")
    sealed_cluster.kubectl("-n", namespace, "set", "selector", "service", "web", "app=web")
    with port_forward(sealed_cluster, namespace, "svc/web", 80) as forwarding:
        assert forwarding.pod_port == 8080  # kubectl mapped the Service port to the targetPort
        assert fetch(forwarding.local_port, "/through-service") == "web /through-service"


def test_a_port_nothing_listens_on_reports_the_kubelet_error(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=_web_pod("web"))
    wait_for(
        "pod web running",
        lambda: (
            ((sealed_cluster.get_json(namespace, "pod", "web") or {}).get("status") or {}).get("phase")
            == "Running"
        ),
        timeout=90,
    )
    # The connection closes without an HTTP answer.
    with port_forward(sealed_cluster, namespace, "pod/web", 9) as forwarding, pytest.raises(OSError):
        fetch(forwarding.local_port, "/")
    text = "\n".join(forwarding.stderr)
    assert "an error occurred forwarding" in text and "failed to connect to localhost:9" in text, text


@pytest.fixture
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):  # type: ignore[arg-type]  # needs only kubectl (ClusterAccess)
        yield


def _broker_pod(name: str, cluster: str) -> str:
    """A lone broker (standby: no operator heartbeats it) with an admin port, as the operator's pods have."""
    env = {
        "BROKER_NAME": name,
        "BROKER_CLUSTER": cluster,
        "BROKER_DATA_DIR": "/var/lib/broker",
        "BROKER_ADMIN_PORT": "8081",
        # Verifiers only: a broker refuses to start with a token in its environment.
        "BROKER_TOKEN_VERIFIER": token_verifier(OPERATOR_TOKEN),
        "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("port-forward-test-backend-token"),
    }
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "volumes": [{"name": "journal", "emptyDir": {}}],
                "containers": [
                    {
                        "name": "broker",
                        "image": "localhost/broker-failover/broker:0.1.0",
                        "env": [{"name": key, "value": value} for key, value in env.items()],
                        "volumeMounts": [{"name": "journal", "mountPath": "/var/lib/broker"}],
                        "ports": [{"name": "admin", "containerPort": 8081}],
                        "readinessProbe": {"tcpSocket": {"port": "admin"}, "periodSeconds": 1},
                    }
                ],
            },
        }
    )


def test_the_plugin_lists_held_messages_through_a_forwarded_admin_port(
    sealed_cluster: SealedCluster, namespace: str, crd: None
) -> None:
    cluster = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "orders"},
        # Endpoints mode: the plugin takes the broker's name from here and its address from --url.
        "spec": {
            "account": "port-forward",
            "company": "port-forward",
            "endpoints": [{"name": "orders-0", "url": "http://orders-0.invalid:8081/soap", "priority": 0}],
        },
    }
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(cluster))
    sealed_cluster.kubectl(
        "-n",
        namespace,
        "create",
        "secret",
        "generic",
        "orders-broker-token",
        f"--from-literal=token={OPERATOR_TOKEN}",
    )
    sealed_cluster.kubectl("-n", namespace, "apply", "-f", "-", input=_broker_pod("orders-0", "orders"))
    wait_for("broker orders-0 ready", lambda: _ready(sealed_cluster, namespace, "orders-0"), timeout=90)

    env = {**sealed_cluster.env, "PATH": f"{VENV_BIN}:{sealed_cluster.env['PATH']}"}
    with port_forward(sealed_cluster, namespace, "pod/orders-0", 8081) as forwarding:
        url = f"http://127.0.0.1:{forwarding.local_port}/soap"
        command = ["kubectl", "broker", "held", "list", "orders", "-n", namespace]
        result = subprocess.run(
            [*command, "--broker", "orders-0", "--url", url, "-o", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    print(f"$ kubectl broker held list ... (exit {result.returncode})\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["cluster"] == "orders" and document["held"] == [], document
