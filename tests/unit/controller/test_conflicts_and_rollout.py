"""Pure decisions of the controller: who owns a pair, and which pod a rollout replaces next."""

from __future__ import annotations

from broker_operator.controller.conflicts import PairClaim, conflicting_owner
from broker_operator.controller.rollout import PodView, StepKind, next_rollout_step


def test_the_earliest_claim_wins_and_ties_go_by_name() -> None:
    old = PairClaim("2026-11-22T10:00:00Z", "zeta")
    new = PairClaim("2026-11-22T11:00:00Z", "alpha")
    twin = PairClaim("2026-11-22T10:00:00Z", "beta")
    assert conflicting_owner(old, [old, new]) is None
    assert conflicting_owner(new, [old, new]) == "zeta"
    assert conflicting_owner(twin, [old, twin]) is None  # same second: "beta" < "zeta"
    assert conflicting_owner(old, [old, twin]) == "beta"
    assert conflicting_owner(new, []) is None


def pods(*specs: tuple[int, str, bool]) -> list[PodView]:
    return [PodView(f"c-{o}", o, h, ready, terminating=False) for o, h, ready in specs]


def test_stale_standbys_go_first_lowest_priority_first() -> None:
    step = next_rollout_step(3, "new", pods((0, "old", True), (1, "old", True), (2, "old", True)), "c-0")
    assert step is not None
    assert (step.kind, step.pod) == (StepKind.DELETE_POD, "c-2")


def test_nothing_moves_while_a_pod_is_not_ready_or_missing() -> None:
    assert next_rollout_step(2, "new", pods((0, "old", True), (1, "new", False)), "c-0") is None
    assert next_rollout_step(2, "new", pods((0, "old", True)), "c-0") is None
    terminating = [PodView("c-0", 0, "old", True, False), PodView("c-1", 1, "old", True, True)]
    assert next_rollout_step(2, "new", terminating, "c-0") is None


def test_a_stale_active_is_switched_over_to_the_best_fresh_standby() -> None:
    step = next_rollout_step(3, "new", pods((0, "old", True), (1, "new", True), (2, "new", True)), "c-0")
    assert step is not None
    assert (step.kind, step.pod) == (StepKind.SWITCHOVER, "c-1")


def test_after_the_switchover_the_old_active_is_replaced() -> None:
    step = next_rollout_step(2, "new", pods((0, "old", True), (1, "new", True)), "c-1")
    assert step is not None
    assert (step.kind, step.pod) == (StepKind.DELETE_POD, "c-0")


def test_scale_down_removes_surplus_and_moves_an_active_off_it() -> None:
    step = next_rollout_step(1, "h", pods((0, "h", True), (1, "h", True)), "c-0")
    assert step is not None and (step.kind, step.pod) == (StepKind.DELETE_POD, "c-1")
    step = next_rollout_step(1, "h", pods((0, "h", True), (1, "h", True)), "c-1")
    assert step is not None and (step.kind, step.pod) == (StepKind.SWITCHOVER, "c-0")


def test_an_up_to_date_cluster_needs_nothing() -> None:
    assert next_rollout_step(2, "h", pods((0, "h", True), (1, "h", True)), "c-0") is None
    assert next_rollout_step(2, "h", pods((0, "h", True), (1, "h", True)), None) is None
