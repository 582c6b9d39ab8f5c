"""`make demo-k8s`: the user's path on Kubernetes, on the local control plane of this machine.

What a user of the project does, in order: ``helm install`` the chart (operator, CRD, RBAC and the
ordering validator's CronJob), ``kubectl apply`` a BrokerCluster from ``examples/``, watch
``kubectl get brokerclusters`` while traffic flows both ways, lose the active broker to kill -9,
see the failover, then run the validator's Job once and read its verdict and HTML report.

The cluster is the project's local one (``local_cluster``: the real etcd, kube-apiserver and
kube-controller-manager built from their Go modules, and one node agent that runs pods as local
processes, see docs/local-cluster.md). What is not real yet, and says so: pods share this
machine's loopback network (no Services routing, no DNS), so the backend simulator is handed the
broker pods' addresses and finds the active one itself, instead of following the ``-active``
Service. Everything is torn down at the end, also on Ctrl-C; the report is copied out first.

Exit status: 0 when the validator's verdict is Passed, 1 otherwise (with what went wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker_simulators.local_processes import ProcessSet, free_port
from local_cluster.cluster import REPO_ROOT, LocalCluster, LocalClusterSettings, start_local_cluster

CHART = REPO_ROOT / "charts" / "broker-failover"
EXAMPLE = REPO_ROOT / "examples" / "brokercluster-pods.yaml"
CLUSTER = "orders"  # the example's name
BROKERS = (f"{CLUSTER}-0", f"{CLUSTER}-1")
NAMESPACE = "demo"
RELEASE = "bf"
STORE_CLAIM = "broker-message-logs"  # the example's spec.messageLog.claimName
CRONJOB = f"{RELEASE}-broker-failover-validator"
STEPS = 7


class DemoError(Exception):
    """A step did not happen; the message says which and what was seen."""


def say(step: int, text: str) -> None:
    print(f"[demo {step}/{STEPS}] {text}", flush=True)


def note(text: str) -> None:
    print(f"           {text}", flush=True)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``probe`` until truthy; bounded, and the error names what was awaited."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise DemoError(f"timed out after {timeout:.0f}s waiting for {what} (last seen: {last!r})")


def http_json(url: str, payload: dict[str, Any] | None = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read() or b"null")


# ---- the pieces -------------------------------------------------------------------------


def build_tools() -> Path:
    """``make tools``: builds the Go tools once (minutes, with progress), a no-op afterwards."""
    build = REPO_ROOT / "hack" / "tools" / "build.sh"
    subprocess.run([str(build)], check=True, stdout=subprocess.DEVNULL)  # its progress is on stderr
    printed = subprocess.run([str(build), "--print"], check=True, capture_output=True, text=True)
    return Path(printed.stdout.strip())


class Kubectl:
    """kubectl and helm against the local cluster, echoing each user-facing command."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def run(self, *args: str, stdin: str | None = None, echo: bool = True) -> str:
        if echo:
            note(f"$ kubectl {' '.join(args)}")
        return self.cluster.kubectl(*args, input=stdin, timeout=120).stdout

    def helm(self, *args: str) -> str:
        note(f"$ helm {' '.join(args)}")
        return self.cluster.helm(*args, timeout=300).stdout

    def get(self, *what: str) -> Any:
        result = self.cluster.kubectl("-n", NAMESPACE, "get", *what, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def status(self) -> dict[str, Any]:
        return dict((self.get("brokercluster", CLUSTER) or {}).get("status") or {})


@contextmanager
def watching(kubectl: Kubectl) -> Iterator[None]:
    """Print the BrokerCluster's row whenever it changes, as ``kubectl get bc -w`` would."""
    stop = threading.Event()

    def watch() -> None:
        last = None
        while not stop.wait(0.5):
            result = kubectl.cluster.kubectl(
                "-n", NAMESPACE, "get", "bc", CLUSTER, "--no-headers", check=False, timeout=10
            )
            row = " ".join(result.stdout.split()[:-1])  # without AGE, which changes every second
            if result.returncode == 0 and row and row != last:
                print(f"           bc  {row}", flush=True)
                last = row

    print("           bc  NAME ACCOUNT COMPANY PHASE ACTIVE EPOCH ORDERING", flush=True)
    thread = threading.Thread(target=watch, name="bc-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=15)


def pod_ips(kubectl: Kubectl) -> list[str] | None:
    ips = [((kubectl.get("pod", name) or {}).get("status") or {}).get("podIP") for name in BROKERS]
    return [str(ip) for ip in ips] if all(ips) else None


def container_process_group(kubectl: Kubectl, pod: str) -> int:
    """The node agent runs each container as a process group; its id is the container id."""
    (container,) = kubectl.get("pod", pod)["status"]["containerStatuses"]
    return int(container["containerID"].removeprefix("local://"))


def job_finished(kubectl: Kubectl, job: str) -> dict[str, Any] | None:
    conditions = ((kubectl.get("job", job) or {}).get("status") or {}).get("conditions") or []
    done = [c for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
    return done[0] if done else None


# ---- the story ----------------------------------------------------------------------------


def story(cluster: LocalCluster, processes: ProcessSet, work: Path, report_out: Path, messages: int) -> bool:
    kubectl = Kubectl(cluster)
    store = cluster.state_dir / "claims" / NAMESPACE / STORE_CLAIM

    say(3, "helm install: the operator, the CRD, least-privilege RBAC and the validator's CronJob")
    kubectl.run("create", "namespace", NAMESPACE)
    wait_for("the namespace's default ServiceAccount", lambda: kubectl.get("serviceaccount", "default"), 30)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": STORE_CLAIM},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kubectl.run("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(claim), echo=False)
    note(f"(the shared message-log claim {STORE_CLAIM} the example names, created first)")
    installed = kubectl.helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--set", f"operator.watchNamespaces={{{NAMESPACE}}}",
            # Pods share this machine's ports here: the operator's must be free on it.
            "--set", f"operator.metricsPort={free_port()}", "--set", f"operator.healthPort={free_port()}",
            "--set", "validator.enabled=true", "--set", "validator.suspend=true",
            "--set", f"validator.store.claimName={STORE_CLAIM}", "--set", "validator.driverMemory=1g",
            "--wait", "--timeout=180s",
    )  # fmt: skip
    print("           " + installed.split("NOTES:")[0].strip().replace("\n", "\n           "))

    say(4, "the SAP backend and the cloud (simulators), and the Secrets the example names")
    cloud = processes.start_cloud_simulator(
        work, inbound_streams=2, inbound_messages_per_stream=messages // 4
    )
    token = os.urandom(16).hex()
    kubectl.run("-n", NAMESPACE, "create", "secret", "generic", "erp-broker-credential",
                f"--from-literal=token={token}", echo=False)  # fmt: skip
    note("$ kubectl create secret generic erp-broker-credential --from-literal=token=...")
    say(5, f"kubectl apply -f examples/{EXAMPLE.name}: BrokerCluster {CLUSTER}, two broker pods")
    with watching(kubectl):
        kubectl.run("-n", NAMESPACE, "apply", "-f", str(EXAMPLE))
        ips = wait_for("both broker pods to have addresses", lambda: pod_ips(kubectl), 120)
        backend = processes.start_backend_simulator(
            work,
            broker_urls=[f"http://{ip}:8080" for ip in ips],
            streams=4,
            messages_per_stream=messages // 4,
            bundle_size=50,
            lanes=2,
            backend_token=token,
        )
        kubectl.run("-n", NAMESPACE, "create", "secret", "generic", "erp-endpoints",
                    f"--from-literal=backend={backend.url}", f"--from-literal=cloud={cloud.url}",
                    echo=False)  # fmt: skip
        note("$ kubectl create secret generic erp-endpoints --from-literal=backend=.. --from-literal=cloud=.")
        first = wait_for(
            "the cluster to become Healthy with an active broker",
            lambda: (s := kubectl.status()).get("phase") == "Healthy" and s.get("active") and s,
            180,
        )
        active = str(first["active"])

        say(6, f"traffic both ways, then kill -9 of the active broker {active} mid-stream")
        http_json(f"{backend.url}/sim/start", {})
        wait_for(
            "a third of the outbound messages confirmed",
            lambda: int(http_json(f"{backend.url}/sim/status")["confirmed"]) >= messages // 3,
            120,
            interval=0.1,
        )
        os.killpg(container_process_group(kubectl, active), signal.SIGKILL)
        note(f"$ kill -9 <{active}'s container>  (what a node crash or an OOM kill does)")
        after = wait_for(
            "a failover to the other broker",
            lambda: (s := kubectl.status()).get("active") not in (None, active) and s,
            90,
        )
        moved = after.get("lastFailover") or {}
        note(
            f"failover: {moved.get('from')} -> {moved.get('to')} ({moved.get('reason')}, "
            f"{moved.get('durationMs')} ms), epoch {first.get('epoch')} -> {after.get('epoch')}"
        )
        wait_for(
            "every message confirmed, both ways",
            lambda: (
                bool(http_json(f"{backend.url}/sim/status")["allConfirmed"])
                and bool(http_json(f"{cloud.url}/sim/status")["inboundAllConfirmed"])
            ),
            240,
            interval=1,
        )
        note("every message confirmed; waiting for the brokers to close their log segments (30 s bound)")
        wait_for("every message-log segment closed", lambda: not list(store.glob("*/*/*.open")), 120, 1)

        say(7, "the ordering validator, once: a Job from the CronJob (PySpark, local[*] in its pod)")
        kubectl.run("-n", NAMESPACE, "create", "job", f"--from=cronjob/{CRONJOB}", "demo-check")
        finished = wait_for(
            "the validator's Job to finish", lambda: job_finished(kubectl, "demo-check"), 600, 1
        )
        time.sleep(1.5)  # one more watch line, with the ORDERING column
    ordering = kubectl.status().get("ordering") or {}
    note(f"Job demo-check: {finished['type']}; status.ordering: {json.dumps(ordering)}")
    reports = store / ".validator" / "reports"
    if reports.is_dir():
        shutil.copytree(reports, report_out, dirs_exist_ok=True)
        report = json.loads((report_out / "report.json").read_text())
        note(f"anomalies: {json.dumps(report.get('anomalies', {}))}")
        note(f"HTML report (open it in a browser): {report_out / 'report.html'}")
    return ordering.get("result") == "Passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=8000, help="outbound messages (4 streams)")
    parser.add_argument(
        "--report-dir", type=Path, default=REPO_ROOT / ".cache" / "demo-k8s", help="the report's copy"
    )
    args = parser.parse_args(argv)
    # SIGTERM ends the demo as Ctrl-C does: through the teardown below.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    began = time.monotonic()
    say(1, "the Kubernetes tools (etcd, kube-apiserver, kube-controller-manager, helm), built once")
    tools = build_tools()
    work = Path(tempfile.mkdtemp(prefix="broker-failover-demo-"))
    processes = ProcessSet(work / "processes")
    cluster: LocalCluster | None = None
    ok = False
    try:
        say(2, "a local cluster: the real control plane on loopback, one node agent")
        cluster = start_local_cluster(LocalClusterSettings(tools_dir=tools, workdir=work / "cluster"))
        note(f"ready in {cluster.ready_seconds:.1f}s; KUBECONFIG={cluster.kubeconfig} (removed at the end)")
        ok = story(cluster, processes, work, args.report_dir, args.messages)
    except DemoError as error:
        print(f"[demo] FAILED: {error}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("[demo] interrupted; cleaning up", file=sys.stderr, flush=True)
    finally:
        processes.stop_all()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
        print(f"[demo] cleaned up: cluster, pods, simulators and {work} ({time.monotonic() - began:.0f}s)")
    print(f"[demo] verdict: {'Passed' if ok else 'NOT passed'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
