"""Switchover: the request, the wait, and the reasons it stops (done, refused, timed out)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from broker_operator.kubectl_plugin.errors import EXIT_FAILED, EXIT_USAGE, PluginError
from broker_operator.kubectl_plugin.switchover import progress, switchover
from tests.unit.plugin.support import FakeKube, cluster_body

REQUESTED = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def broker(
    name: str, state: str, code: str | None = None, seen: str = "2026-11-23T12:00:05Z"
) -> dict[str, Any]:
    message = f"{code} message" if code else None
    return {"name": name, "priority": int(name[-1]), "state": state, "unavailabilityCode": code,
            "unavailabilityMessage": message, "lastHeartbeatTime": seen}  # fmt: skip


class Clock:
    """A fake monotonic clock that ``sleep`` advances, so a timeout costs no real time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def run(kube: FakeKube, target: str, timeout: float = 10.0) -> tuple[str, list[str], Clock]:
    said: list[str] = []
    clock = Clock()
    closing = switchover(
        kube, "orders", target, timeout=timeout, wait=True, say=said.append, clock=clock, sleep=clock.sleep,
        now=lambda: REQUESTED,
    )  # fmt: skip
    return closing, said, clock


def test_progress_is_done_when_the_target_is_active() -> None:
    status = {"phase": "Healthy", "active": "orders-1", "brokers": [broker("orders-1", "Active")]}
    seen = progress(status, "orders-1", REQUESTED)
    assert (seen.done, seen.refused, seen.line) == (
        True,
        None,
        "phase Healthy, active orders-1, orders-1 Active",
    )


def test_progress_reports_a_refusal_only_once_the_move_settled_after_the_request() -> None:
    refused = [broker("orders-0", "Active"), broker("orders-1", "Unavailable", "BACKEND_UNREACHABLE")]
    settled = {"phase": "Degraded", "active": "orders-0", "brokers": refused}
    assert progress(settled, "orders-1", REQUESTED).refused == (
        "orders-1 refused activation: BACKEND_UNREACHABLE: BACKEND_UNREACHABLE message"
    )
    # Still moving: not a verdict yet.
    assert progress({**settled, "phase": "FailingOver"}, "orders-1", REQUESTED).refused is None
    # An Unavailable entry recorded before the request says nothing about this request.
    old = [
        broker("orders-0", "Active"),
        broker("orders-1", "Unavailable", "STALE_EPOCH", "2026-11-23T11:59:00Z"),
    ]
    assert progress({**settled, "brokers": old}, "orders-1", REQUESTED).refused is None


def test_switchover_patches_waits_and_prints_each_change() -> None:
    kube = FakeKube(
        cluster_body(),
        after_patch=[
            {"phase": "Healthy", "active": "orders-0"},
            {"phase": "FailingOver", "active": None},
            {"phase": "FailingOver", "active": None},
            {"phase": "Healthy", "active": "orders-1", "epoch": 4,
             "brokers": [broker("orders-0", "Inactive"), broker("orders-1", "Active")]},
        ],
    )  # fmt: skip
    closing, said, clock = run(kube, "orders-1")
    assert kube.patches == ["orders-1"]
    assert closing == "orders-1 is now the active broker of orders (epoch 4)"
    assert said == [
        "switchover of orders to orders-1 requested (spec.preferredActive=orders-1)",
        "  phase Healthy, active orders-0, orders-1 Inactive",
        "  phase FailingOver, active none, orders-1 Inactive",  # printed once, not once per poll
        "  phase Healthy, active orders-1, orders-1 Active",
    ]
    assert clock.slept == [0.5, 0.5, 0.5]


def test_a_switchover_that_does_not_happen_times_out_saying_where_it_stands() -> None:
    kube = FakeKube(cluster_body(), after_patch=[{"phase": "Healthy", "active": "orders-0"}])
    with pytest.raises(PluginError) as failed:
        run(kube, "orders-1", timeout=3)
    assert failed.value.exit_code == EXIT_FAILED
    assert "did not complete within 3s (phase Healthy, active orders-0, orders-1 Inactive)" in str(
        failed.value
    )
    assert "SwitchoverRefused" in str(failed.value)


def test_a_refused_activation_fails_at_once_with_the_code() -> None:
    brokers = [broker("orders-0", "Active"), broker("orders-1", "Unavailable", "CLOUD_UNREACHABLE")]
    refused = {"phase": "Healthy", "active": "orders-0", "brokers": brokers}
    kube = FakeKube(cluster_body(), after_patch=[refused])
    with pytest.raises(PluginError, match="orders-1 refused activation: CLOUD_UNREACHABLE") as failed:
        run(kube, "orders-1", timeout=60)
    assert failed.value.exit_code == EXIT_FAILED


def test_a_broker_not_in_the_cluster_is_a_usage_error_and_nothing_is_patched() -> None:
    kube = FakeKube(cluster_body())
    with pytest.raises(PluginError) as failed:
        run(kube, "orders-7")
    assert failed.value.exit_code == EXIT_USAGE
    assert (
        str(failed.value)
        == "broker 'orders-7' is not in BrokerCluster orders (its brokers: orders-0, orders-1)"
    )
    assert kube.patches == []


def test_the_active_broker_needs_no_move_but_is_made_preferred() -> None:
    kube = FakeKube(cluster_body())
    closing, said, _ = run(kube, "orders-0")
    assert closing == "orders-0 is already the active broker of orders (epoch 3)"
    assert kube.patches == ["orders-0"]
    assert said == []


def test_a_preferred_active_already_set_is_cleared_first_so_the_operator_sees_a_change() -> None:
    body = cluster_body()
    body["spec"]["preferredActive"] = "orders-1"  # asked before; a failover has moved the active since
    kube = FakeKube(body, after_patch=[{"active": "orders-1", "brokers": [broker("orders-1", "Active")]}])
    closing, said, clock = run(kube, "orders-1")
    assert kube.patches == [None, "orders-1"]
    assert clock.slept[0] == 3.0  # two heartbeat intervals and a second
    assert said[0].startswith("spec.preferredActive already names orders-1; clearing it")
    assert closing.startswith("orders-1 is now the active broker")
