"""``kubectl broker`` (issue 12) through the real kubectl, against the real control plane.

kubectl finds the plugin as it would on a user's machine: the venv's ``bin`` (where the package
installs the ``kubectl-broker`` console script) first on PATH, ``kubectl broker ...`` run as a
subprocess. It runs inside the sealed cluster's namespaces (``SealedCluster.node_command``, as in
``make shell``), where the brokers' pod IPs route, since the plugin asks the brokers themselves for
held messages. Behind it: the operator as its own process, two broker pods on the real kubelet, and
a backend and a cloud simulator in the cluster's network (``test_operator.start_simulator``). The
cloud offers one inbound stream with two poison messages (seq 2 refused always, seq 3 refused
once) and the cluster holds poison at the first refusal (``maxDeliveries: 1, onPoison: Hold``),
so there are real held messages to list, replay and discard.

The tests share one BrokerCluster and run in file order: status, held messages, the report, then
the switchover (which moves the active the earlier tests asked). Waits are failure limits.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster.pki import write_kubeconfig
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import LocalProcess, installed_crd, wait_for
from tests.e2e.test_operator import (
    VENV_BIN,
    apply,
    broker_cluster,
    http_in_network,
    new_namespace,
    node_env,
    role_of,
    start_operator,
    start_simulator,
    wait_for_row,
)

pytestmark = pytest.mark.e2e

CLUSTER = "plugin"
BROKERS = [f"{CLUSTER}-0", f"{CLUSTER}-1"]
STREAM = "invoices-0000"


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture(scope="module")
def namespace(sealed_cluster: SealedCluster, crd: None) -> Iterator[str]:
    name = new_namespace(sealed_cluster, "plugin")
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def targets(
    sealed_cluster: SealedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """A backend simulator and a cloud simulator whose inbound stream carries two poison messages."""
    logs = tmp_path_factory.mktemp("simulators")
    cloud_args = ["--inbound-streams", "1", "--inbound-messages-per-stream", "4"]
    cloud_args += ["--poison", f"{STREAM}:2:always", "--poison", f"{STREAM}:3:1"]
    started: list[LocalProcess] = []
    urls: dict[str, str] = {}
    try:
        for role, args in (("backend", []), ("cloud", cloud_args)):
            process, urls[role] = start_simulator(sealed_cluster, role, logs / f"{role}.log", *args)
            started.append(process)
        yield urls
    finally:
        for process in started:
            process.stop()


@pytest.fixture(scope="module")
def running(
    sealed_cluster: SealedCluster,
    namespace: str,
    targets: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The operator and BrokerCluster ``plugin`` with ``plugin-0`` active; yields the namespace."""
    operator = start_operator(sealed_cluster, namespace, tmp_path_factory.mktemp("operator") / "operator.log")
    try:
        manifest = broker_cluster(
            CLUSTER,
            replicas=2,
            company=f"plugin-{uuid.uuid4().hex[:4]}",
            failback="Manual",  # the active stays where the switchover puts it
            delivery={"maxDeliveries": 1, "onPoison": "Hold"},
            backend={"url": targets["backend"]},
            cloud={"url": targets["cloud"]},
        )
        created = apply(sealed_cluster, namespace, manifest)
        assert created.returncode == 0, created.stderr
        wait_for_row(
            sealed_cluster, namespace, CLUSTER, f"{BROKERS[0]} active, Healthy",
            lambda row: row["ACTIVE"] == BROKERS[0] and row["PHASE"] == "Healthy", timeout=90,
        )  # fmt: skip
        yield namespace
    finally:
        operator.stop()
        print(operator.tail())  # shown by pytest on failure


def plugin(
    cluster: SealedCluster, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl broker ARGS`` through the real kubectl, which finds ``kubectl-broker`` on PATH, run
    in the cluster's namespaces (pod IPs route there) with a kubeconfig for the bridge address."""
    env = {**node_env(cluster), "PATH": f"{VENV_BIN}{os.pathsep}{cluster.env['PATH']}"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    result = subprocess.run(
        cluster.node_command(["kubectl", "broker", *args]),
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    # What a person would have seen, shown by pytest when a test fails.
    print(f"$ kubectl broker {' '.join(args)}  (exit {result.returncode})\n{result.stdout}{result.stderr}")
    return result


def plugin_json(cluster: SealedCluster, *args: str) -> Any:
    result = plugin(cluster, *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def held_seqs(cluster: SealedCluster, namespace: str) -> list[int]:
    document = plugin_json(cluster, "held", "list", CLUSTER, "-n", namespace)
    return sorted(entry["seq"] for entry in document["held"])


def backend_received(cluster: SealedCluster, targets: dict[str, str]) -> list[int]:
    received = http_in_network(cluster, targets["backend"] + "/sim/received", timeout=5)
    return list(json.loads(received).get(STREAM, []))


def test_status_on_a_terminal_and_as_json(sealed_cluster: SealedCluster, running: str) -> None:
    namespace = running
    # Both poison messages are held on the active before we look (held counts are part of status).
    wait_for("two held messages", lambda: held_seqs(sealed_cluster, namespace) == [2, 3])

    shown = plugin(sealed_cluster, "status", CLUSTER, "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"Cluster:    {CLUSTER} (namespace {namespace})"
    assert "Phase:      Healthy" in lines
    epoch = sealed_cluster.get_json(namespace, "bc", CLUSTER)["status"]["epoch"]
    assert f"Active:     {BROKERS[0]}, epoch {epoch}" in lines
    assert any(line.startswith("Ordering:   not checked yet") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("BROKER"))
    first, second = (lines[header + 1].split(), lines[header + 2].split())
    assert first[:4] == [f"*{BROKERS[0]}", "0", "Active", "-"] and first[-1] == "2", lines
    assert second[:4] == [BROKERS[1], "1", "Inactive", "-"] and second[-1] == "0", lines

    document = plugin_json(sealed_cluster, "status", CLUSTER, "-n", namespace)
    assert document["schema"] == "kubectl-broker/status/v1"
    assert (document["name"], document["namespace"], document["phase"]) == (CLUSTER, namespace, "Healthy")
    assert (document["active"], document["epoch"], document["heldTotal"]) == (BROKERS[0], epoch, 2)
    assert [(b["name"], b["priority"], b["state"], b["held"]) for b in document["brokers"]] == [
        (BROKERS[0], 0, "Active", 2),
        (BROKERS[1], 1, "Inactive", 0),
    ]
    assert document["ordering"] is None

    listing = plugin(sealed_cluster, "status", "-n", namespace)
    assert listing.returncode == 0, listing.stderr
    header_line, row = listing.stdout.splitlines()
    assert header_line.split()[:5] == ["NAME", "PHASE", "ACTIVE", "EPOCH", "BROKERS"]
    assert row.split()[:5] == [CLUSTER, "Healthy", BROKERS[0], str(epoch), "2/2"]


def test_held_messages_are_listed_replayed_and_discarded(
    sealed_cluster: SealedCluster, running: str, targets: dict[str, str]
) -> None:
    namespace = running
    wait_for("two held messages", lambda: held_seqs(sealed_cluster, namespace) == [2, 3])
    listed = plugin(sealed_cluster, "held", "list", CLUSTER, "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [row[:6] for row in rows] == [
        [BROKERS[0], "inbound", STREAM, "2", f"{STREAM}-2", "1"],
        [BROKERS[0], "inbound", STREAM, "3", f"{STREAM}-3", "1"],
    ]
    assert 3 not in backend_received(sealed_cluster, targets)

    # seq 3 was refused once only: replayed, the backend takes it.
    replayed = plugin(sealed_cluster, "held", "replay", CLUSTER, "inbound", STREAM, "3", "-n", namespace)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith(f"replayed inbound {STREAM} seq 3 on {BROKERS[0]}")
    wait_for("seq 3 delivered to the backend", lambda: 3 in backend_received(sealed_cluster, targets))
    assert held_seqs(sealed_cluster, namespace) == [2]

    # seq 2 is refused always: discarded, the cloud is told to forget it.
    discarded = plugin(sealed_cluster, "held", "discard", CLUSTER, "inbound", STREAM, "2", "-n", namespace)
    assert discarded.returncode == 0, discarded.stderr
    nothing = plugin(sealed_cluster, "held", "list", CLUSTER, "-n", namespace, "--all-brokers")
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.strip() == f"No held messages on {BROKERS[0]}, {BROKERS[1]}."
    assert 2 not in backend_received(sealed_cluster, targets)

    # A message that is not held: the broker's NOT_FOUND, exit 1.
    again = plugin(sealed_cluster, "held", "discard", CLUSTER, "inbound", STREAM, "2", "-n", namespace)
    assert again.returncode == 1, again.stdout
    assert "DiscardHeld refused by broker plugin-0" in again.stderr and "NOT_FOUND" in again.stderr


def test_report_before_and_after_a_validator_verdict(
    sealed_cluster: SealedCluster, running: str, tmp_path: Path
) -> None:
    namespace = running
    none_yet = plugin(sealed_cluster, "report", CLUSTER, "-n", namespace)
    assert none_yet.returncode == 0, none_yet.stderr
    assert none_yet.stdout.startswith(f"No ordering check recorded for {CLUSTER} yet")
    assert plugin_json(sealed_cluster, "report", CLUSTER, "-n", namespace)["ordering"] is None
    show = plugin(sealed_cluster, "report", CLUSTER, "-n", namespace, "--show")
    assert show.returncode == 1
    assert "no validator run has recorded a report" in show.stderr

    # The verdict as the validator's CronJob records it: status.ordering, report in the shared claim.
    location = "pvc/message-log/.validator/reports/report.html"
    ordering = {
        "lastCheckTime": "2026-11-23T10:11:12Z",
        "result": "Passed",
        "violations": 0,
        "report": location,
    }
    sealed_cluster.kubectl(
        "-n", namespace, "patch", "bc", CLUSTER, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"ordering": ordering}}),
    )  # fmt: skip
    recorded = plugin(sealed_cluster, "report", CLUSTER, "-n", namespace, "--show")
    assert recorded.returncode == 1  # the claim is not mounted here: say how to fetch it
    assert "Result:       Passed" in recorded.stdout
    assert f"kubectl cp {namespace}/POD:MOUNT_PATH/.validator/reports/report.json" in recorded.stderr
    reports = tmp_path / "claim" / ".validator" / "reports"
    reports.mkdir(parents=True)
    (reports / "report.json").write_text(
        json.dumps({"result": "Passed", "clusters": {CLUSTER: {"violations": 0}}})
    )
    document = plugin_json(
        sealed_cluster, "report", CLUSTER, "-n", namespace, "--show", "--claim-dir", str(tmp_path / "claim")
    )
    assert document["ordering"] == ordering
    assert document["report"]["clusters"][CLUSTER] == {"violations": 0}


def test_switchover_to_the_standby_moves_the_active(sealed_cluster: SealedCluster, running: str) -> None:
    namespace = running
    before = sealed_cluster.get_json(namespace, "bc", CLUSTER)["status"]
    assert before["active"] == BROKERS[0]
    moved = plugin(sealed_cluster, "switchover", CLUSTER, BROKERS[1], "-n", namespace, "--timeout", "90")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert f"switchover of {CLUSTER} to {BROKERS[1]} requested" in moved.stdout
    assert f"{BROKERS[1]} is now the active broker of {CLUSTER}" in moved.stdout
    after = sealed_cluster.get_json(namespace, "bc", CLUSTER)
    assert after["spec"]["preferredActive"] == BROKERS[1]
    assert after["status"]["active"] == BROKERS[1]
    assert after["status"]["epoch"] > before["epoch"]
    wait_for(
        f"role=active on {BROKERS[1]}", lambda: role_of(sealed_cluster, namespace, BROKERS[1]) == "active"
    )
    document = plugin_json(sealed_cluster, "status", CLUSTER, "-n", namespace)
    assert document["active"] == BROKERS[1]
    again = plugin(sealed_cluster, "switchover", CLUSTER, BROKERS[1], "-n", namespace)
    assert again.returncode == 0 and "is already the active broker" in again.stdout


def test_unknown_names_are_usage_errors_and_change_nothing(
    sealed_cluster: SealedCluster, running: str
) -> None:
    namespace = running
    for args in (["status", "nosuch"], ["held", "list", "nosuch"], ["report", "nosuch"]):
        result = plugin(sealed_cluster, *args, "-n", namespace)
        assert result.returncode == 2, (args, result.stdout)
        assert result.stderr.strip() == f"error: BrokerCluster 'nosuch' not found in namespace {namespace}"
    before = sealed_cluster.get_json(namespace, "bc", CLUSTER)["spec"].get("preferredActive")
    wrong = plugin(sealed_cluster, "switchover", CLUSTER, f"{CLUSTER}-7", "-n", namespace)
    assert wrong.returncode == 2
    assert (
        f"broker '{CLUSTER}-7' is not in BrokerCluster {CLUSTER} (its brokers: {', '.join(BROKERS)})"
        in wrong.stderr
    )
    assert sealed_cluster.get_json(namespace, "bc", CLUSTER)["spec"].get("preferredActive") == before
    unknown_broker = plugin(sealed_cluster, "held", "list", CLUSTER, "--broker", "elsewhere", "-n", namespace)
    assert (
        unknown_broker.returncode == 2
        and "broker 'elsewhere' is not in BrokerCluster" in unknown_broker.stderr
    )


def test_rbac_refusals_name_the_verb_and_resource(
    sealed_cluster: SealedCluster, running: str, tmp_path: Path
) -> None:
    """A user who may read BrokerClusters but not patch them nor read Secrets."""
    namespace = running
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "bc-viewer"},
        "rules": [
            {"apiGroups": ["broker.failover.dev"], "resources": ["brokerclusters"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        ],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "bc-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bc-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
    }  # fmt: skip
    sealed_cluster.kubectl("-n", namespace, "create", "serviceaccount", "viewer")
    for manifest in (role, binding):
        assert apply(sealed_cluster, namespace, manifest).returncode == 0
    token = sealed_cluster.kubectl(
        "-n", namespace, "create", "token", "viewer", "--duration=10m"
    ).stdout.strip()
    # The plugin runs in the cluster's namespaces: the server is the bridge address.
    admin = yaml.safe_load(sealed_cluster.node_kubeconfig.read_text())["clusters"][0]["cluster"]
    kubeconfig = write_kubeconfig(
        tmp_path / "viewer.yaml", server=admin["server"], ca_cert=Path(admin["certificate-authority"]),
        user="viewer", token=token,
    )  # fmt: skip

    looked = plugin(sealed_cluster, "status", CLUSTER, "-n", namespace, kubeconfig=kubeconfig)
    assert looked.returncode == 0, looked.stderr  # status works; held counts say what is missing
    assert f"forbidden: you may not get secrets in namespace {namespace}" in looked.stdout
    refused = plugin(
        sealed_cluster, "switchover", CLUSTER, BROKERS[0], "-n", namespace, kubeconfig=kubeconfig
    )
    assert refused.returncode == 1
    assert (
        f"error: forbidden: you may not patch brokerclusters.broker.failover.dev in namespace {namespace}"
        in refused.stderr
    )
    assert f"kubectl auth can-i patch brokerclusters.broker.failover.dev -n {namespace}" in refused.stderr
