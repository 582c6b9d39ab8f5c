"""``HeartbeatSettings.from_spec``, the one parser of the heartbeat fields, for the engine and the controller.

Its defaults and bounds are the CRD's (checked in tests/unit/controller/test_crd.py); here: the
rules between fields, every problem named at once, the CRD's types for the controller (decimal
seconds from 0.1 for the interval, timeout and lease, whole seconds for the others) and fractions
for the local runner, and the controller's ``parse_spec`` giving the same answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker_operator.controller.spec import SpecError, parse_spec
from broker_operator.core.model import HeartbeatSettings, SettingsError, cel_number


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


def test_decimal_seconds_for_the_controller_any_fraction_for_the_local_runner() -> None:
    fast = {"intervalSeconds": 0.2, "timeoutSeconds": 0.2, "failureThreshold": 2, "leaseSeconds": 2.5}
    settings = HeartbeatSettings.from_spec({"heartbeat": fast}, crd_bounds=True)
    assert (settings.interval_seconds, settings.timeout_seconds, settings.lease_seconds) == (0.2, 0.2, 2.5)
    assert all(
        type(value) is float
        for value in (settings.interval_seconds, settings.timeout_seconds, settings.lease_seconds)
    )
    # Integers stay valid (existing manifests), and are read as floats too.
    whole = HeartbeatSettings.from_spec(
        {"heartbeat": {"intervalSeconds": 2, "leaseSeconds": 9}}, crd_bounds=True
    )
    assert type(whole.interval_seconds) is float and whole.interval_seconds == 2.0
    # Below the CRD's 0.1: refused on Kubernetes, allowed by the local runner.
    slower = {"intervalSeconds": 0.05, "timeoutSeconds": 0.05, "leaseSeconds": 1}
    with pytest.raises(
        SettingsError, match=r"^spec.heartbeat.intervalSeconds \(0.05\) must be a number from 0.1 to 60;"
    ):
        HeartbeatSettings.from_spec({"heartbeat": slower}, crd_bounds=True)
    assert HeartbeatSettings.from_spec({"heartbeat": slower}).interval_seconds == 0.05
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.intervalSeconds \(0\) must be a number of seconds above 0"
    ):
        HeartbeatSettings.from_spec({"heartbeat": {"intervalSeconds": 0}})
    # The other durations stay whole seconds in the CRD.
    with pytest.raises(
        SettingsError, match=r"spec.heartbeat.standbyProbeSeconds \(0.5\) must be an integer from 0 to 3600"
    ):
        HeartbeatSettings.from_spec({"heartbeat": {"standbyProbeSeconds": 0.5}}, crd_bounds=True)


@pytest.mark.parametrize("crd_bounds", [True, False])
def test_a_bool_is_not_a_number_of_seconds(crd_bounds: bool) -> None:
    # YAML's `true` is a bool, and a bool is an int in Python.
    with pytest.raises(SettingsError) as refused:
        HeartbeatSettings.from_spec({"heartbeat": {"leaseSeconds": True}}, crd_bounds=crd_bounds)
    assert refused.value.problems == ("spec.heartbeat.leaseSeconds (True) must be a number from 0.1 to 3600",)


@pytest.mark.parametrize(
    ("heartbeat", "problem"),
    [
        (
            {"intervalSeconds": 0.5, "failureThreshold": 3, "leaseSeconds": 1.5, "timeoutSeconds": 0.5},
            "spec.heartbeat.leaseSeconds (1.5) must exceed intervalSeconds × failureThreshold (1.5)",  # noqa: RUF001
        ),
        # CEL's %s writes the double product as it is, not rounded as Python's :g would ("0.3").
        (
            {"intervalSeconds": 0.1, "failureThreshold": 3, "leaseSeconds": 0.3, "timeoutSeconds": 0.1},
            "spec.heartbeat.leaseSeconds (0.3) must exceed intervalSeconds × failureThreshold "  # noqa: RUF001
            "(0.30000000000000004)",
        ),
        (
            {"intervalSeconds": 0.2, "timeoutSeconds": 0.25, "leaseSeconds": 2},
            "spec.heartbeat.timeoutSeconds (0.25) must not exceed intervalSeconds (0.2)",
        ),
    ],
)
def test_decimal_rule_violations_are_worded_as_the_cel_rules(heartbeat: dict[str, Any], problem: str) -> None:
    with pytest.raises(SettingsError) as refused:
        HeartbeatSettings.from_spec({"heartbeat": heartbeat}, crd_bounds=True)
    assert refused.value.problems == (problem,)


@pytest.mark.parametrize(
    ("value", "go"),
    # What Go's fmt "%g" (CEL's `'%s'.format([double])`) prints for each, checked with go run.
    [
        (1.0, "1"),
        (2, "2"),
        (0.2, "0.2"),
        (0.1 * 3, "0.30000000000000004"),
        (1234.5678, "1234.5678"),
        (3600.0, "3600"),
        (0.00012, "0.00012"),
        (999999.9, "999999.9"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (1e-5, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (0.0, "0"),
    ],
)
def test_numbers_are_written_as_cel_writes_a_double(value: float, go: str) -> None:
    assert cel_number(value) == go


@pytest.mark.parametrize(
    "heartbeat",
    [
        {"intervalSeconds": 2, "timeoutSeconds": 3, "leaseSeconds": 9},
        {"leaseSeconds": 2, "intervalSeconds": 1, "failureThreshold": 3},
        {"standbyProbeSeconds": -1},
        {"failureThreshold": True},
        {"intervalSeconds": 0.05},
        {"leaseSeconds": True},
        {"intervalSeconds": 0.1, "failureThreshold": 3, "leaseSeconds": 0.3, "timeoutSeconds": 0.1},
        {"intervalSeconds": 0.2, "timeoutSeconds": 0.25, "leaseSeconds": 2},
    ],
)
def test_the_controller_refuses_with_the_engines_words(heartbeat: dict[str, Any]) -> None:
    with pytest.raises(SettingsError) as engine:
        HeartbeatSettings.from_spec({"heartbeat": heartbeat}, crd_bounds=True)
    with pytest.raises(SpecError) as controller:
        parse_spec("orders", pair(heartbeat=heartbeat))
    assert controller.value.problems == engine.value.problems


@pytest.mark.parametrize(
    "heartbeat",
    [
        {"intervalSeconds": 2, "leaseSeconds": 9},
        {"intervalSeconds": 0.2, "timeoutSeconds": 0.2, "failureThreshold": 2, "leaseSeconds": 2},
    ],
)
def test_the_controllers_spec_carries_the_engines_settings(heartbeat: dict[str, Any]) -> None:
    spec = pair(heartbeat=heartbeat, failback="Manual", failbackStableSeconds=5)
    assert parse_spec("orders", spec).heartbeat == HeartbeatSettings.from_spec(spec)
