"""`make demo`: the user's path on Kubernetes, on a local cluster with a real pod network.

What a user of the project does, in order: ``helm install`` the chart (operator, CRD, RBAC and the
ordering validator's CronJob), ``kubectl apply`` a BrokerCluster from ``examples/``, watch
``kubectl get brokerclusters`` while traffic flows both ways, lose the active broker to kill -9,
see the failover, then run the validator's Job once and read its verdict and HTML report.

The cluster is the project's sealed local one (``local_cluster.sealed_cluster``, see
docs/local-cluster.md): the real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
built from their Go modules, a real kubelet with containerd and runc running the images that
``make images`` built (nothing is pulled), the real kube-proxy (nftables) and CoreDNS, and a CNI
bridge giving each pod its address in 10.244.0.0/24, all inside network, mount and PID namespaces
with no route out; only the API server is forwarded to a loopback port, for kubectl and helm. The
operator runs as the chart's pod; the SAP backend and the cloud are simulator pods behind
Services of their own (``local_cluster.relay``). The backend sends to
``http://orders-active.demo.svc:8080``: the ``-active`` Service, through CoreDNS and kube-proxy,
whose EndpointSlice the operator points at the new active on failover.

TLS, as ``relay.deploy_relay`` sets it up (``local_cluster.relay_tls``): the simulators serve HTTPS
with certificates from a CA made for the run, the brokers call them at ``https://`` URLs verified
against it (the BrokerCluster's ``spec.tls.upstreamCASecretRef``), and the demo's own calls to them
verify it too. ``--plain-http`` opts out. The backend sends to
``https://orders-active.demo.svc:8080`` (``relay.BROKER_TLS``), verified against the cluster's CA
(the ``ca.crt`` the operator writes, the one ``kubectl broker ca`` exports for the SAP admin), as
the operator's brokers serve TLS by default; ``--no-broker-tls`` runs the brokers (the chart's
``operator.brokerTls=false``) and that leg on plain HTTP.

What is still not real, and says so: one node, no NetworkPolicy enforcement (no policy plugin on
the bridge); simulators stand in for SAP and the cloud.
Everything is torn down at the end, also on Ctrl-C; the report is copied out first.

Exit status: 0 when the validator's verdict is Passed, 1 otherwise (with what went wrong).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from local_cluster.cluster import REPO_ROOT, LocalClusterSettings
from local_cluster.image_build import ImageBuildError, build_images
from local_cluster.relay import (
    BROKER_TLS,
    CHART,
    CLUSTER_NAME,
    EXAMPLE,
    MESSAGE_LOG_CLAIM,
    SIM_PORT,
    Relay,
    RelayError,
    RelayTls,
    message_log_claim,
    relay_brokercluster,
    relay_secrets,
    relay_simulators,
    wait_until,
)
from local_cluster.relay_tls import SIMULATORS_CA_SECRET, serving_secret_name
from local_cluster.sealed_cluster import SealedCluster, start_sealed_cluster

CLUSTER = CLUSTER_NAME  # the example's name: orders
NAMESPACE = "demo"
RELEASE = "bf"
STORE_CLAIM = MESSAGE_LOG_CLAIM  # the example's spec.messageLog.claimName
CRONJOB = f"{RELEASE}-broker-failover-validator"
STEPS = 7
INBOUND_STREAMS = 2  # the cloud's streams toward the backend (the backend sends on four)


class DemoError(Exception):
    """A step did not happen; the message says which and what was seen."""


def say(step: int, text: str) -> None:
    print(f"[demo {step}/{STEPS}] {text}", flush=True)


def note(text: str) -> None:
    print(f"           {text}", flush=True)


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``probe`` until truthy (``relay.wait_until``); a timeout is this demo's DemoError."""
    try:
        return wait_until(what, probe, timeout, interval)
    except RelayError as error:
        raise DemoError(str(error)) from error


# ---- the pieces -------------------------------------------------------------------------


VALIDATOR_IMAGE = "broker-failover/validator"


def build_tools() -> Path:
    """``make tools``: builds the Go tools once (minutes, with progress), a no-op afterwards."""
    build = REPO_ROOT / "hack" / "tools" / "build.sh"
    subprocess.run([str(build)], check=True, stdout=subprocess.DEVNULL)  # its progress is on stderr
    printed = subprocess.run([str(build), "--print"], check=True, capture_output=True, text=True)
    return Path(printed.stdout.strip())


def start_cluster(settings: LocalClusterSettings) -> SealedCluster:
    """``start_sealed_cluster``, but a Ctrl-C while it starts still stops what it started.

    The start runs on a worker thread (signals reach only the main thread); when interrupted,
    this waits for it to finish, stops the cluster and re-raises.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="cluster-start") as pool:
        starting = pool.submit(start_sealed_cluster, settings)
        try:
            return starting.result()
        except KeyboardInterrupt:
            print("[demo] interrupted; stopping the cluster once it has started", file=sys.stderr, flush=True)
            starting.result(timeout=settings.ready_timeout_seconds + 60).stop()
            raise


class Kubectl:
    """kubectl and helm against the local cluster, echoing each user-facing command."""

    def __init__(self, cluster: SealedCluster) -> None:
        self.cluster = cluster

    def run(self, *args: str, stdin: str | None = None, echo: bool = True) -> str:
        if echo:
            note(f"$ kubectl {' '.join(args)}")
        return self.cluster.kubectl(*args, input=stdin, timeout=120).stdout

    def helm(self, *args: str) -> str:
        note(f"$ helm {' '.join(args)}")
        return self.cluster.helm(*args, timeout=300).stdout

    def get(self, *what: str) -> Any:
        """What ``kubectl get WHAT -o json`` prints (the demo's polling, so not echoed), or None."""
        return self.cluster.get_json(NAMESPACE, *what)

    def status(self) -> dict[str, Any]:
        return dict((self.get("brokercluster", CLUSTER) or {}).get("status") or {})

    def pod_ready(self, name: str) -> bool:
        conditions = ((self.get("pod", name) or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pod_ip(self, name: str) -> str:
        return str(((self.get("pod", name) or {}).get("status") or {}).get("podIP"))

    def cluster_ip(self, service: str) -> str:
        return str(((self.get("service", service) or {}).get("spec") or {}).get("clusterIP"))


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


def job_finished(kubectl: Kubectl, job: str) -> dict[str, Any] | None:
    conditions = ((kubectl.get("job", job) or {}).get("status") or {}).get("conditions") or []
    done = [c for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
    return done[0] if done else None


def simulators(messages: int, tls: RelayTls) -> list[dict[str, Any]]:
    """The SAP backend and the cloud as pods, each behind a Service of its name (``relay``)."""
    per_stream = messages // 4
    backend_args = [
        "--account=acme",
        "--company=1000",
        "--streams=4",
        f"--messages-per-stream={per_stream}",
        "--bundle-size=50",
        "--lanes=2",
    ]
    cloud_args = [f"--inbound-streams={INBOUND_STREAMS}", f"--inbound-messages-per-stream={per_stream}"]
    return relay_simulators(NAMESPACE, tls, backend_args=backend_args, cloud_args=cloud_args)


# ---- the story ----------------------------------------------------------------------------


def install_chart(kubectl: Kubectl, tls: RelayTls) -> None:
    say(3, "helm install: the operator, the CRD, least-privilege RBAC and the validator's CronJob")
    kubectl.run("create", "namespace", NAMESPACE)
    wait_for("the namespace's default ServiceAccount", lambda: kubectl.get("serviceaccount", "default"), 30)
    claim = message_log_claim()
    kubectl.run("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(claim), echo=False)
    note(
        f"(the shared message-log claim {STORE_CLAIM} the example names, created first:"
        f" ReadWriteMany, class {claim['spec']['storageClassName']})"
    )
    installed = kubectl.helm(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--set", f"operator.watchNamespaces={{{NAMESPACE}}}",
            "--set", "validator.enabled=true", "--set", "validator.suspend=true",
            "--set", f"validator.store.claimName={STORE_CLAIM}", "--set", "validator.driverMemory=1g",
            # The brokers serve TLS by default (operator.brokerTls); --no-broker-tls opts out.
            *(() if tls.broker else ("--set", "operator.brokerTls=false")),
            "--wait", "--timeout=180s",
    )  # fmt: skip
    if not tls.broker:
        note("(--set operator.brokerTls=false: the brokers serve plain HTTP, the opt-out)")
    print("           " + installed.split("NOTES:")[0].strip().replace("\n", "\n           "))


def start_simulators(kubectl: Kubectl, messages: int, tls: RelayTls) -> Relay:
    say(4, "the SAP backend and the cloud (simulator pods behind Services), and the Secrets they use")
    pki = tls.pki(NAMESPACE)
    secrets = {"apiVersion": "v1", "kind": "List", "items": relay_secrets(NAMESPACE, tls, pki)}
    kubectl.run("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(secrets), echo=False)
    if tls.upstream:
        note("(a CA made for this run with openssl stands for SAP's and the cloud's PKI; it signed each")
        note(" simulator's certificate, named for its Service: cloud, cloud.demo, cloud.demo.svc, ...)")
        for simulator in ("backend", "cloud"):
            note(
                f"$ kubectl create secret tls {serving_secret_name(simulator)} "
                f"--cert={simulator}.crt --key={simulator}.key   # the simulator's HTTPS"
            )
        note(
            f"$ kubectl create secret generic {SIMULATORS_CA_SECRET} --from-file=ca.crt"
            "   # what the brokers trust"
        )
    scheme = tls.sim_scheme()
    note(
        f"$ kubectl create secret generic erp-endpoints --from-literal=backend={scheme}://backend.{NAMESPACE}.svc:"
        f"{SIM_PORT} --from-literal=cloud={scheme}://cloud.{NAMESPACE}.svc:{SIM_PORT}"
    )
    note("$ kubectl create secret generic erp-login --type=kubernetes.io/basic-auth   # what brokers present")
    note("$ kubectl create secret generic erp-cloud-key --from-literal=token=...")
    note("$ kubectl create secret generic erp-broker-credential --from-literal=token=...   # the backend's")
    ca_secret = f" {SIMULATORS_CA_SECRET}" if tls.upstream else ""
    note(f"$ kubectl label secret erp-endpoints erp-login erp-cloud-key erp-broker-credential{ca_secret} \\")
    note("      broker.failover.dev/credential=true   # the operator uses only Secrets that opt in")
    objects = {"apiVersion": "v1", "kind": "List", "items": simulators(messages, tls)}
    kubectl.run("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(objects), echo=False)
    note("$ kubectl apply -f -   # pods and Services backend and cloud (the simulators)")
    # With the backend -> broker leg over TLS, the backend pod mounts ca.crt of orders-tls, which
    # the operator writes once the BrokerCluster exists: that pod is waited for after it (story).
    first = ("cloud",) if tls.broker else ("cloud", "backend")
    wait_for(
        f"simulator pods {' and '.join(first)} ready", lambda: all(kubectl.pod_ready(n) for n in first), 120
    )
    if tls.broker:
        note(f"(the backend pod starts once the operator has written {CLUSTER}-tls, whose ca.crt it mounts)")
    relay = Relay(
        kubectl.cluster,
        NAMESPACE,
        RELEASE,
        backend_url=f"{scheme}://{kubectl.cluster_ip('backend')}:{SIM_PORT}",
        cloud_url=f"{scheme}://{kubectl.cluster_ip('cloud')}:{SIM_PORT}",
        inbound_streams=INBOUND_STREAMS,
        simulators_ca=pki.ca if pki is not None and tls.upstream else None,
    )
    note(
        f"the backend sends to {tls.broker_url(NAMESPACE)}: the -active Service, "
        "through CoreDNS and kube-proxy"
    )
    if tls.broker:
        note(f"(verifying the brokers against ca.crt of Secret {CLUSTER}-tls, which the operator writes)")
    verified = ", verified against the run's CA as backend/cloud.demo.svc" if tls.upstream else ""
    note(
        f"(their control API is reached at {relay.backend_url} and {relay.cloud_url}, "
        f"inside the cluster{verified})"
    )
    return relay


def export_ca(kubectl: Kubectl, report_out: Path) -> None:
    """``kubectl broker ca``, the plugin as a user runs it (its module, with the cluster's
    kubeconfig): the CA the SAP admin imports (STRUST, or PI/PO's TrustedCAs) to trust the brokers
    behind the -active Service, written beside the report."""
    ca_file = report_out / f"{CLUSTER}-ca.pem"
    report_out.mkdir(parents=True, exist_ok=True)
    args = ["ca", CLUSTER, "-n", NAMESPACE, "--file", str(ca_file)]
    note(f"$ kubectl broker {' '.join(args)}   # the CA for the SAP admin (STRUST / NWA TrustedCAs)")
    exported = subprocess.run(
        [sys.executable, "-m", "broker_operator.kubectl_plugin.cli", "--kubeconfig",
         str(kubectl.cluster.kubeconfig), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if exported.returncode != 0:
        raise DemoError(f"kubectl broker ca failed ({exported.returncode}): {exported.stderr.strip()}")
    for line in exported.stderr.strip().splitlines():
        note(f"  {line}")


def apply_brokercluster(kubectl: Kubectl, tls: RelayTls) -> None:
    """The example, with the ``spec.tls`` the relay's TLS needs (``relay.relay_brokercluster``)."""
    manifest = relay_brokercluster(tls)
    if "tls" not in manifest["spec"]:
        kubectl.run("-n", NAMESPACE, "apply", "-f", str(EXAMPLE))
        return
    kubectl.run("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(manifest), echo=False)
    note(f"$ kubectl -n {NAMESPACE} apply -f {EXAMPLE}   # with, under spec:")
    note(f"      tls: {json.dumps(manifest['spec']['tls'])}   # brokers verify https:// targets against it")


def story(cluster: SealedCluster, report_out: Path, messages: int, tls: RelayTls) -> bool:
    kubectl = Kubectl(cluster)
    install_chart(kubectl, tls)
    store = cluster.claim_volume_path(NAMESPACE, STORE_CLAIM)  # the bound PV's path
    relay = start_simulators(kubectl, messages, tls)

    say(5, f"kubectl apply -f examples/{EXAMPLE.name}: BrokerCluster {CLUSTER}, two broker pods")
    with watching(kubectl):
        apply_brokercluster(kubectl, tls)
        first = wait_for(
            "the cluster to become Healthy with an active broker",
            lambda: (s := kubectl.status()).get("phase") == "Healthy" and s.get("active") and s,
            180,
        )
        active = str(first["active"])
        wait_for("the backend simulator pod ready", lambda: kubectl.pod_ready("backend"), 120)
        active_ip = kubectl.pod_ip(active)
        wait_for(
            f"Service {CLUSTER}-active to route to {active} ({active_ip})",
            lambda: relay.active_service_addresses() == [active_ip],
            60,
        )
        note(
            f"Service {CLUSTER}-active ({kubectl.cluster_ip(f'{CLUSTER}-active')}): "
            f"EndpointSlice -> {active_ip} ({active})"
        )
        if tls.broker:
            note(
                f"the brokers serve TLS with certificates from {CLUSTER}'s own CA, which the operator "
                f"keeps in Secret {CLUSTER}-ca and rotates with no restart; the heartbeats are mutual TLS"
            )
            export_ca(kubectl, report_out)

        say(6, f"traffic both ways, then kill -9 of the active broker {active} mid-stream")
        relay.backend("/sim/start", {})
        wait_for(
            "a third of the outbound messages confirmed",
            lambda: int(relay.backend("/sim/status")["confirmed"]) >= messages // 3,
            120,
            interval=0.1,
        )
        relay.kill_9(active)
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
        successor = str(after["active"])
        successor_ip = kubectl.pod_ip(successor)
        wait_for(
            f"Service {CLUSTER}-active to follow to {successor} ({successor_ip})",
            lambda: relay.active_service_addresses() == [successor_ip],
            60,
            interval=0.2,
        )
        note(
            f"Service {CLUSTER}-active: EndpointSlice {active_ip} ({active}) -> {successor_ip} "
            f"({successor}); the backend follows it by its DNS name"
        )
        wait_for("every message confirmed, both ways", relay.all_confirmed, 240, interval=1)
        transports = {
            name: relay.sim(name, "/sim/status").get("relayTransports") for name in ("backend", "cloud")
        }
        note(f"the brokers' calls as the simulators took them, by transport: {json.dumps(transports)}")
        note("every message confirmed; waiting for the brokers to close their log segments (30 s bound)")
        wait_for("every message-log segment closed", lambda: not list(store.glob("*/*/*.open")), 120, 1)

        say(7, "the ordering validator, once: a Job from the CronJob (PySpark, local[*] in its pod)")
        cluster.ensure_images([VALIDATOR_IMAGE])  # imported in the background meanwhile
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
    parser.add_argument(
        "--plain-http",
        action="store_true",
        help="the simulators serve plain HTTP and the brokers call them at http:// URLs (default: HTTPS, "
        "verified against a CA made for the run)",
    )
    parser.add_argument(
        "--broker-tls",
        action=argparse.BooleanOptionalAction,
        default=BROKER_TLS,
        help="the backend sends to https://orders-active.demo.svc:8080, verified against ca.crt of Secret "
        f"orders-tls, as the brokers serve TLS by default; --no-broker-tls: the brokers and that leg "
        f"on plain HTTP (default: {BROKER_TLS})",
    )
    args = parser.parse_args(argv)
    tls = RelayTls(upstream=not args.plain_http, broker=args.broker_tls)
    # SIGTERM ends the demo as Ctrl-C does: through the teardown below.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    began = time.monotonic()
    say(
        1,
        "the Kubernetes tools (etcd, apiserver, controller-manager, scheduler, kubelet, kube-proxy, CoreDNS,"
        " helm, local-path-provisioner) and our images, each built once",
    )
    tools = build_tools()
    try:
        build_images()  # buildah, from the Dockerfiles; cached by content
    except ImageBuildError as error:
        print(f"[demo] FAILED: {error}", file=sys.stderr, flush=True)
        return 1
    work = Path(tempfile.mkdtemp(prefix="broker-failover-demo-"))
    cluster: SealedCluster | None = None
    ok = False
    try:
        say(2, "a local cluster with a pod network, sealed in its own namespaces (no route out)")
        settings = LocalClusterSettings(
            tools_dir=tools, workdir=work / "cluster", background_images=(VALIDATOR_IMAGE,)
        )
        cluster = start_cluster(settings)
        note(
            f"ready in {cluster.ready_seconds:.1f}s: the real control plane, a kubelet on containerd and runc"
            f" running our images, kube-proxy (nftables), CoreDNS, pods on {cluster.state.get('podNetwork')}"
        )
        note(f"KUBECONFIG={cluster.kubeconfig} (the API server forwarded to loopback; removed at the end)")
        ok = story(cluster, args.report_dir, args.messages, tls)
    except DemoError as error:
        print(f"[demo] FAILED: {error}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("[demo] interrupted; cleaning up", file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
        print(f"[demo] cleaned up: cluster, pods, simulators and {work} ({time.monotonic() - began:.0f}s)")
    print(f"[demo] verdict: {'Passed' if ok else 'NOT passed'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
