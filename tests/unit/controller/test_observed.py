"""From pod bodies to the engine's targets and pod facts."""

from __future__ import annotations

from typing import Any

from broker_operator.controller import builders, names
from broker_operator.controller.bodies import PodBody
from broker_operator.controller.observed import (
    ClusterObservations,
    admin_port,
    container_terminated,
    facts_for,
    node_draining,
    serves_tls,
    targets_for,
)
from broker_operator.controller.reconcile import drain_view
from broker_operator.controller.spec import parse_spec
from broker_operator.core.model import BrokerTarget, PodFacts
from broker_operator.pki.names import server_dns_names

SPEC = parse_spec("orders", {"account": "a", "company": "c", "replicas": 3})


def pod(ordinal: int, ip: str | None = None, state: dict[str, Any] | None = None, **status: Any) -> PodBody:
    body: dict[str, Any] = {
        "metadata": {"name": f"orders-{ordinal}", "labels": {names.LABEL_ORDINAL: str(ordinal)}},
        "status": {**status},
    }
    if ip:
        body["status"]["podIP"] = ip
    if state is not None:
        body["status"]["containerStatuses"] = [{"name": "broker", "state": state, **status.get("extra", {})}]
    return body  # type: ignore[return-value]


def test_targets_are_pods_with_ips_in_priority_order() -> None:
    pods = {"orders-2": pod(2, "127.0.0.12"), "orders-0": pod(0, "127.0.0.10"), "orders-1": pod(1)}
    assert targets_for(SPEC, pods) == [
        BrokerTarget("orders-0", "http://127.0.0.10:8080/soap", 0),
        BrokerTarget("orders-2", "http://127.0.0.12:8080/soap", 2),
    ]


def test_endpoints_mode_targets_are_the_endpoints() -> None:
    spec = parse_spec(
        "ext",
        {
            "account": "a",
            "company": "c",
            "endpoints": [{"name": "x", "url": "http://h:1/soap", "priority": 3}],
        },
    )
    assert targets_for(spec, {}) == [BrokerTarget("x", "http://h:1/soap", 3)]


def test_terminated_and_crash_looping_containers_are_dead() -> None:
    assert container_terminated(pod(0, state={"terminated": {"exitCode": 137}}))
    looping = pod(0)
    looping["status"]["containerStatuses"] = [
        {
            "name": "broker",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1}},
        }
    ]
    assert container_terminated(looping)
    assert not container_terminated(pod(0, state={"running": {}}))
    assert not container_terminated(pod(0))  # no status yet: not known dead


def test_facts_cover_every_expected_broker() -> None:
    pods = {
        "orders-0": pod(0, state={"terminated": {"exitCode": 137}}),
        "orders-1": pod(1, state={"running": {}}),
    }
    facts = facts_for(pods, {"orders-0": 0, "orders-1": 1, "orders-2": 2})
    assert facts == {
        "orders-0": PodFacts(exists=True, container_terminated=True),
        "orders-1": PodFacts(exists=True, container_terminated=False),
        "orders-2": PodFacts(exists=False, container_terminated=False),
    }


def test_observations_report_what_changed() -> None:
    seen = ClusterObservations()
    assert seen.observe("orders-0", pod(0)) == (True, True)  # appeared: new target set, alive now
    assert seen.observe("orders-0", pod(0, "127.0.0.10", state={"running": {}})) == (True, False)
    assert seen.observe("orders-0", pod(0, "127.0.0.10", state={"terminated": {"exitCode": 137}})) == (
        False,
        True,
    )
    assert seen.observe("orders-0", None) == (True, False)  # gone: was already dead
    assert "orders-0" not in seen.pods


def test_the_engine_starts_when_every_broker_is_ready() -> None:
    from broker_operator.controller.daemon import may_start

    expected = {"orders-0": 0, "orders-1": 1}
    both = {"orders-0", "orders-1"}
    common = {"expected": expected, "recorded_active": None, "grace": 30.0}
    assert not may_start(addressed=set(), ready=set(), waited=99.0, **common)  # nothing to heartbeat, ever
    assert not may_start(addressed={"orders-1"}, ready={"orders-1"}, waited=1.0, **common)  # orders-0 coming
    assert not may_start(addressed=both, ready={"orders-1"}, waited=1.0, **common)  # orders-0 not serving yet
    assert may_start(addressed=both, ready=both, waited=0.0, **common)
    assert may_start(addressed={"orders-1"}, ready={"orders-1"}, waited=30.0, **common)  # a pod never starts
    # An operator restart renews the recorded active's lease at once.
    restart = {"expected": expected, "recorded_active": "orders-1", "grace": 30.0}
    assert may_start(addressed={"orders-1"}, ready=set(), waited=0.0, **restart)


def with_ports(body: PodBody, *ports: tuple[str, int]) -> PodBody:
    containers = [{"name": "broker", "ports": [{"name": n, "containerPort": p} for n, p in ports]}]
    return {**body, "spec": {"containers": containers}}  # type: ignore[typeddict-item]


def test_the_operator_calls_each_pod_on_its_admin_port_if_it_has_one() -> None:
    pods = {
        "orders-0": with_ports(pod(0, "127.0.0.10"), ("soap", 8080), ("admin", 8081)),
        # Created by an operator from before the admin port: heartbeats go to its one port.
        "orders-1": with_ports(pod(1, "127.0.0.11"), ("soap", 8080)),
    }
    assert admin_port(pods["orders-0"]) == 8081
    assert targets_for(SPEC, pods) == [
        BrokerTarget("orders-0", "http://127.0.0.10:8081/soap", 0),
        BrokerTarget("orders-1", "http://127.0.0.11:8080/soap", 1),
    ]


def test_a_pod_replaced_with_an_admin_port_retargets_the_engine() -> None:
    observations = ClusterObservations()
    observations.observe("orders-0", pod(0, "127.0.0.10"))
    targets_changed, _ = observations.observe("orders-0", with_ports(pod(0, "127.0.0.10"), ("admin", 8081)))
    assert targets_changed


def placed(ordinal: int, node: str, *, ready: bool = True) -> PodBody:
    body: Any = pod(ordinal, f"127.0.0.1{ordinal}", conditions=[{"type": "Ready", "status": str(ready)}])
    body["spec"] = {"nodeName": node}
    return body  # type: ignore[no-any-return]


def test_a_cordoned_or_autoscaler_marked_node_is_draining_and_its_pods_say_so() -> None:
    assert node_draining({"spec": {"unschedulable": True}})
    assert node_draining(
        {"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}
    )
    assert not node_draining({"spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}})
    assert not node_draining({"spec": {}})
    pods = {"orders-0": placed(0, "node-1"), "orders-1": placed(1, "node-2")}
    facts = facts_for(pods, {"orders-0": None, "orders-1": None, "orders-2": None}, {"node-1"})
    assert [facts[n].node_draining for n in ("orders-0", "orders-1", "orders-2")] == [True, False, False]


def test_the_drain_view_says_whether_the_active_can_move_or_be_evicted() -> None:
    observations = ClusterObservations(draining_nodes={"node-1"})
    observations.pods = {"orders-0": placed(0, "node-1"), "orders-1": placed(1, "node-2")}
    wait = parse_spec("orders", {"account": "a", "company": "c"})
    evict = parse_spec("orders", {"account": "a", "company": "c", "drainWithoutStandby": "Evict"})
    # A ready standby elsewhere: the operator switches over; the budget never lets the active go.
    view = drain_view(wait, "orders-0", observations)
    assert (view.node, view.condition()[:2], view.evictable) == ("node-1", (True, "SwitchingOver"), False)
    assert not drain_view(evict, "orders-0", observations).evictable
    # The standby not ready, or on a draining node too: Wait blocks, Evict lets the eviction through.
    observations.pods["orders-1"] = placed(1, "node-2", ready=False)
    assert drain_view(wait, "orders-0", observations).condition()[:2] == (False, "NoStandbyElsewhere")
    assert drain_view(evict, "orders-0", observations).evictable
    observations.pods["orders-1"] = placed(1, "node-1")
    assert drain_view(evict, "orders-0", observations).condition()[:2] == (True, "EvictWithoutStandby")
    # The active's own node not draining: nothing to say, nothing to let through.
    view = drain_view(
        evict, "orders-1", ClusterObservations(draining_nodes={"node-9"}, pods=observations.pods)
    )
    assert (view.node, view.condition()[1], view.evictable) == (None, "NotDraining", False)


def built_pod(ordinal: int, ip: str, *, tls: dict[str, Any], serve_tls: bool) -> PodBody:
    """A pod as the operator builds it (``builders.build_pod``), with an address."""
    owner = {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "orders", "namespace": "erp", "uid": "uid-1"},
    }
    spec = parse_spec("orders", {"account": "a", "company": "c", "replicas": 2, "tls": tls})
    body: Any = builders.build_pod(owner, ordinal, spec, active=False, serve_tls=serve_tls)
    body["status"] = {"podIP": ip}
    return body


def test_a_pod_serving_tls_is_called_over_https_and_verified_as_its_dns_name() -> None:
    tls = {"clusterDomain": "corp.example"}
    spec = parse_spec("orders", {"account": "a", "company": "c", "replicas": 2, "tls": tls})
    pods = {
        "orders-0": built_pod(0, "10.0.0.10", tls=tls, serve_tls=True),
        # Not yet rolled (plain HTTP): called as it listens, whatever the spec says now.
        "orders-1": built_pod(1, "10.0.0.11", tls=tls, serve_tls=False),
    }
    assert serves_tls(pods["orders-0"]) and not serves_tls(pods["orders-1"])
    tls_target, plain_target = targets_for(spec, pods)
    port = names.BROKER_ADMIN_PORT
    assert tls_target == BrokerTarget(
        "orders-0",
        f"https://10.0.0.10:{port}/soap",
        0,
        tls_server_name="orders-0.orders-brokers.erp.svc.corp.example",
    )
    assert plain_target == BrokerTarget("orders-1", f"http://10.0.0.11:{port}/soap", 1)
    # The name verified is one the operator's PKI puts into the brokers' certificate.
    assert tls_target.tls_server_name in server_dns_names(
        "orders", "erp", [0, 1], cluster_domain="corp.example"
    )


def test_a_pod_rolled_to_tls_retargets_the_engine() -> None:
    observations = ClusterObservations()
    observations.observe("orders-0", built_pod(0, "10.0.0.10", tls={}, serve_tls=False))
    targets_changed, _ = observations.observe("orders-0", built_pod(0, "10.0.0.10", tls={}, serve_tls=True))
    assert targets_changed
