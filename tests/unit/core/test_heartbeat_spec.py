"""``HeartbeatSettings.from_spec``, the one parser of the heartbeat fields, for the engine and the controller.

Its defaults and bounds are the CRD's (checked in tests/unit/controller/test_crd.py); here: the
rules between fields, every problem named at once, whole seconds for the controller and fractions
for the local runner, and the controller's ``parse_spec`` giving the same answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_operator.controller.spec import SpecError, parse_spec
from broker_operator.core.model import HeartbeatSettings, SettingsError


def pair(**spec: Any) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **spec}


def test_a_timeout_longer_than_the_interval_is_refused_by_the_engine_too() -> None:
    # The CRD's CEL rule and the controller refused it; the engine's own parser did not.
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.timeoutSeconds \(3\) must not exceed intervalSeconds \(2\)"
    ):
        HeartbeatSettings.from_spec(
            {"heartbeat": {"intervalSeconds": 2, "timeoutSeconds": 3, "leaseSeconds": 9}}
        )
    with pytest.raises(SettingsError, match="timeoutSeconds"):
        HeartbeatSettings(interval_seconds=0.5, timeout_seconds=1.0)


def test_the_engine_applies_the_crds_bounds() -> None:
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.intervalSeconds \(61\) must be a number of seconds"
    ):
        HeartbeatSettings.from_spec({"heartbeat": {"intervalSeconds": 61, "leaseSeconds": 200}})
    with pytest.raises(SettingsError, match=r"spec.failbackStableSeconds \(90000\)"):
        HeartbeatSettings.from_spec({"failbackStableSeconds": 90000})


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(SettingsError) as refused:
        HeartbeatSettings.from_spec(
            {"heartbeat": {"failureThreshold": 0, "timeoutSeconds": 5}, "failback": "Sometimes"}
        )
    assert [problem.split(" (")[0] for problem in refused.value.problems] == [
        "spec.heartbeat.failureThreshold",
        "spec.heartbeat.timeoutSeconds",
        "spec.failback",
    ]


def test_whole_seconds_for_the_controller_fractions_for_the_local_runner() -> None:
    fast = {"heartbeat": {"intervalSeconds": 0.5, "timeoutSeconds": 0.5, "leaseSeconds": 2}}
    assert HeartbeatSettings.from_spec(fast).interval_seconds == 0.5
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.intervalSeconds \(0.5\) must be an integer from 1 to 60"
    ):
        HeartbeatSettings.from_spec(fast, whole_seconds=True)
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.intervalSeconds \(0\) must be a number of seconds above 0"
    ):
        HeartbeatSettings.from_spec({"heartbeat": {"intervalSeconds": 0}})


@pytest.mark.parametrize(
    "heartbeat",
    [
        {"intervalSeconds": 2, "timeoutSeconds": 3, "leaseSeconds": 9},
        {"leaseSeconds": 2, "intervalSeconds": 1, "failureThreshold": 3},
        {"standbyProbeSeconds": -1},
        {"failureThreshold": True},
    ],
)
def test_the_controller_refuses_with_the_engines_words(heartbeat: dict[str, Any]) -> None:
    with pytest.raises(SettingsError) as engine:
        HeartbeatSettings.from_spec({"heartbeat": heartbeat}, whole_seconds=True)
    with pytest.raises(SpecError) as controller:
        parse_spec("orders", pair(heartbeat=heartbeat))
    assert controller.value.problems == engine.value.problems


def test_the_controllers_spec_carries_the_engines_settings() -> None:
    spec = pair(
        heartbeat={"intervalSeconds": 2, "leaseSeconds": 9}, failback="Manual", failbackStableSeconds=5
    )
    assert parse_spec("orders", spec).heartbeat == HeartbeatSettings.from_spec(spec)
