"""The operator's second line of spec validation: same defaults and same refusals as the CRD."""

from __future__ import annotations

import re
from typing import Any

import pytest

from broker_operator.controller.spec import ClaimRetention, SecretRef, SpecError, parse_spec
from broker_operator.core.model import HeartbeatSettings


def minimal(**extra: Any) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **extra}


def test_defaults_are_the_designs() -> None:
    spec = parse_spec("orders", minimal())
    assert spec.replicas == 2
    assert spec.endpoints == ()
    assert spec.image is None  # the operator's --broker-image (pod_fields.broker_image)
    heartbeat = spec.heartbeat
    assert (heartbeat.interval_seconds, heartbeat.timeout_seconds, heartbeat.failure_threshold) == (1, 1, 2)
    assert (heartbeat.lease_seconds, heartbeat.standby_probe_seconds) == (10, 10)
    assert (heartbeat.failback, heartbeat.failback_stable_seconds) == ("Automatic", 30)
    # The one parser of the heartbeat fields is the engine's: the same settings object.
    assert heartbeat == HeartbeatSettings.from_spec(minimal())
    assert (spec.max_deliveries, spec.on_poison) == (5, "BlockStream")
    assert spec.storage_size == "1Gi"
    assert spec.token_secret is None
    assert spec.token_ref("orders") == SecretRef("orders-broker-token", "token")
    assert spec.backend_token_secret is None
    assert spec.backend_token_ref("orders") == SecretRef("orders-backend-token", "token")
    # Nothing deleted unless asked: a journal can hold acknowledged messages and holds.
    assert spec.claim_retention == ClaimRetention(when_scaled="Retain", when_deleted="Retain")
    assert not spec.claim_retention.delete_when_scaled
    assert not spec.claim_retention.delete_when_deleted


def test_the_claim_retention_policy_is_read_and_checked() -> None:
    policy = {"whenScaled": "Delete", "whenDeleted": "Delete"}
    spec = parse_spec("orders", minimal(persistentVolumeClaimRetentionPolicy=policy))
    assert spec.claim_retention.delete_when_scaled
    assert spec.claim_retention.delete_when_deleted
    with pytest.raises(SpecError) as refused:
        parse_spec("orders", minimal(persistentVolumeClaimRetentionPolicy={"whenScaled": "Drop"}))
    assert (
        "spec.persistentVolumeClaimRetentionPolicy.whenScaled ('Drop') must be one of Retain, Delete"
        in str(refused.value)
    )


def test_the_backends_credential_is_a_secret_of_its_own() -> None:
    spec = parse_spec("orders", minimal(auth={"backendTokenSecretRef": {"name": "erp-credential"}}))
    assert spec.backend_token_ref("orders") == SecretRef("erp-credential", "token")
    assert spec.token_ref("orders") == SecretRef("orders-broker-token", "token")


def test_sub_second_heartbeats_are_read_as_decimal_seconds() -> None:
    # The failover benchmark's settings on Kubernetes; before, only whole seconds were accepted.
    heartbeat = {"intervalSeconds": 0.2, "timeoutSeconds": 0.2, "failureThreshold": 2, "leaseSeconds": 2.5}
    settings = parse_spec("orders", minimal(heartbeat=heartbeat)).heartbeat
    assert (settings.interval_seconds, settings.timeout_seconds) == (0.2, 0.2)
    assert (settings.failure_threshold, settings.lease_seconds) == (2, 2.5)
    assert isinstance(settings.lease_seconds, float)
    # Whole numbers stay valid, so existing manifests keep working.
    whole = parse_spec("orders", minimal(heartbeat={"intervalSeconds": 2, "leaseSeconds": 9})).heartbeat
    assert (whole.interval_seconds, whole.lease_seconds) == (2.0, 9.0)


def test_endpoints_mode_sorts_by_priority_and_runs_no_pods() -> None:
    spec = parse_spec(
        "ext",
        minimal(
            endpoints=[
                {"name": "b", "url": "http://10.0.0.2:8080/soap", "priority": 5},
                {"name": "a", "url": "http://10.0.0.1:8080/soap", "priority": 1},
            ]
        ),
    )
    assert spec.endpoints_mode
    assert spec.replicas == 0
    assert [e.name for e in spec.endpoints] == ["a", "b"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            minimal(heartbeat={"leaseSeconds": 2, "intervalSeconds": 1, "failureThreshold": 3}),
            "spec.heartbeat.leaseSeconds (2) must exceed intervalSeconds × failureThreshold (3)",  # noqa: RUF001
        ),
        (
            minimal(heartbeat={"leaseSeconds": 0.4, "intervalSeconds": 0.2, "timeoutSeconds": 0.2}),
            "spec.heartbeat.leaseSeconds (0.4) must exceed intervalSeconds × failureThreshold (0.4)",  # noqa: RUF001
        ),
        (
            minimal(heartbeat={"intervalSeconds": 0.05, "timeoutSeconds": 0.05, "leaseSeconds": 2}),
            "spec.heartbeat.intervalSeconds (0.05) must be a number from 0.1 to 60",
        ),
        (
            minimal(heartbeat={"intervalSeconds": True}),
            "spec.heartbeat.intervalSeconds (True) must be a number",
        ),
        (minimal(heartbeat={"leaseSeconds": "2.5"}), "spec.heartbeat.leaseSeconds ('2.5') must be a number"),
        (minimal(failbackStableSeconds=1.5), "spec.failbackStableSeconds (1.5) must be an integer from 0"),
        (minimal(heartbeat={"failureThreshold": 0}), "spec.heartbeat.failureThreshold (0)"),
        (
            minimal(heartbeat={"timeoutSeconds": 3, "intervalSeconds": 2, "leaseSeconds": 9}),
            "timeoutSeconds (3)",
        ),
        (
            minimal(replicas=2, endpoints=[{"name": "a", "url": "http://h/soap", "priority": 0}]),
            "spec.replicas and spec.endpoints are exclusive",
        ),
        (
            minimal(
                endpoints=[
                    {"name": "a", "url": "http://h1/soap", "priority": 0},
                    {"name": "b", "url": "http://h2/soap", "priority": 0},
                ]
            ),
            "spec.endpoints priorities must be unique; repeated: a=0, b=0",
        ),
        (minimal(endpoints=[{"name": "a", "url": "ftp://h/soap", "priority": 0}]), "spec.endpoints[0].url"),
        (
            minimal(preferredActive="orders-7"),
            "spec.preferredActive (orders-7) must name one of orders-0, orders-1",
        ),
        (minimal(failback="Sometimes"), "spec.failback ('Sometimes') must be one of Automatic, Manual"),
        (minimal(delivery={"onPoison": "Drop"}), "spec.delivery.onPoison ('Drop')"),
        (minimal(delivery={"maxDeliveries": True}), "spec.delivery.maxDeliveries (True)"),
        (minimal(replicas=10), "spec.replicas (10) must be an integer from 1 to 9"),
        (minimal(backend={"url": "http://a", "urlSecretRef": {"name": "s"}}), "spec.backend.url and"),
        ({"company": "1000"}, "spec.account is required"),
        (
            minimal(
                auth={"tokenSecretRef": {"name": "s"}, "backendTokenSecretRef": {"name": "s", "key": "token"}}
            ),
            "spec.auth.backendTokenSecretRef names the same Secret key as spec.auth.tokenSecretRef",
        ),
        (
            minimal(podSecurityContext="restricted"),
            "spec.podSecurityContext must be an object (a Kubernetes PodSecurityContext), got 'restricted'",
        ),
        (
            minimal(securityContext=[{"readOnlyRootFilesystem": True}]),
            "spec.securityContext must be an object (a Kubernetes SecurityContext)",
        ),
        (minimal(affinity="spread"), "spec.affinity must be an object (a Kubernetes Affinity), got 'spread'"),
        (minimal(nodeSelector=["zone-a"]), "spec.nodeSelector must be an object"),
        (
            minimal(tolerations={"key": "dedicated"}),
            "spec.tolerations must be a list of Kubernetes Tolerations (objects)",
        ),
        (minimal(tolerations=["dedicated"]), "spec.tolerations must be a list of Kubernetes Tolerations"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec("orders", spec)
    assert message in str(caught.value), caught.value.problems


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec("orders", {"replicas": 0, "failback": "x"})
    assert len(caught.value.problems) >= 4  # account, company, replicas, failback


def test_the_network_policy_is_on_unless_disabled_and_its_sources_are_peers() -> None:
    base = {"account": "a", "company": "c"}
    # On by default (issue 39): every source still reaches SendMessages, the admin port and egress
    # are what it restricts.
    default = parse_spec("x", base).network_policy
    assert default is not None and default.send_messages_from is None and default.egress_to is None
    peers = [
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}},
    ]
    off = parse_spec("x", {**base, "networkPolicy": {"enabled": False, "sendMessagesFrom": peers}})
    assert off.network_policy is None
    on = parse_spec("x", {**base, "networkPolicy": {"enabled": True, "sendMessagesFrom": peers}})
    assert on.network_policy is not None and list(on.network_policy.send_messages_from or ()) == peers
    anywhere = parse_spec("x", {**base, "networkPolicy": {"enabled": True}})
    assert anywhere.network_policy is not None and anywhere.network_policy.send_messages_from is None


@pytest.mark.parametrize(
    ("network_policy", "message"),
    [
        ({"enabled": "yes"}, "spec.networkPolicy.enabled ('yes') must be true or false"),
        ({"enabled": True, "sendMessagesFrom": []}, "sendMessagesFrom must be a non-empty list"),
        ({"enabled": True, "sendMessagesFrom": [{}]}, "sendMessagesFrom[0] must set podSelector"),
        ({"egressTo": []}, "egressTo must be a non-empty list"),
        (
            {"egressTo": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}]},
            "egressTo[0]: ipBlock cannot",
        ),
        (
            {"enabled": True, "sendMessagesFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]},
            "sendMessagesFrom[0]: ipBlock cannot be combined",
        ),
        (
            {"enabled": True, "sendMessagesFrom": [{"podSelector": "app=erp"}]},
            "podSelector must be an object",
        ),
    ],
)
def test_bad_network_policies_are_refused_naming_the_field(
    network_policy: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec("x", {"account": "a", "company": "c", "networkPolicy": network_policy})
