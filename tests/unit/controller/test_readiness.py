"""The Ready condition says why a cluster does not serve, from pod reasons and broker codes."""

from __future__ import annotations

from typing import Any, cast

from broker_operator.controller.bodies import PodBody
from broker_operator.controller.readiness import pod_problem, readiness


def pod(*, waiting: tuple[str, str] | None = None, unschedulable: str | None = None) -> PodBody:
    status: dict[str, Any] = {"conditions": [], "containerStatuses": []}
    if unschedulable is not None:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    state = {"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting else {"running": {}}
    status["containerStatuses"].append({"name": "broker", "state": state})
    return cast(PodBody, {"metadata": {"name": "x"}, "status": status})


MISSING_SECRET = ("CreateContainerConfigError", 'secret "erp-endpoints" not found')


def test_an_active_broker_in_a_serving_phase_is_ready() -> None:
    ready = readiness(
        {"phase": "Degraded", "active": "orders-1", "epoch": 4}, {"orders-0": pod(waiting=MISSING_SECRET)}
    )
    assert (ready.ready, ready.reason, ready.message) == (
        True,
        "ActiveBrokerServing",
        "orders-1 is active with epoch 4",
    )


def test_a_missing_secret_is_named_with_what_to_do() -> None:
    pods = {"orders-1": pod(waiting=MISSING_SECRET), "orders-0": pod(waiting=MISSING_SECRET)}
    ready = readiness({"phase": "Pending"}, pods)
    assert (ready.ready, ready.reason) == (False, "BrokerPodsNotRunning")
    assert ready.message.startswith(
        'orders-0: CreateContainerConfigError (secret "erp-endpoints" not found); '
        'orders-1: CreateContainerConfigError (secret "erp-endpoints" not found); create the Secret'
    )


def test_an_image_the_node_may_not_pull_is_named_with_what_to_do() -> None:
    never = (
        "ErrImageNeverPull",
        'Container image "broker-failover/broker:9.9" is not present with pull policy of Never',
    )
    ready = readiness({"phase": "Pending"}, {"orders-0": pod(waiting=never)})
    assert ready.message.startswith(f"orders-0: ErrImageNeverPull ({never[1]}); the image is not on the node")
    assert "make images" in ready.message


def test_starting_containers_are_not_problems_but_unschedulable_pods_are() -> None:
    assert pod_problem(pod(waiting=("ContainerCreating", ""))) is None
    assert pod_problem(pod()) is None
    assert pod_problem(pod(unschedulable="0/1 nodes are available")) == (
        "Unschedulable",
        "0/1 nodes are available",
    )
    assert pod_problem(pod(waiting=("ImagePullBackOff", "not found"))) == ("ImagePullBackOff", "not found")


def test_brokers_that_refuse_activation_are_named_with_their_codes() -> None:
    status = {
        "phase": "Unavailable",
        "brokers": [
            {
                "name": "orders-0",
                "unavailabilityCode": "BACKEND_UNREACHABLE",
                "unavailabilityMessage": "refused",
            },
            {"name": "orders-1", "unavailabilityCode": None},
        ],
    }
    ready = readiness(status, {"orders-0": pod(), "orders-1": pod()})
    assert (ready.ready, ready.reason, ready.message) == (
        False,
        "NoBrokerCanBeActive",
        "orders-0 answered BACKEND_UNREACHABLE (refused)",
    )


def test_without_answers_or_problems_it_waits() -> None:
    assert readiness({"phase": "Pending"}, {}).reason == "WaitingForBrokers"
    assert readiness({"phase": "FailingOver", "active": None}, {}).reason == "FailingOver"
