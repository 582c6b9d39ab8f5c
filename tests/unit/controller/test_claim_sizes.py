"""The journal claims against ``spec.storage.size``, decided without Kubernetes (kmock runs the
shell in test_claim_growth_kmock.py; the local cluster's provisioner in tests/e2e)."""

from __future__ import annotations

from typing import Any

import pytest

from broker_operator.controller.bodies import ClaimBody
from broker_operator.controller.claim_sizes import (
    ClassVerdict,
    GrowthOutcome,
    claim_size,
    claim_sizes,
    plan_growth,
    quantity,
    storage_condition,
    storage_status,
)
from broker_operator.controller.deprecated_fields import deprecated_field_notices


def claim(
    requested: str, capacity: str | None = None, *, bound: bool = True, deleting: bool = False, **status: Any
) -> ClaimBody:
    meta: dict[str, Any] = {"resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T10:00:00Z"
    body: dict[str, Any] = {
        "metadata": meta,
        "spec": {"resources": {"requests": {"storage": requested}}, "storageClassName": "standard"},
        "status": {"phase": "Bound" if bound else "Pending", **status},
    }
    if capacity is not None:
        body["status"]["capacity"] = {"storage": capacity}
    return body  # type: ignore[return-value]


def test_quantities_compare_whatever_their_form() -> None:
    assert quantity("1.5Gi") == quantity("1536Mi") == 1536 * 2**20
    assert quantity("1G") == 10**9 < quantity("1Gi")  # type: ignore[operator]
    assert quantity(None) is None
    assert quantity("a lot") is None


def test_only_the_claims_of_the_running_ordinals_are_read() -> None:
    claims = {
        "journal-orders-0": claim("1Gi", "1Gi"),
        "journal-orders-1": claim("1Gi", deleting=True),
        "journal-orders-2": claim("1Gi", "1Gi"),  # retained after a scale-down: raised if used again
    }
    sizes = claim_sizes(["journal-orders-0", "journal-orders-1"], claims)
    assert [s.name for s in sizes] == ["journal-orders-0"]
    (size,) = sizes
    assert (size.requested, size.capacity, size.storage_class, size.bound, size.resource_version) == (
        "1Gi",
        "1Gi",
        "standard",
        True,
        "7",
    )


def test_the_plan_sorts_each_claim_by_what_the_size_asks_of_it() -> None:
    sizes = [
        claim_size("grow", claim("1Gi", "1Gi")),
        claim_size("waiting", claim("1Gi", bound=False)),
        claim_size("shrink", claim("4Gi", "4Gi")),
        claim_size("resizing", claim("2Gi", "1Gi", conditions=[{"type": "Resizing", "status": "True"}])),
        claim_size(
            "failed", claim("2Gi", "1Gi", allocatedResourceStatuses={"storage": "NodeResizeInfeasible"})
        ),
        claim_size("done", claim("2048Mi", "2Gi")),
        claim_size("rounded-up", claim("2Gi", "3Gi")),  # a provisioner may give more than asked
    ]
    plan = plan_growth("2Gi", sizes)
    assert [s.name for s in plan.grow] == ["grow"]
    assert [s.name for s in plan.waiting] == ["waiting"]
    assert [s.name for s in plan.shrink] == ["shrink"]
    assert [s.name for s in plan.resizing] == ["resizing"]
    assert [s.name for s in plan.failed] == ["failed"]
    assert not plan.settled
    assert plan_growth("2Gi", sizes[-2:]).settled


def test_a_grown_claim_shows_as_resizing_and_names_a_pending_file_system() -> None:
    pending = claim("2Gi", "1Gi", conditions=[{"type": "FileSystemResizePending", "status": "True"}])
    plan = plan_growth("2Gi", [claim_size("journal-orders-0", pending)])
    condition = storage_condition(plan, GrowthOutcome())
    assert (condition.ok, condition.reason) == (False, "Resizing")
    assert condition.message.startswith("journal-orders-0 holds 1Gi of 2Gi, FileSystemResizePending")
    assert "the kubelet grows the file system when the pod next mounts it" in condition.message


def test_the_condition_names_the_most_severe_problem_first_and_every_other() -> None:
    sizes = [
        claim_size("journal-orders-0", claim("1Gi", "1Gi")),
        claim_size("journal-orders-1", claim("4Gi", "4Gi")),
        claim_size("journal-orders-2", claim("1Gi", "1Gi")),
    ]
    plan = plan_growth("2Gi", sizes)
    outcome = GrowthOutcome(
        blocked={
            "journal-orders-0": ClassVerdict(False, "StorageClass fixed does not allow volume expansion")
        },
        refused={
            "journal-orders-2": "422 Unprocessable Entity: only dynamically provisioned pvc can be resized"
        },
    )
    condition = storage_condition(plan, outcome)
    assert (condition.ok, condition.reason) == (False, "ShrinkRefused")
    shrink, blocked, refused = condition.message.split("; ")
    assert shrink.endswith("cannot shrink: journal-orders-1 (4Gi). Set spec.storage.size to 4Gi or more")
    assert blocked == (
        "StorageClass fixed does not allow volume expansion: journal-orders-0 (1Gi) cannot grow to 2Gi"
    )
    assert refused.startswith("the API server refused to raise journal-orders-2 to 2Gi: 422")


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [
        (ClassVerdict(False, "StorageClass fixed does not allow volume expansion"), "ExpansionNotAllowed"),
        (
            ClassVerdict(False, "could not read StorageClass x: 403 Forbidden", unreadable=True),
            "StorageClassUnreadable",
        ),
    ],
)
def test_a_class_that_stands_in_the_way_is_the_reason(verdict: ClassVerdict, reason: str) -> None:
    plan = plan_growth("2Gi", [claim_size("journal-orders-0", claim("1Gi", "1Gi"))])
    condition = storage_condition(plan, GrowthOutcome(blocked={"journal-orders-0": verdict}))
    assert (condition.ok, condition.reason) == (False, reason)
    assert condition.message.startswith(str(verdict.problem))


def test_a_failed_resize_points_at_the_claims_events() -> None:
    failed = claim("2Gi", "1Gi", conditions=[{"type": "ControllerResizeError", "status": "True"}])
    condition = storage_condition(plan_growth("2Gi", [claim_size("j", failed)]), GrowthOutcome())
    assert (condition.ok, condition.reason) == (False, "ExpansionFailed")
    assert condition.message == (
        "j holds 1Gi of 2Gi: ControllerResizeError (kubectl describe pvc j has the driver's message)"
    )


def test_settled_claims_make_the_condition_true() -> None:
    plan = plan_growth("2Gi", [claim_size("journal-orders-0", claim("2Gi", "2Gi"))])
    condition = storage_condition(plan, GrowthOutcome())
    assert (condition.ok, condition.reason, condition.message) == (
        True,
        "Resized",
        "every journal claim holds 2Gi",
    )


def test_the_status_lists_each_claims_request_and_capacity() -> None:
    sizes = [
        claim_size("journal-orders-0", claim("2Gi", "1Gi")),
        claim_size("journal-orders-1", claim("1Gi")),
    ]
    assert storage_status("2Gi", sizes) == {
        "requested": "2Gi",
        "claims": [
            {"name": "journal-orders-0", "requested": "2Gi", "capacity": "1Gi"},
            {"name": "journal-orders-1", "requested": "1Gi"},  # not bound: no capacity yet
        ],
    }


def test_only_a_chosen_message_log_schedule_is_reported_as_deprecated() -> None:
    assert deprecated_field_notices({}) == []
    assert deprecated_field_notices({"messageLog": {"claimName": "logs"}}) == []
    # The old CRD default, stored in every BrokerCluster created before issue 42: nobody chose it.
    assert deprecated_field_notices({"messageLog": {"schedule": "*/15 * * * *"}}) == []
    (notice,) = deprecated_field_notices({"messageLog": {"schedule": "0 * * * *"}})
    assert notice.startswith("spec.messageLog.schedule ('0 * * * *') is deprecated and ignored")
    assert "--set validator.schedule='0 * * * *'" in notice
