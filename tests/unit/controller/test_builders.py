"""The pods, claims, Services and Secret a BrokerCluster owns, built without Kubernetes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from broker_contracts.token_verifier import token_verifier
from broker_operator.controller import (
    active_service,
    active_service_shape,
    builders,
    names,
    network_policy,
    verifiers,
)
from broker_operator.controller.spec import parse_spec

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_a_decimal_lease_reaches_the_broker_with_every_digit() -> None:
    spec = parse_spec(
        "orders",
        {
            "account": "acme",
            "company": "1000",
            "heartbeat": {"intervalSeconds": 0.2, "timeoutSeconds": 0.2, "leaseSeconds": 1234.5678},
            "backend": {"url": "https://erp.example"},
            "cloud": {"url": "https://cloud.example/api"},
        },
    )
    env = env_of(builders.build_pod(OWNER, 0, spec, active=False))
    assert float(env["BROKER_LEASE_SECONDS"]) == 1234.5678, env["BROKER_LEASE_SECONDS"]


def test_pod_runs_the_broker_cli_from_the_spec() -> None:
    spec = parse_spec(
        "orders",
        {
            "account": "acme",
            "company": "1000",
            "heartbeat": {"leaseSeconds": 7},
            "delivery": {"maxDeliveries": 3, "onPoison": "Hold"},
            "backend": {"urlSecretRef": {"name": "erp-backend"}},
            "cloud": {"url": "https://cloud.example/api"},
        },
    )
    pod = builders.build_pod(OWNER, 1, spec, active=False)
    env = env_of(pod)
    assert pod["metadata"]["name"] == "orders-1"
    assert env["BROKER_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["BROKER_PORT"] == "8080"
    assert (env["BROKER_CLUSTER"], env["BROKER_ACCOUNT"], env["BROKER_COMPANY"]) == ("orders", "acme", "1000")
    assert (env["BROKER_LEASE_SECONDS"], env["BROKER_MAX_DELIVERIES"], env["BROKER_ON_POISON"]) == (
        "7",
        "3",
        "Hold",
    )
    assert env["BROKER_BACKEND_URL"] == {"secretKeyRef": {"name": "erp-backend", "key": "url"}}
    assert env["BROKER_CLOUD_URL"] == "https://cloud.example/api"
    assert env["BROKER_DATA_DIR"] == names.DATA_MOUNT
    assert env["BROKER_TOKEN_VERIFIER_FILE"] == f"{names.TOKEN_MOUNT}/operator-token.sha256"
    assert env["BROKER_BACKEND_TOKEN_VERIFIER_FILE"] == f"{names.TOKEN_MOUNT}/backend-token.sha256"
    labels = pod["metadata"]["labels"]
    assert labels[names.LABEL_APP] == "broker"
    assert labels[names.LABEL_CLUSTER] == "orders"
    assert labels[names.LABEL_ROLE] == "standby"
    assert labels[names.LABEL_ORDINAL] == "1"
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["image"] == "localhost/broker-failover/broker:0.1.0"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["journal"]["persistentVolumeClaim"]["claimName"] == "journal-orders-1"
    assert volumes["token-verifiers"]["secret"]["secretName"] == "orders-broker-verifiers"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["token-verifiers"] == {
        "name": "token-verifiers",
        "mountPath": names.TOKEN_MOUNT,
        "readOnly": True,
    }
    assert "emptyDir" in volumes["message-log"]


def test_every_child_but_a_retained_claim_is_owned_by_the_cluster() -> None:
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    # The default whenDeleted is Retain: a journal outlives its BrokerCluster unless asked otherwise.
    assert "ownerReferences" not in builders.build_journal_claim(OWNER, 0, spec)["metadata"]
    deleted = parse_spec(
        "orders",
        {"account": "a", "company": "c", "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}},
    )
    children = [
        builders.build_pod(OWNER, 0, spec, active=True),
        builders.build_journal_claim(OWNER, 0, deleted),
        builders.build_headless_service(OWNER),
        active_service_shape.build_active_service(OWNER),
        active_service.build_active_endpoint_slice(OWNER, None, 1),
        verifiers.build_token_secret(OWNER),
        verifiers.build_backend_token_secret(OWNER),
    ]
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "BrokerCluster",
            "orders",
            "uid-1",
            True,
        )
        assert child["metadata"]["namespace"] == "erp"


def test_active_service_selects_nothing_its_slice_names_the_active_under_its_epoch() -> None:
    service = active_service_shape.build_active_service(OWNER)
    assert service["metadata"]["name"] == "orders-active"
    assert "selector" not in service["spec"]  # the operator writes its endpoints
    endpoint = active_service.ActiveEndpoint(
        pod="orders-1", address="10.244.0.7", port=8080, uid="u-7", node="n1"
    )
    slice_ = active_service.build_active_endpoint_slice(OWNER, endpoint, 7)
    labels, annotations = slice_["metadata"]["labels"], slice_["metadata"]["annotations"]
    assert slice_["metadata"]["name"] == "orders-active"
    assert labels["kubernetes.io/service-name"] == "orders-active"
    assert labels["endpointslice.kubernetes.io/managed-by"] != "endpointslice-controller.k8s.io"
    assert annotations == {"broker.failover.dev/epoch": "7", "broker.failover.dev/active": "orders-1"}
    assert slice_["ports"] == [{"name": "soap", "port": 8080, "protocol": "TCP"}]  # the Service's port name
    (only,) = slice_["endpoints"]
    assert only["addresses"] == ["10.244.0.7"] and only["conditions"]["ready"] is True
    assert only["targetRef"] == {"kind": "Pod", "namespace": "erp", "name": "orders-1", "uid": "u-7"}
    nobody = active_service.build_active_endpoint_slice(OWNER, None, 8)
    assert nobody["endpoints"] == [] and nobody["metadata"]["annotations"]["broker.failover.dev/epoch"] == "8"
    headless = builders.build_headless_service(OWNER)
    assert headless["spec"]["clusterIP"] == "None"
    assert names.LABEL_ROLE not in headless["spec"]["selector"]


def test_claim_size_and_class_come_from_the_spec() -> None:
    spec = parse_spec(
        "orders", {"account": "a", "company": "c", "storage": {"size": "5Gi", "storageClassName": "ssd"}}
    )
    claim = builders.build_journal_claim(OWNER, 1, spec)
    assert claim["metadata"]["name"] == "journal-orders-1"
    assert claim["metadata"]["labels"][names.LABEL_ORDINAL] == "1"
    assert claim["metadata"]["labels"][names.LABEL_CLUSTER] == "orders"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "ssd"
    assert (
        "storageClassName"
        not in builders.build_journal_claim(OWNER, 1, parse_spec("o", {"account": "a", "company": "c"}))[
            "spec"
        ]
    )


def test_broker_pods_mount_the_verifiers_and_neither_a_token_nor_a_service_account_token() -> None:
    # Issue 39 item 5: a broker holds what verifies a token, never the token (whoever controls a
    # broker could otherwise call its peers), and no API credential it never uses.
    auth = {"tokenSecretRef": {"name": "mine", "key": "k"}, "backendTokenSecretRef": {"name": "erp"}}
    for spec in (
        parse_spec("orders", {"account": "a", "company": "c"}),
        parse_spec("orders", {"account": "a", "company": "c", "auth": auth}),
    ):
        pod = builders.build_pod(OWNER, 0, spec, active=False)
        assert pod["spec"]["automountServiceAccountToken"] is False
        secrets = [v["secret"] for v in pod["spec"]["volumes"] if "secret" in v]
        assert secrets == [
            {
                "secretName": "orders-broker-verifiers",
                "items": [
                    {"key": "operator-token.sha256", "path": "operator-token.sha256"},
                    {"key": "backend-token.sha256", "path": "backend-token.sha256"},
                ],
            }
        ]
        (container,) = pod["spec"]["containers"]
        for variable in container["env"]:
            assert "secretKeyRef" not in str(variable) or variable["name"].endswith("_URL"), variable
        assert not {"BROKER_TOKEN", "BROKER_BACKEND_TOKEN", "BROKER_TOKEN_FILE"} & set(env_of(pod))


def test_the_verifier_secret_holds_the_tokens_hashes_and_never_a_token() -> None:
    operator_token, backend_token = "o" * 43, "b" * 43
    secret = verifiers.build_verifier_secret(OWNER, operator_token, backend_token)
    assert secret["metadata"]["name"] == "orders-broker-verifiers"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert secret["stringData"] == {
        "operator-token.sha256": token_verifier(operator_token),
        "backend-token.sha256": token_verifier(backend_token),
    }
    assert operator_token not in json.dumps(secret) and backend_token not in json.dumps(secret)


def test_generated_tokens_are_random() -> None:
    first = verifiers.build_token_secret(OWNER)["stringData"]["token"]
    second = verifiers.build_token_secret(OWNER)["stringData"]["token"]
    backend = verifiers.build_backend_token_secret(OWNER)
    assert len({first, second, backend["stringData"]["token"]}) == 3
    assert len(first) >= 32
    assert backend["metadata"]["name"] == "orders-backend-token"


def test_template_hash_follows_the_spec_not_the_role() -> None:
    base = parse_spec("orders", {"account": "a", "company": "c"})
    changed = parse_spec("orders", {"account": "a", "company": "c", "image": "broker-failover/broker:0.2.0"})
    active = builders.build_pod(OWNER, 0, base, active=True)
    standby = builders.build_pod(OWNER, 1, base, active=False)
    key = names.ANNOTATION_TEMPLATE_HASH
    assert active["metadata"]["annotations"][key] == standby["metadata"]["annotations"][key]
    assert builders.template_hash("orders", base) != builders.template_hash("orders", changed)


def test_the_handover_cap_reaches_the_pod_but_not_its_template_hash() -> None:
    # Issue 40: an operator upgrade that adds the cap must not replace every broker pod (a
    # switchover per cluster); the pod's env carries it, the hash is what the earlier version made.
    base = parse_spec("orders", {"account": "a", "company": "c"})
    longer = parse_spec("orders", {"account": "a", "company": "c", "heartbeat": {"handoverLeaseSeconds": 90}})
    pod = builders.build_pod(OWNER, 0, base, active=False)
    assert env_of(pod)["BROKER_MAX_LEASE_SECONDS"] == "30"
    assert env_of(builders.build_pod(OWNER, 0, longer, active=False))["BROKER_MAX_LEASE_SECONDS"] == "90"
    assert builders.template_hash("orders", base) == builders.template_hash("orders", longer)
    container = builders.broker_container("orders", base)
    container["env"] = [e for e in container["env"] if e["name"] != "BROKER_MAX_LEASE_SECONDS"]
    container["resources"] = {}  # the default requests are out of the hash too (issue 42)
    earlier = {
        "container": container,
        "volumes": builders.pod_volumes("orders", 0, base),
        "securityContext": builders.pod_security_context(base),
    }
    encoded = json.dumps(earlier, sort_keys=True, separators=(",", ":")).encode()
    assert builders.template_hash("orders", base) == hashlib.sha256(encoded).hexdigest()[:16]


def test_broker_pods_serve_the_operator_on_a_named_admin_port_and_probes_stay_on_the_main_one() -> None:
    pod = builders.build_pod(OWNER, 0, parse_spec("orders", {"account": "a", "company": "c"}), active=False)
    (container,) = pod["spec"]["containers"]
    assert container["ports"] == [
        {"name": "soap", "containerPort": 8080, "protocol": "TCP"},
        {"name": "admin", "containerPort": 8081, "protocol": "TCP"},
    ]
    assert env_of(pod)["BROKER_ADMIN_PORT"] == "8081"
    assert (
        container["readinessProbe"]["httpGet"]["port"]
        == container["livenessProbe"]["httpGet"]["port"]
        == "soap"
    )
    # Producers reach the main port only: the Services keep the one port.
    for service in (active_service_shape.build_active_service(OWNER), builders.build_headless_service(OWNER)):
        assert [p["name"] for p in service["spec"]["ports"]] == ["soap"]


OPERATOR_PODS = network_policy.OperatorPods("broker-system", (("app.kubernetes.io/instance", "bf"),))
OPERATOR_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "broker-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "bf"}},
}


def test_the_network_policy_admits_the_admin_port_from_the_operator_and_send_messages_from_the_sources() -> (
    None
):
    backend = {"ipBlock": {"cidr": "10.20.0.0/16"}}
    spec = parse_spec(
        "orders",
        {"account": "a", "company": "c", "networkPolicy": {"enabled": True, "sendMessagesFrom": [backend]}},
    )
    policy = network_policy.build_network_policy(OWNER, spec, OPERATOR_PODS)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "orders-brokers-ingress"
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("BrokerCluster", "orders", "uid-1")
    assert policy["spec"]["podSelector"] == {"matchLabels": builders.cluster_labels("orders")}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [
        {"from": [OPERATOR_PEER], "ports": [{"protocol": "TCP", "port": "admin"}]},
        # The operator too: a pod from before the admin port takes its heartbeats on the main port.
        {"from": [backend, OPERATOR_PEER], "ports": [{"protocol": "TCP", "port": "soap"}]},
    ]


def test_without_sources_the_main_port_admits_everyone_and_without_labels_the_operators_namespace() -> None:
    spec = parse_spec("orders", {"account": "a", "company": "c", "networkPolicy": {"enabled": True}})
    policy = network_policy.build_network_policy(OWNER, spec, network_policy.OperatorPods("ops"))
    admin, main = policy["spec"]["ingress"]
    assert admin["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]
    assert main == {"ports": [{"protocol": "TCP", "port": "soap"}]}  # no `from`: every source


DNS_RULE = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def test_the_network_policy_is_on_by_default_and_limits_the_brokers_egress() -> None:
    # Issue 39 item 5: on unless turned off, and egress too: DNS, and TCP to the backend, the
    # cloud and the message-log store, which may be anywhere, but never the link-local range of
    # the cloud's metadata service (a node's cloud credentials).
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    assert spec.network_policy is not None
    assert (
        parse_spec(
            "orders", {"account": "a", "company": "c", "networkPolicy": {"enabled": False}}
        ).network_policy
        is None
    )
    policy = network_policy.build_network_policy(OWNER, spec, OPERATOR_PODS)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress = policy["spec"]["egress"]
    assert egress[0] == DNS_RULE
    peers = [peer for rule in egress[1:] for peer in rule["to"]]
    assert {"namespaceSelector": {}} in peers  # in-cluster backends, clouds and stores
    blocks = {
        peer["ipBlock"]["cidr"]: peer["ipBlock"].get("except", []) for peer in peers if "ipBlock" in peer
    }
    assert blocks == {"0.0.0.0/0": ["169.254.0.0/16"], "::/0": ["fe80::/10", "fd00:ec2::254/128"]}
    assert all(rule.get("ports") == [{"protocol": "TCP"}] for rule in egress[1:])


def test_listed_egress_peers_replace_the_default_destinations() -> None:
    store = {"ipBlock": {"cidr": "10.9.0.0/16"}}
    erp = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "erp"}}}
    spec = parse_spec(
        "orders",
        {"account": "a", "company": "c", "networkPolicy": {"egressTo": [erp, store]}},
    )
    policy = network_policy.build_network_policy(OWNER, spec, OPERATOR_PODS)
    assert policy["spec"]["egress"] == [DNS_RULE, {"to": [erp, store], "ports": [{"protocol": "TCP"}]}]


RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def test_broker_pods_run_as_the_images_non_root_user_on_a_read_only_root() -> None:
    pod = builders.build_pod(OWNER, 0, parse_spec("orders", {"account": "a", "company": "c"}), active=True)
    assert pod["spec"]["securityContext"] == RESTRICTED_POD
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == RESTRICTED_CONTAINER
    # Read-only root: the broker writes to its journal and message-log volumes only, and both are
    # writable volumes (fsGroup makes them the broker's); nothing else is mounted writable.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    # The message-log store is mounted at its cluster's own directory only (see the next test).
    assert writable == {names.DATA_MOUNT, "/var/lib/broker/message-log/orders"}
    for mount in container["volumeMounts"]:
        if mount["mountPath"] in writable:
            assert {"persistentVolumeClaim", "emptyDir"} & volumes[mount["name"]].keys(), mount
    env = env_of(pod)
    assert {env["BROKER_DATA_DIR"], f"{env['BROKER_MESSAGE_LOG_DIR']}/orders"} == writable


def test_a_broker_mounts_only_its_own_clusters_part_of_the_message_log_store() -> None:
    """issue 39: every cluster's brokers share one claim; a broker must not reach another cluster's
    segments, nor the validator's checkpoint and reports under ``.validator/`` at the claim's root."""
    spec = parse_spec("orders", {"account": "a", "company": "c", "messageLog": {"claimName": "message-log"}})
    pod = builders.build_pod(OWNER, 0, spec, active=False)
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == names.MESSAGE_LOG_VOLUME]
    assert mount["subPath"] == "orders"
    # The broker writes <BROKER_MESSAGE_LOG_DIR>/<cluster>/<broker>/: exactly inside the mount.
    assert mount["mountPath"] == f"{env_of(pod)['BROKER_MESSAGE_LOG_DIR']}/orders"
    assert "subPathExpr" not in mount and not mount.get("readOnly")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[names.MESSAGE_LOG_VOLUME]["persistentVolumeClaim"] == {"claimName": "message-log"}


def test_every_pod_gets_its_own_copy_of_the_default_security_context() -> None:
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    first = builders.build_pod(OWNER, 0, spec, active=True)
    first["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    first["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    second = builders.build_pod(OWNER, 1, spec, active=False)
    assert second["spec"]["securityContext"] == RESTRICTED_POD
    assert second["spec"]["containers"][0]["securityContext"] == RESTRICTED_CONTAINER


def test_a_given_security_context_replaces_the_default_whole_and_rolls_the_pods() -> None:
    # OpenShift's restricted SCC assigns the user id itself: the fixed ids must be droppable.
    assigned = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {**RESTRICTED_CONTAINER, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    base = parse_spec("orders", {"account": "a", "company": "c"})
    given = parse_spec(
        "orders",
        {"account": "a", "company": "c", "podSecurityContext": assigned, "securityContext": container},
    )
    pod = builders.build_pod(OWNER, 0, given, active=False)
    assert pod["spec"]["securityContext"] == assigned
    assert pod["spec"]["containers"][0]["securityContext"] == container
    # Each field is part of the pod template: changing either one replaces the pods.
    pod_only = parse_spec("orders", {"account": "a", "company": "c", "podSecurityContext": assigned})
    container_only = parse_spec("orders", {"account": "a", "company": "c", "securityContext": container})
    hashes = {builders.template_hash("orders", s) for s in (base, given, pod_only, container_only)}
    assert len(hashes) == 4
    # Spelling out the default is the default: no roll.
    explicit = parse_spec(
        "orders",
        {
            "account": "a",
            "company": "c",
            "podSecurityContext": RESTRICTED_POD,
            "securityContext": RESTRICTED_CONTAINER,
        },
    )
    assert builders.template_hash("orders", explicit) == builders.template_hash("orders", base)


def test_an_empty_security_context_means_none_not_the_default() -> None:
    spec = parse_spec(
        "orders", {"account": "a", "company": "c", "podSecurityContext": {}, "securityContext": {}}
    )
    pod = builders.build_pod(OWNER, 0, spec, active=False)
    assert pod["spec"]["securityContext"] == {}
    assert pod["spec"]["containers"][0]["securityContext"] == {}


def _anti_affinity_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    rules = pod["spec"]["affinity"]["podAntiAffinity"]
    return [entry["podAffinityTerm"] for entry in rules["preferredDuringSchedulingIgnoredDuringExecution"]]


def test_by_default_a_clusters_brokers_prefer_different_nodes_and_only_its_own_pods_count() -> None:
    spec = parse_spec("orders", {"account": "a", "company": "c", "replicas": 3})
    pods = [builders.build_pod(OWNER, ordinal, spec, active=ordinal == 0) for ordinal in range(3)]
    for pod in pods:
        (term,) = _anti_affinity_terms(pod)
        assert term["topologyKey"] == "kubernetes.io/hostname"
        # The selector matches every broker of this cluster (whatever its role or ordinal) and no
        # other cluster's: spreading must not push two clusters apart.
        selector = term["labelSelector"]["matchLabels"]
        assert all(p["metadata"]["labels"].items() >= selector.items() for p in pods)
        other = builders.build_pod(
            {**OWNER, "metadata": {**OWNER["metadata"], "name": "invoices"}},
            0,
            parse_spec("invoices", {"account": "a", "company": "d"}),
            active=True,
        )
        assert not other["metadata"]["labels"].items() >= selector.items()
        assert (
            "requiredDuringSchedulingIgnoredDuringExecution" not in pod["spec"]["affinity"]["podAntiAffinity"]
        )
        assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]


def test_a_given_affinity_replaces_the_spread_and_scheduling_fields_roll_the_pods() -> None:
    required = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"x": "y"}}}
            ]
        }
    }
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "erp", "effect": "NoSchedule"}]
    base = parse_spec("orders", {"account": "a", "company": "c"})
    given = parse_spec(
        "orders",
        {
            "account": "a",
            "company": "c",
            "affinity": required,
            "nodeSelector": {"zone": "a"},
            "tolerations": tolerations,
        },
    )
    pod = builders.build_pod(OWNER, 0, given, active=False)
    assert pod["spec"]["affinity"] == required
    assert pod["spec"]["nodeSelector"] == {"zone": "a"}
    assert pod["spec"]["tolerations"] == tolerations
    none = builders.build_pod(
        OWNER, 0, parse_spec("orders", {"account": "a", "company": "c", "affinity": {}}), active=False
    )
    assert none["spec"]["affinity"] == {}
    # Each given field changes the template (a roll); the default spread does not, so pods made
    # by an operator that did not spread yet keep their hash.
    variants = [
        base,
        given,
        parse_spec("orders", {"account": "a", "company": "c", "affinity": {}}),
        parse_spec("orders", {"account": "a", "company": "c", "nodeSelector": {"zone": "a"}}),
        parse_spec("orders", {"account": "a", "company": "c", "tolerations": tolerations}),
    ]
    assert len({builders.template_hash("orders", spec) for spec in variants}) == len(variants)
    container = builders.broker_container("orders", base)
    container["env"] = [e for e in container["env"] if e["name"] != "BROKER_MAX_LEASE_SECONDS"]  # issue 40
    container["resources"] = {}  # issue 42
    without_scheduling = {
        "container": container,
        "volumes": builders.pod_volumes("orders", 0, base),
        "securityContext": builders.pod_security_context(base),
    }
    expected = hashlib.sha256(json.dumps(without_scheduling, sort_keys=True, separators=(",", ":")).encode())
    assert builders.template_hash("orders", base) == expected.hexdigest()[:16]


def test_the_disruption_budget_covers_only_the_active_and_lets_it_go_only_when_told() -> None:
    held = builders.build_active_disruption_budget(OWNER, evictable=False)
    assert (held["apiVersion"], held["kind"], held["metadata"]["name"]) == (
        "policy/v1",
        "PodDisruptionBudget",
        "orders-active",
    )
    assert held["spec"]["minAvailable"] == 1
    assert builders.build_active_disruption_budget(OWNER, evictable=True)["spec"]["minAvailable"] == 0
    selector = held["spec"]["selector"]["matchLabels"]
    spec = parse_spec("orders", {"account": "a", "company": "c"})
    active, standby = (builders.build_pod(OWNER, i, spec, active=i == 0) for i in (0, 1))
    assert active["metadata"]["labels"].items() >= selector.items()
    assert not standby["metadata"]["labels"].items() >= selector.items()
    assert held["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
