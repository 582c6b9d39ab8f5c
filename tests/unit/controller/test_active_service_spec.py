"""``spec.activeService``: the defaults, and every CEL rule's Python twin refusing in the same words."""

from __future__ import annotations

from typing import Any

import pytest

from broker_operator.controller import active_service_spec as service
from broker_operator.controller.active_service_spec import ActiveServiceSpec, is_cidr
from broker_operator.controller.spec import SpecError, parse_spec
from tests.unit.controller.cel_messages import rendered, rules_at, rules_below


def minimal(**extra: Any) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **extra}


def problems_of(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as refused:
        parse_spec("orders", spec)
    return list(refused.value.problems)


def test_the_default_is_the_clusterip_service_of_before() -> None:
    template = parse_spec("orders", minimal()).active_service
    assert template == ActiveServiceSpec(type="ClusterIP")
    assert not template.external and not template.load_balancer


def test_a_load_balancer_template_is_read_whole() -> None:
    given = {
        "type": "LoadBalancer",
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        "labels": {"team": "erp"},
        "loadBalancerSourceRanges": ["203.0.113.0/24", "2001:db8::/32"],
        "externalTrafficPolicy": "Local",
        "nodePort": 30443,
        "loadBalancerClass": "example.com/internal-vip",
    }
    template = parse_spec("orders", minimal(activeService=given)).active_service
    assert template == ActiveServiceSpec(
        type="LoadBalancer",
        annotations={"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
        labels={"team": "erp"},
        load_balancer_source_ranges=("203.0.113.0/24", "2001:db8::/32"),
        external_traffic_policy="Local",
        node_port=30443,
        load_balancer_class="example.com/internal-vip",
    )
    assert template.external and template.load_balancer


RULES = [
    pytest.param(
        {"loadBalancerSourceRanges": ["203.0.113.0/24"]},
        "activeService",
        service.load_balancer_only_message("loadBalancerSourceRanges", "ClusterIP"),
        {"self.type": "ClusterIP"},
        id="source-ranges-on-clusterip",
    ),
    pytest.param(
        {"type": "NodePort", "loadBalancerSourceRanges": []},
        "activeService",
        service.load_balancer_only_message("loadBalancerSourceRanges", "NodePort"),
        {"self.type": "NodePort"},
        id="source-ranges-empty-on-nodeport",
    ),
    pytest.param(
        {"type": "NodePort", "loadBalancerClass": "example.com/internal-vip"},
        "activeService",
        service.load_balancer_only_message("loadBalancerClass", "NodePort"),
        {"self.type": "NodePort"},
        id="class-on-nodeport",
    ),
    pytest.param(
        {"externalTrafficPolicy": "Local"},
        "activeService",
        service.external_only_message("externalTrafficPolicy"),
        {},
        id="traffic-policy-on-clusterip",
    ),
    pytest.param(
        {"nodePort": 30443},
        "activeService",
        service.external_only_message("nodePort"),
        {},
        id="node-port-on-clusterip",
    ),
    pytest.param(
        {"annotations": {"broker.failover.dev/epoch": "9"}},
        "activeService.annotations",
        service.ANNOTATIONS_RESERVED_MESSAGE,
        {},
        id="operators-annotation",
    ),
    pytest.param(
        {"labels": {"app.kubernetes.io/managed-by": "me"}},
        "activeService.labels",
        service.LABELS_RESERVED_MESSAGE,
        {},
        id="operators-label",
    ),
    pytest.param(
        {"labels": {"broker.failover.dev/cluster": "other"}},
        "activeService.labels",
        service.LABELS_RESERVED_MESSAGE,
        {},
        id="operators-label-prefix",
    ),
    pytest.param(
        {"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.7"]},
        "activeService.loadBalancerSourceRanges[]",
        service.source_range_message("203.0.113.7"),
        {"self": "203.0.113.7"},
        id="source-range-without-prefix",
    ),
]


@pytest.mark.parametrize(("template", "where", "message", "values"), RULES)
def test_each_rule_refuses_in_the_crds_words(
    template: dict[str, Any], where: str, message: str, values: dict[str, object]
) -> None:
    assert problems_of(minimal(activeService=template)) == [message]
    messages = []
    for rule in rules_at(where):
        try:
            messages.append(rendered(rule, values))
        except KeyError:  # a rule that formats other values than this case gives
            continue
    assert message in messages


def test_every_rule_of_spec_active_service_has_a_twin_above() -> None:
    rules = list(rules_below("activeService"))
    assert {where for where, _rule in rules} == {case.values[1] for case in RULES}
    for where, rule in rules:
        rendered_by_twins = set()
        for case in RULES:
            if case.values[1] == where:
                try:
                    rendered_by_twins.add(rendered(rule, case.values[3]))
                except KeyError:
                    continue
        assert rendered_by_twins & {case.values[2] for case in RULES}, rule


def test_the_node_port_range_is_the_api_servers_default() -> None:
    (problem,) = problems_of(minimal(activeService={"type": "NodePort", "nodePort": 8443}))
    assert problem == "spec.activeService.nodePort (8443) must be an integer from 30000 to 32767"
    (problem,) = problems_of(minimal(activeService={"type": "Ingress"}))
    assert problem == "spec.activeService.type ('Ingress') must be one of ClusterIP, NodePort, LoadBalancer"
    (problem,) = problems_of(minimal(activeService={"type": "NodePort", "externalTrafficPolicy": "Nearest"}))
    assert problem == "spec.activeService.externalTrafficPolicy ('Nearest') must be one of Cluster, Local"


@pytest.mark.parametrize(
    ("value", "cidr"),
    [
        ("10.0.0.0/8", True),
        ("10.1.2.3/8", True),  # host bits set: CEL's isCIDR and the Service API both take it
        ("2001:db8::/32", True),
        ("10.0.0.1", False),
        ("10.0.0.0/33", False),
        ("example.com/24", False),
        ("", False),
    ],
)
def test_a_cidr_is_what_cel_calls_one(value: str, cidr: bool) -> None:
    assert is_cidr(value) is cidr
