"""``spec.tls`` and ``spec.activeService`` on the real kube-apiserver (issue 41, part 3a).

- The CRD's CEL rules refuse what the operator's parser refuses, in the parser's words: for
  each invalid manifest, ``parse_spec`` finds exactly one problem, and the API server's answer
  to ``kubectl apply`` carries that same text (rules and twins: tls_spec.py,
  active_service_spec.py). Valid manifests are accepted and defaulted as the parser defaults.
- The operator (its own process, in the sealed cluster's namespaces) makes the ``<name>-active``
  Service a NodePort with the template's port, policy, annotations and labels; traffic to the
  node port reaches the active broker through the operator's EndpointSlice; the Service is
  reshaped in place (NodePort, LoadBalancer, ClusterIP, with the API server allocating and
  releasing node ports and keeping the clusterIP) without touching an annotation someone else
  wrote; and made again with the template's shape after a ``kubectl delete``.

Waits are bounded failure limits, not performance assertions.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_operator.controller.spec import SpecError, parse_spec
from local_cluster.broker_pod_calls import serving_ca
from local_cluster.relay_tls import service_context
from local_cluster.sealed_cluster import SealedCluster
from tests.e2e.support import LocalProcess, installed_crd, wait_for
from tests.e2e.test_operator import (
    apply,
    broker_cluster,
    new_namespace,
    start_operator,
    start_simulator,
    wait_for_row,
)

pytestmark = pytest.mark.e2e

SECRETS = {"server": "erp-broker-tls", "operatorClient": "erp-operator-tls"}
CLIENTS = {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": ["CN=SAP-ERP-PRD,O=Example"]}
CLOUD_KEY = "service.beta.kubernetes.io/aws-load-balancer-type"  # as a cloud controller writes it


@pytest.fixture(scope="module")
def crd(sealed_cluster: SealedCluster) -> Iterator[None]:
    with installed_crd(sealed_cluster):
        yield


@pytest.fixture(scope="module")
def namespace(sealed_cluster: SealedCluster, crd: None) -> Iterator[str]:
    name = new_namespace(sealed_cluster, "tls-shape")
    yield name
    sealed_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ---- the CEL rules and their Python twins ---------------------------------------------------

INVALID = [
    pytest.param({"tls": {"mode": "Secrets"}}, id="secrets-required"),
    pytest.param({"tls": {"secrets": SECRETS}}, id="secrets-without-mode-secrets"),
    pytest.param({"tls": {"mode": "Disabled", "secrets": SECRETS}}, id="secrets-with-disabled"),
    pytest.param(
        {"tls": {"mode": "Secrets", "secrets": SECRETS, "certificates": {"validityDays": 60}}},
        id="certificates-without-mode-operator",
    ),
    pytest.param(
        {"tls": {"mode": "Disabled", "extraDNSNames": ["erp.example.com"]}}, id="extra-names-disabled"
    ),
    pytest.param({"tls": {"mode": "Disabled", "backendClients": CLIENTS}}, id="backend-clients-without-tls"),
    pytest.param(
        {"tls": {"certificates": {"validityDays": 30, "renewBeforeDays": 30}}}, id="renew-before-equal"
    ),
    pytest.param(
        {"tls": {"certificates": {"renewBeforeDays": 120}}}, id="renew-before-over-default-validity"
    ),
    pytest.param(
        {"tls": {"backendClients": {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": []}}},
        id="allowed-subjects-empty",
    ),
    pytest.param(
        {"tls": {"backendClients": {"caSecretRef": {"name": "sap-ca"}}}}, id="allowed-subjects-absent"
    ),
    pytest.param(
        {"tls": {"backendClients": {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": ["SAP-ERP-PRD"]}}},
        id="allowed-subject-not-rfc4514",
    ),
    pytest.param({"tls": {"extraDNSNames": ["ERP_Broker.example.com"]}}, id="extra-name-bad"),
    pytest.param({"tls": {"extraDNSNames": ["*.example.com"]}}, id="extra-name-wildcard"),
    pytest.param({"tls": {"clusterDomain": "cluster.local."}}, id="cluster-domain-trailing-dot"),
    pytest.param(
        {"activeService": {"loadBalancerSourceRanges": ["203.0.113.0/24"]}}, id="source-ranges-on-clusterip"
    ),
    pytest.param(
        {"activeService": {"type": "NodePort", "loadBalancerClass": "example.com/vip"}},
        id="class-on-nodeport",
    ),
    pytest.param({"activeService": {"externalTrafficPolicy": "Local"}}, id="traffic-policy-on-clusterip"),
    pytest.param({"activeService": {"nodePort": 30443}}, id="node-port-on-clusterip"),
    pytest.param(
        {"activeService": {"annotations": {"broker.failover.dev/epoch": "9"}}}, id="operators-annotation"
    ),
    pytest.param({"activeService": {"labels": {"app.kubernetes.io/name": "x"}}}, id="operators-label"),
    pytest.param(
        {"activeService": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.7"]}},
        id="source-range-not-a-cidr",
    ),
]


@pytest.mark.parametrize("spec", INVALID)
def test_the_api_server_refuses_with_the_python_parsers_words(
    sealed_cluster: SealedCluster, namespace: str, spec: dict[str, Any]
) -> None:
    with pytest.raises(SpecError) as parsed:
        parse_spec("refused", {"account": "acme", "company": "1000", **spec})
    (problem,) = parsed.value.problems
    result = apply(sealed_cluster, namespace, broker_cluster("refused", **spec))
    assert result.returncode != 0, f"accepted: {spec}"
    assert problem in " ".join(result.stderr.split()), result.stderr
    assert sealed_cluster.get_json(namespace, "bc", "refused") is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"activeService": {"type": "NodePort", "nodePort": 8443}}, "spec.activeService.nodePort"),
        ({"activeService": {"type": "Ingress"}}, "spec.activeService.type"),
        ({"tls": {"mode": "Optional"}}, "spec.tls.mode"),
        ({"tls": {"certificates": {"caValidityDays": 365}}}, "spec.tls.certificates.caValidityDays"),
    ],
)
def test_ranges_and_enums_are_refused_naming_the_field(
    sealed_cluster: SealedCluster, namespace: str, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as parsed:
        parse_spec("refused", {"account": "acme", "company": "1000", **spec})
    assert parsed.value.problems[0].startswith(field)
    result = apply(sealed_cluster, namespace, broker_cluster("refused", **spec))
    assert result.returncode != 0 and field in result.stderr, result.stderr


def test_valid_manifests_are_accepted_and_defaulted_as_the_parser_defaults(
    sealed_cluster: SealedCluster, namespace: str
) -> None:
    variants = {
        "plain": {},
        "secrets": {
            "tls": {"mode": "Secrets", "secrets": SECRETS, "backendClients": CLIENTS},
            "activeService": {
                "type": "LoadBalancer",
                "loadBalancerSourceRanges": ["203.0.113.0/24", "2001:db8::/32"],
                "externalTrafficPolicy": "Local",
                "loadBalancerClass": "example.com/internal-vip",
                "annotations": {CLOUD_KEY: "nlb"},
                "labels": {"team": "erp"},
            },
        },
        "issued": {
            "tls": {
                "extraDNSNames": ["erp-broker.example.com"],
                "certificates": {"renewBeforeDays": 10},
                "upstreamCASecretRef": {"name": "cloud-ca"},
            },
            "activeService": {"type": "NodePort", "nodePort": 30999},
        },
        "disabled": {
            "tls": {"mode": "Disabled", "upstreamCASecretRef": {"name": "cloud-ca", "key": "b.pem"}}
        },
    }
    for index, (name, spec) in enumerate(variants.items()):
        # Each a pair of its own: the operator does not run here, but pairs are per namespace.
        created = apply(
            sealed_cluster, namespace, broker_cluster(name, replicas=1, company=f"95{index:02}", **spec)
        )
        assert created.returncode == 0, (name, created.stderr)
        stored = sealed_cluster.get_json(namespace, "bc", name)["spec"]
        assert parse_spec(name, stored) == parse_spec(
            name, {**spec, "account": "acme", "company": f"95{index:02}", "replicas": 1}
        )
        sealed_cluster.kubectl("-n", namespace, "delete", "bc", name, "--wait=false")
    defaulted = apply(sealed_cluster, namespace, broker_cluster("defaults", replicas=1, company="9599"))
    assert defaulted.returncode == 0, defaulted.stderr
    stored = sealed_cluster.get_json(namespace, "bc", "defaults")["spec"]
    assert stored["tls"] == {"mode": "Operator", "clusterDomain": "cluster.local"}
    assert stored["activeService"] == {"type": "ClusterIP"}
    given = apply(
        sealed_cluster,
        namespace,
        broker_cluster("lifetimes", replicas=1, company="9598", tls={"certificates": {}}),
    )
    assert given.returncode == 0, given.stderr
    assert sealed_cluster.get_json(namespace, "bc", "lifetimes")["spec"]["tls"]["certificates"] == {
        "validityDays": 90,
        "renewBeforeDays": 30,
        "caValidityDays": 3650,
    }
    for name in ("defaults", "lifetimes"):
        sealed_cluster.kubectl("-n", namespace, "delete", "bc", name, "--wait=false")


# ---- the -active Service's shape, by the operator ---------------------------------------------


@pytest.fixture
def operator(sealed_cluster: SealedCluster, namespace: str, tmp_path: Path) -> Iterator[LocalProcess]:
    process = start_operator(sealed_cluster, namespace, tmp_path / "operator.log")
    try:
        yield process
    finally:
        process.stop()
        print(process.tail())  # shown by pytest on failure


@pytest.fixture
def simulators(sealed_cluster: SealedCluster, tmp_path: Path) -> Iterator[dict[str, str]]:
    started: list[LocalProcess] = []
    urls: dict[str, str] = {}
    try:
        for role in ("backend", "cloud"):
            process, urls[role] = start_simulator(sealed_cluster, role, tmp_path / f"{role}.log")
            started.append(process)
        yield urls
    finally:
        for process in started:
            process.stop()


def free_node_port(cluster: SealedCluster, namespace: str) -> int:
    """A port of the node-port range no Service holds now (the test asks for a fixed one)."""
    services = json.loads(cluster.kubectl("get", "services", "--all-namespaces", "-o", "json").stdout)
    held = {
        port.get("nodePort")
        for service in services.get("items", [])
        for port in (service.get("spec") or {}).get("ports") or []
    }
    with socket.socket() as probe:  # a varying start, so that reruns do not meet a port in release
        probe.bind(("127.0.0.1", 0))
        start = 30000 + probe.getsockname()[1] % 2000
    return next(port for port in range(start, 32768) if port not in held)


def node_address(cluster: SealedCluster) -> str:
    """The node's InternalIP: where kube-proxy (nftables mode) serves node ports by default."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return str(next(a["address"] for a in nodes[0]["status"]["addresses"] if a["type"] == "InternalIP"))


def service(cluster: SealedCluster, namespace: str) -> dict[str, Any]:
    return dict(cluster.get_json(namespace, "service", "shaped-active") or {"spec": {}, "metadata": {}})


def service_once(cluster: SealedCluster, namespace: str, description: str, shaped: Any) -> dict[str, Any]:
    """The Service, once ``shaped(spec)`` holds of it (and it exists)."""

    def probe() -> dict[str, Any] | None:
        found = service(cluster, namespace)
        return found if found["spec"] and shaped(found["spec"]) else None

    return dict(wait_for(f"service shaped-active {description}", probe))


def patch_spec(cluster: SealedCluster, namespace: str, active_service: dict[str, Any]) -> None:
    patch = json.dumps({"spec": {"activeService": active_service}})
    cluster.kubectl("-n", namespace, "patch", "bc", "shaped", "--type=merge", "-p", patch)


def test_the_active_service_takes_the_templates_shape_keeps_others_keys_and_comes_back(
    sealed_cluster: SealedCluster, namespace: str, operator: LocalProcess, simulators: dict[str, str]
) -> None:
    node_port = free_node_port(sealed_cluster, namespace)
    template = {
        "type": "NodePort",
        "nodePort": node_port,
        "externalTrafficPolicy": "Local",
        "annotations": {"lb.example/idle-timeout": "60", "lb.example/internal": "true"},
        "labels": {"team": "erp"},
    }
    manifest = broker_cluster(
        "shaped",
        replicas=1,
        company="9600",
        backend={"url": simulators["backend"]},
        cloud={"url": simulators["cloud"]},
        activeService=template,
    )
    created = apply(sealed_cluster, namespace, manifest)
    assert created.returncode == 0, created.stderr

    made = service_once(sealed_cluster, namespace, "made", lambda spec: True)
    spec, metadata = made["spec"], made["metadata"]
    assert (spec["type"], spec["externalTrafficPolicy"]) == ("NodePort", "Local")
    assert [(p["name"], p["port"], p["nodePort"]) for p in spec["ports"]] == [("soap", 8080, node_port)]
    assert "selector" not in spec
    assert metadata["annotations"]["lb.example/idle-timeout"] == "60"
    assert metadata["labels"]["team"] == "erp"
    cluster_ip = spec["clusterIP"]

    # Traffic to the node port reaches the active broker through the operator's EndpointSlice
    # (externalTrafficPolicy Local: this node has the active, so it answers).
    wait_for_row(
        sealed_cluster, namespace, "shaped", "shaped-0 active", lambda r: r["ACTIVE"] == "shaped-0", 120
    )
    # Over TLS (the brokers serve it by default), verified under the Service's DNS name against
    # the cluster's CA, as a backend outside the cluster would dial the node.
    url = f"https://{node_address(sealed_cluster)}:{node_port}/healthz"
    context = service_context(
        serving_ca(sealed_cluster, namespace, "shaped"), f"shaped-active.{namespace}.svc.cluster.local"
    )
    answer = wait_for("the node port answers", lambda: _get(sealed_cluster, url, context))
    assert answer

    # A cloud controller writes keys of its own; the operator never takes them away.
    sealed_cluster.kubectl("-n", namespace, "annotate", "service", "shaped-active", f"{CLOUD_KEY}=nlb")
    patch_spec(
        sealed_cluster,
        namespace,
        {
            "type": "LoadBalancer",
            "nodePort": None,
            "annotations": {"lb.example/idle-timeout": "60", "lb.example/internal": None},
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
        },
    )
    balanced = service_once(
        sealed_cluster, namespace, "a LoadBalancer", lambda spec: spec["type"] == "LoadBalancer"
    )
    assert balanced["spec"]["clusterIP"] == cluster_ip
    assert balanced["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert balanced["spec"]["ports"][0]["nodePort"] == node_port  # allocated before: the API server keeps it
    annotations = balanced["metadata"]["annotations"]
    assert annotations[CLOUD_KEY] == "nlb" and "lb.example/internal" not in annotations

    # Back to ClusterIP: the node port and the external fields go, the clusterIP stays.
    patch_spec(
        sealed_cluster,
        namespace,
        {"type": "ClusterIP", "externalTrafficPolicy": None, "loadBalancerSourceRanges": None},
    )
    inside = service_once(sealed_cluster, namespace, "a ClusterIP", lambda spec: spec["type"] == "ClusterIP")
    assert inside["spec"]["clusterIP"] == cluster_ip
    assert "nodePort" not in inside["spec"]["ports"][0]
    assert (
        not {"externalTrafficPolicy", "loadBalancerSourceRanges", "healthCheckNodePort"}
        & inside["spec"].keys()
    )
    assert inside["metadata"]["annotations"][CLOUD_KEY] == "nlb"

    # NodePort again, then deleted by hand: it comes back in the template's shape.
    patch_spec(sealed_cluster, namespace, {"type": "NodePort", "nodePort": node_port})
    service_once(
        sealed_cluster,
        namespace,
        "a NodePort again",
        lambda spec: spec["ports"][0].get("nodePort") == node_port,
    )
    uid = service(sealed_cluster, namespace)["metadata"]["uid"]
    sealed_cluster.kubectl("-n", namespace, "delete", "service", "shaped-active")
    remade = wait_for(
        "service shaped-active made again",
        lambda: (
            (found := service(sealed_cluster, namespace))["metadata"].get("uid") not in (None, uid) and found
        ),
    )
    assert remade["spec"]["type"] == "NodePort"
    assert remade["spec"]["ports"][0]["nodePort"] == node_port
    assert remade["metadata"]["annotations"]["lb.example/idle-timeout"] == "60"
    assert "selector" not in remade["spec"]
    wait_for("the node port answers again", lambda: _get(sealed_cluster, url, context))
    sealed_cluster.kubectl("-n", namespace, "delete", "bc", "shaped", "--wait=false")


def _get(cluster: SealedCluster, url: str, context: ssl.SSLContext) -> str | None:
    def call() -> str:
        with urllib.request.urlopen(url, timeout=3, context=context) as response:
            return str(response.read().decode())

    try:
        return cluster.call_in_network(call, timeout=23)
    except OSError:
        return None
