"""The pieces that keep one operator process at 2,000 clusters (docs/benchmarks.md, "Operator scale").

Each is an exact stand-in for what it replaced (``frozen.replace`` for ``dataclasses.replace``,
``format_time``'s cache for ``strftime``), or a schedule that only ever brings a heartbeat
sooner (``ClusterConfig.next_on_phase``); these tests hold them to that.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_operator.core import HeartbeatSettings, initial_state
from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import BrokerKnowledge, ClusterConfig, EngineState, Move, MoveKind
from broker_operator.core.model import BrokerTarget
from broker_operator.core.status import format_time, parse_time
from broker_operator.engine import cluster_phase

TARGETS = [BrokerTarget(name, f"http://127.0.0.1:{9000 + i}/soap", i) for i, name in enumerate("abc")]


def a_state() -> EngineState:
    config = ClusterConfig.of("c", TARGETS, HeartbeatSettings())
    state = initial_state(config, now=10.0, wall_now=1.7e9, epoch=3, last_active="a")
    move = Move(MoveKind.FAILOVER, from_="a", reason="HeartbeatFailed", started_at=10.0, order=("b", "c"))
    return dataclasses.replace(state, move=move, events_due=(("Reason", "text", False),))


@pytest.mark.parametrize(
    "changes",
    [{}, {"epoch": 9}, {"active": "b", "active_epoch": 4, "move": None}, {"events_due": ()}],
)
def test_replace_gives_what_dataclasses_replace_gives(changes: dict[str, object]) -> None:
    state = a_state()
    ours, theirs = replace(state, **changes), dataclasses.replace(state, **changes)
    assert ours == theirs and type(ours) is EngineState
    assert ours is not state and state == a_state()  # a copy; the original is untouched
    assert [getattr(ours, f.name) for f in dataclasses.fields(ours)] == [
        getattr(theirs, f.name) for f in dataclasses.fields(theirs)
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.epoch = 1  # type: ignore[misc]  # still frozen
    broker = state.brokers[0]
    assert replace(broker, failures=2) == dataclasses.replace(broker, failures=2)
    assert isinstance(replace(broker, failures=2), BrokerKnowledge)


def test_replace_refuses_a_field_the_class_does_not_have() -> None:
    with pytest.raises(TypeError):
        replace(a_state(), no_such_field=1)


def test_replace_leaves_classes_with_post_init_to_dataclasses() -> None:
    # HeartbeatSettings validates itself in __post_init__: that check must still run.
    settings = HeartbeatSettings()
    assert replace(settings, interval_seconds=2.0).interval_seconds == 2.0
    with pytest.raises(ValueError, match="lease"):
        replace(settings, lease_seconds=0.5)


def test_format_time_is_the_text_datetime_gives() -> None:
    rng = random.Random(7)
    values = [rng.uniform(0, 4e9) for _ in range(20_000)] + [rng.uniform(1.7e9, 1.8e9) for _ in range(20_000)]
    # Microseconds that round up into the next second, and exact halves (rounded to even).
    values += [1.9999995, 1700000000.9999996, 1700000000.0000004, 0.0, 1e9 + 0.5e-6, 1764194400.9999999]
    for wall in values:
        assert format_time(wall) == datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), wall


def test_parse_time_reads_back_what_format_time_wrote() -> None:
    # A restarted engine keeps the recorded lastFailover through this pair: if the text changed on
    # the way, every restart would write a status that differs by a microsecond.
    rng = random.Random(11)
    for wall in [rng.uniform(1.7e9, 2.2e9) for _ in range(20_000)] + [1764194400.9999999, 0.0]:
        text = format_time(wall)
        parsed = parse_time(text)
        assert parsed is not None and format_time(parsed) == text, text
    assert parse_time("2026-11-27T13:44:12.5+01:00") == parse_time("2026-11-27T12:44:12.500000Z")
    assert parse_time("yesterday") is None
    assert parse_time("2026-11-27T13:44:12") is None  # no zone: not a time Kubernetes writes


def config_with(phase: float | None) -> ClusterConfig:
    return ClusterConfig.of("c", TARGETS, HeartbeatSettings(), phase=phase)


def test_without_a_phase_the_next_heartbeat_is_one_period_later() -> None:
    assert config_with(None).next_on_phase(12.25, 1.0) == 13.25
    assert config_with(None).next_on_phase(12.25, 10.0, "b") == 22.25


@given(
    now=st.floats(0.0, 1e7),
    period=st.sampled_from([0.2, 1.0, 10.0]),
    phase=st.floats(0.0, 1.0, exclude_max=True),
    broker=st.none() | st.sampled_from("abc"),
)
def test_a_phase_only_brings_the_heartbeat_sooner_and_keeps_its_place(
    now: float, period: float, phase: float, broker: str | None
) -> None:
    config = config_with(phase)
    due = config.next_on_phase(now, period, broker)
    assert now < due <= now + period + 1e-9  # never later than without a phase
    # Scheduling again from the due time gives exactly one period more: the place is kept.
    assert config.next_on_phase(due, period, broker) == pytest.approx(due + period, abs=1e-6)


def test_a_clusters_brokers_and_many_clusters_fall_at_different_places() -> None:
    config = config_with(0.1)
    dues = {config.next_on_phase(100.0, 10.0, name) for name in "abc"}
    assert len(dues) == 3  # the standbys of one cluster are not probed together
    # 2,000 clusters activated at the same instant renew over the whole interval, not at once.
    renewals = sorted(
        config_with(cluster_phase(f"c{i}")).next_on_phase(50.0, 1.0) - 50.0 for i in range(2000)
    )
    per_tenth = [sum(1 for r in renewals if k / 10 < r <= (k + 1) / 10) for k in range(10)]
    assert min(per_tenth) > 120 and max(per_tenth) < 280, per_tenth


def test_a_phase_outside_the_period_is_refused() -> None:
    with pytest.raises(ValueError, match="phase"):
        config_with(1.0)
