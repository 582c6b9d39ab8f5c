"""Issue 42's pod knobs: read and checked as the CRD does, and landing where they belong in the pod;
the broker image and pull secrets of the operator's settings; the default requests; and the pod
template's hash, which an operator upgrade alone must not move."""

from __future__ import annotations

from typing import Any

import pytest

from broker_operator.controller import builders, names, pod_spec
from broker_operator.controller.pod_fields import DEFAULT_BROKER_IMAGE, DEFAULT_REQUESTS, PodDefaults
from broker_operator.controller.pod_spec import PodSpec
from broker_operator.controller.spec import FORMER_DEFAULT_IMAGE, SpecError, parse_spec
from tests.unit.controller.cel_messages import rendered, rules_below, spec_schema

OWNER: dict[str, Any] = {
    "apiVersion": "broker.failover.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
}
REGISTRY = PodDefaults(
    image="registry.example.com/broker-failover/broker:0.1.0", image_pull_secrets=("regcred",)
)
ZONE_SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "DoNotSchedule",
}


def minimal(**extra: Any) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **extra}


def problems_of(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as refused:
        parse_spec("orders", spec)
    return list(refused.value.problems)


def pod_of(spec: dict[str, Any], **build: Any) -> dict[str, Any]:
    return builders.build_pod(OWNER, 1, parse_spec("orders", spec), active=False, **build)


# ---- reading ---------------------------------------------------------------------------------


def test_without_knobs_nothing_is_set() -> None:
    assert parse_spec("orders", minimal()).pod == PodSpec()


def test_every_knob_is_read_as_written() -> None:
    spread = [{**ZONE_SPREAD, "nodeTaintsPolicy": "Honor", "minDomains": 2}]
    spec = parse_spec(
        "orders",
        minimal(
            imagePullSecrets=[{"name": "erp-registry"}, {"name": "mirror.pull"}],
            topologySpreadConstraints=spread,
            priorityClassName="broker-critical",
            serviceAccountName="broker-s3-writer",
            podMetadata={"labels": {"team": "erp"}, "annotations": {"example.com/cost-centre": "4711"}},
        ),
    ).pod
    assert spec == PodSpec(
        image_pull_secrets=("erp-registry", "mirror.pull"),
        topology_spread_constraints=tuple(spread),
        priority_class_name="broker-critical",
        service_account_name="broker-s3-writer",
        labels={"team": "erp"},
        annotations={"example.com/cost-centre": "4711"},
    )
    # An empty list is a choice of its own: no zone spread at all.
    assert parse_spec("orders", minimal(topologySpreadConstraints=[])).pod.topology_spread_constraints == ()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        pytest.param(
            {"imagePullSecrets": "regcred"},
            "spec.imagePullSecrets must be a list of at most 16 {name} objects, got 'regcred'",
            id="pull-secrets-not-a-list",
        ),
        pytest.param(
            {"imagePullSecrets": [{"secret": "regcred"}]},
            "spec.imagePullSecrets[0] must name a Secret: {name}, got {'secret': 'regcred'}",
            id="pull-secret-without-name",
        ),
        pytest.param(
            {"imagePullSecrets": [{"name": "Reg_Cred"}]},
            "spec.imagePullSecrets[0].name ('Reg_Cred') must be a name of at most 253 characters: "
            "lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
            id="pull-secret-bad-name",
        ),
        pytest.param(
            {"imagePullSecrets": [{"name": "a"}, {"name": "a"}]},
            "spec.imagePullSecrets names a Secret more than once: a",
            id="pull-secret-twice",
        ),
        pytest.param(
            {"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]},
            "spec.imagePullSecrets must be a list of at most 16 {name} objects, got "
            + repr([{"name": f"s{i}"} for i in range(17)]),
            id="too-many-pull-secrets",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "maxSkew": None}]},
            "spec.topologySpreadConstraints[0].maxSkew is required",
            id="spread-without-skew",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "maxSkew": 0}]},
            "spec.topologySpreadConstraints[0].maxSkew (0) must be an integer from 1 to 100",
            id="spread-skew-zero",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "whenUnsatisfiable": "Never"}]},
            "spec.topologySpreadConstraints[0].whenUnsatisfiable ('Never') must be one of DoNotSchedule, "
            "ScheduleAnyway",
            id="spread-bad-when",
        ),
        pytest.param(
            {"topologySpreadConstraints": [{**ZONE_SPREAD, "topologyKey": ""}]},
            "spec.topologySpreadConstraints[0].topologyKey ('') must be a node label key, e.g. "
            "topology.kubernetes.io/zone",
            id="spread-empty-key",
        ),
        pytest.param(
            {"topologySpreadConstraints": {"zone": 1}},
            "spec.topologySpreadConstraints must be a list of at most 8 core/v1 TopologySpreadConstraints, "
            "got {'zone': 1}; leave it out for the operator's spread",
            id="spread-not-a-list",
        ),
        pytest.param(
            {"priorityClassName": "Critical"},
            "spec.priorityClassName ('Critical') must be a name of at most 253 characters: lower-case "
            "letters, digits, '-' and '.', starting and ending with a letter or digit",
            id="priority-class-bad-name",
        ),
        pytest.param(
            {"serviceAccountName": ""},
            "spec.serviceAccountName ('') must be a name of at most 253 characters: lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit",
            id="service-account-empty",
        ),
        pytest.param(
            {"podMetadata": {"labels": {"tier": 1}}},
            "spec.podMetadata.labels must map at most 64 keys to strings, got {'tier': 1}",
            id="label-not-a-string",
        ),
        pytest.param(
            {"podMetadata": ["team=erp"]},
            "spec.podMetadata must be an object with labels and annotations, got ['team=erp']",
            id="metadata-not-an-object",
        ),
        pytest.param(
            {"image": ""},
            "spec.image ('') must be an image reference of at most 512 characters; leave it out for the "
            "operator's --broker-image",
            id="image-empty",
        ),
    ],
)
def test_bad_knobs_are_refused_naming_the_field(given: dict[str, Any], message: str) -> None:
    assert problems_of(minimal(**given)) == [message]


@pytest.mark.parametrize(
    "key", ["app.kubernetes.io/name", "app.kubernetes.io/managed-by", "role", "broker.failover.dev/cluster"]
)
def test_the_operators_labels_are_refused_in_the_crds_words(key: str) -> None:
    # Refused, not ignored: a pod that silently lacks a label someone's selector counts on lies.
    (problem,) = problems_of(minimal(podMetadata={"labels": {key: "mine"}}))
    assert problem == pod_spec.LABELS_RESERVED_MESSAGE
    ((_, rule),) = rules_below("podMetadata.labels")
    assert rendered(rule, {}) == problem


def test_the_operators_annotations_are_refused_in_the_crds_words() -> None:
    spec = minimal(podMetadata={"annotations": {"broker.failover.dev/template-hash": "0"}})
    (problem,) = problems_of(spec)
    assert problem == pod_spec.ANNOTATIONS_RESERVED_MESSAGE
    ((_, rule),) = rules_below("podMetadata.annotations")
    assert rendered(rule, {}) == problem
    # Other keys, the app.kubernetes.io/ ones that are not the operator's included, are the user's.
    fine = minimal(podMetadata={"labels": {"app.kubernetes.io/part-of": "erp", "roles": "x"}})
    assert parse_spec("orders", fine).pod.labels == {"app.kubernetes.io/part-of": "erp", "roles": "x"}


def test_every_new_field_is_bounded_in_the_crd() -> None:
    properties = spec_schema()["properties"]
    assert properties["imagePullSecrets"]["maxItems"] == pod_spec.PULL_SECRETS_MAX
    assert properties["imagePullSecrets"]["x-kubernetes-list-map-keys"] == ["name"]
    assert properties["imagePullSecrets"]["items"]["properties"]["name"]["maxLength"] == pod_spec.NAME_MAX
    spread = properties["topologySpreadConstraints"]
    assert spread["maxItems"] == pod_spec.SPREAD_CONSTRAINTS_MAX
    assert spread["items"]["required"] == ["maxSkew", "topologyKey", "whenUnsatisfiable"]
    assert spread["items"]["properties"]["topologyKey"]["maxLength"] == pod_spec.TOPOLOGY_KEY_MAX
    for name in ("priorityClassName", "serviceAccountName"):
        assert properties[name]["maxLength"] == pod_spec.NAME_MAX
        assert properties[name]["pattern"] == pod_spec.DNS_SUBDOMAIN.pattern
    metadata = properties["podMetadata"]["properties"]
    assert metadata["labels"]["maxProperties"] == pod_spec.POD_LABELS_MAX
    assert metadata["annotations"]["maxProperties"] == pod_spec.POD_ANNOTATIONS_MAX
    assert metadata["labels"]["additionalProperties"]["maxLength"] == 63
    assert properties["image"]["maxLength"] == 512
    # No schema defaults for image and resources: absent is how the operator tells "not set".
    assert "default" not in properties["image"] and "default" not in properties["resources"]
    for part in ("requests", "limits"):
        assert properties["resources"]["properties"][part]["maxProperties"] == 16


def test_the_crds_former_image_default_reads_as_not_set() -> None:
    # A BrokerCluster made before issue 42 carries it, written there by the old schema default: it
    # must follow the operator's --broker-image like one without spec.image.
    assert parse_spec("orders", minimal(image=FORMER_DEFAULT_IMAGE)).image is None
    assert parse_spec("orders", minimal()).image is None
    assert parse_spec("orders", minimal(image="registry.example.com/b:1")).image == "registry.example.com/b:1"


# ---- building --------------------------------------------------------------------------------


def test_each_knob_lands_in_the_pod() -> None:
    pod = pod_of(
        minimal(
            imagePullSecrets=[{"name": "erp-registry"}, {"name": "regcred"}],
            priorityClassName="broker-critical",
            serviceAccountName="broker-s3-writer",
            podMetadata={"labels": {"team": "erp"}, "annotations": {"example.com/cost-centre": "4711"}},
        ),
        defaults=REGISTRY,
    )
    spec, metadata = pod["spec"], pod["metadata"]
    # The operator's pull secret first, then the cluster's, each once.
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "erp-registry"}]
    assert spec["priorityClassName"] == "broker-critical"
    assert spec["serviceAccountName"] == "broker-s3-writer"
    assert spec["automountServiceAccountToken"] is False  # a chosen ServiceAccount mounts no API token
    assert metadata["labels"]["team"] == "erp"
    assert metadata["labels"].items() >= names.cluster_labels("orders").items()
    assert metadata["labels"][names.LABEL_ROLE] == "standby"
    assert metadata["annotations"]["example.com/cost-centre"] == "4711"
    assert names.ANNOTATION_TEMPLATE_HASH in metadata["annotations"]
    assert spec["containers"][0]["image"] == REGISTRY.image


def test_without_knobs_the_pod_has_none_of_them() -> None:
    spec = pod_of(minimal())["spec"]
    for absent in (
        "imagePullSecrets",
        "priorityClassName",
        "serviceAccountName",
        "topologySpreadConstraints",
    ):
        assert absent not in spec, absent
    assert spec["containers"][0]["image"] == DEFAULT_BROKER_IMAGE == FORMER_DEFAULT_IMAGE


def test_the_spec_image_wins_over_the_operators() -> None:
    pod = pod_of(minimal(image="mirror.example.com/broker:0.1.0"), defaults=REGISTRY)
    assert pod["spec"]["containers"][0]["image"] == "mirror.example.com/broker:0.1.0"
    # The CRD's former default, stored in clusters made before, follows the operator's setting.
    pod = pod_of(minimal(image=FORMER_DEFAULT_IMAGE), defaults=REGISTRY)
    assert pod["spec"]["containers"][0]["image"] == REGISTRY.image


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        pytest.param(None, {"requests": dict(DEFAULT_REQUESTS)}, id="absent"),
        pytest.param({}, {"requests": dict(DEFAULT_REQUESTS)}, id="empty"),
        pytest.param({"requests": {}}, {"requests": {}}, id="explicit-best-effort"),
        pytest.param({"requests": {"cpu": "1"}}, {"requests": {"cpu": "1"}}, id="requests"),
        # Limits alone: Kubernetes requests what they limit; a default request could exceed them.
        pytest.param({"limits": {"memory": "64Mi"}}, {"limits": {"memory": "64Mi"}}, id="limits-only"),
    ],
)
def test_no_broker_is_best_effort_unless_asked(
    resources: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    spec = minimal() if resources is None else minimal(resources=resources)
    assert pod_of(spec)["spec"]["containers"][0]["resources"] == expected
    assert DEFAULT_REQUESTS == {"cpu": "100m", "memory": "128Mi"}


def test_a_given_spread_replaces_the_zone_spread_and_spreads_this_clusters_pods() -> None:
    hosts = {**ZONE_SPREAD, "topologyKey": "kubernetes.io/hostname"}
    pod = pod_of(minimal(topologySpreadConstraints=[hosts]), zones="DoNotSchedule")
    (constraint,) = pod["spec"]["topologySpreadConstraints"]
    # Without labelSelector it would select no pod and spread nothing: the cluster's own pods.
    assert constraint == {**hosts, "labelSelector": {"matchLabels": names.cluster_labels("orders")}}
    own = {**hosts, "labelSelector": {"matchLabels": {"app": "x"}}}
    pod = pod_of(minimal(topologySpreadConstraints=[own]), zones="DoNotSchedule")
    assert pod["spec"]["topologySpreadConstraints"] == [own]
    assert (
        pod_of(minimal(topologySpreadConstraints=[]), zones="DoNotSchedule")["spec"][
            "topologySpreadConstraints"
        ]
        == []
    )
    # The host spread is spec.affinity's to replace, not this field's.
    assert "podAntiAffinity" in pod["spec"]["affinity"]


# ---- the pod template's hash -------------------------------------------------------------------

# What the operator before issue 42 computed for these specs (its builders, run on them): an
# upgrade to this one must find every existing pod current, and replace none.
PAIR = {"account": "a", "company": "c"}
BEFORE_ISSUE_42 = [
    (PAIR, False, "915b7ac4cc20f4a6"),
    (PAIR, True, "a4ff25f7340975cb"),
    ({**PAIR, "image": FORMER_DEFAULT_IMAGE, "resources": {}}, False, "915b7ac4cc20f4a6"),
    ({**PAIR, "resources": {"requests": {"cpu": "1"}}}, False, "b09c3fd03033ca7a"),
]


@pytest.mark.parametrize(("spec", "serve_tls", "digest"), BEFORE_ISSUE_42)
def test_an_operator_upgrade_alone_replaces_no_pod(
    spec: dict[str, Any], serve_tls: bool, digest: str
) -> None:
    parsed = parse_spec("orders", spec)
    assert builders.template_hash("orders", parsed, serve_tls=serve_tls) == digest
    # Whatever zone decision or pull secrets the new pods get, and with the default requests.
    pod = builders.build_pod(
        OWNER,
        0,
        parsed,
        active=True,
        serve_tls=serve_tls,
        defaults=PodDefaults(image_pull_secrets=("regcred",)),
        zones="DoNotSchedule",
    )
    assert pod["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH] == digest


def test_each_knob_and_the_operators_image_change_the_template() -> None:
    variants = [
        minimal(),
        minimal(imagePullSecrets=[{"name": "erp-registry"}]),
        minimal(topologySpreadConstraints=[ZONE_SPREAD]),
        minimal(topologySpreadConstraints=[]),
        minimal(priorityClassName="broker-critical"),
        minimal(serviceAccountName="broker-s3-writer"),
        minimal(podMetadata={"labels": {"team": "erp"}}),
        minimal(podMetadata={"annotations": {"example.com/cost-centre": "4711"}}),
        minimal(resources={"requests": {}}),
    ]
    hashes = {builders.template_hash("orders", parse_spec("orders", spec)) for spec in variants}
    assert len(hashes) == len(variants)
    # A changed --broker-image rolls the clusters that follow it, and only those.
    follows, pinned = parse_spec("orders", minimal()), parse_spec("orders", minimal(image="a.example/b:1"))
    assert builders.template_hash("orders", follows) != builders.template_hash(
        "orders", follows, defaults=REGISTRY
    )
    assert builders.template_hash("orders", pinned) == builders.template_hash(
        "orders", pinned, defaults=REGISTRY
    )
    # The operator's pull secrets alone roll nothing: a running pod pulls nothing.
    assert builders.template_hash("orders", follows) == builders.template_hash(
        "orders", follows, defaults=PodDefaults(image_pull_secrets=("regcred",))
    )
