"""The engine's loop parts that replaced costlier ones: its wake-up, its metric series, the
operator process's collector settings (docs/benchmarks.md, "Operator scale"), and the status
writer that keeps status writes off a failover's path."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from broker_operator import metrics
from broker_operator.core.status import ClusterStatus
from broker_operator.garbage_collection import THRESHOLDS, tune_collector
from broker_operator.status_writer import EVENT_BACKLOG, EventWriter, StatusFenced, StatusWriter
from broker_operator.wakeup import Wakeup


async def test_a_wakeup_sleeps_its_delay_when_nobody_wakes_it() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    await wakeup.sleep(0.05)
    assert time.monotonic() - started >= 0.045


async def test_set_ends_a_sleep_at_once_and_a_set_before_the_sleep_skips_it() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    asyncio.get_running_loop().call_later(0.02, wakeup.set)
    await asyncio.wait_for(wakeup.sleep(30.0), timeout=5.0)
    assert time.monotonic() - started < 5.0
    await asyncio.wait_for(wakeup.sleep(30.0), timeout=1.0)  # still set: returns at once
    wakeup.clear()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(wakeup.sleep(30.0), timeout=0.05)  # cleared: sleeps again


async def test_a_cancelled_sleep_leaves_no_timer_behind() -> None:
    wakeup = Wakeup()
    task = asyncio.create_task(wakeup.sleep(30.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    wakeup.set()  # no waiter left to resolve; must not raise
    timers = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    assert not any(not handle.cancelled() and handle.when() > time.monotonic() + 20 for handle in timers)


def sample(name: str, labels: dict[str, str]) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_cluster_series_count_as_labels_would_and_create_series_only_when_used() -> None:
    key = metrics.ClusterKey("erp", "series-test")
    which = {"brokercluster_namespace": "erp", "brokercluster": "series-test"}
    series = metrics.ClusterSeries(key)
    try:
        assert sample("broker_failover_heartbeats_total", {**which, "outcome": "active"}) is None
        # The failover counters exist from the start, at 0, so that increase() sees the first one.
        assert sample("broker_failover_failovers_total", {**which, "kind": "Failover"}) == 0
        series.heartbeat("active", 0.002, "b0")
        series.heartbeat("active", 0.002, "b0")
        series.heartbeat("failed", 1.0, "b1")
        assert sample("broker_failover_heartbeats_total", {**which, "outcome": "active"}) == 2
        assert sample("broker_failover_heartbeats_total", {**which, "outcome": "failed"}) == 1
        assert sample("broker_failover_heartbeat_failures_total", {**which, "broker": "b1"}) == 1
        assert sample("broker_failover_heartbeat_failures_total", {**which, "broker": "b0"}) is None
        assert sample("broker_failover_heartbeats_total", {**which, "outcome": "inactive"}) is None
        series.epoch(4)
        assert sample("broker_failover_epoch", which) == 4
        series.epoch(5)
        assert sample("broker_failover_epoch", which) == 5
        series.phase("Degraded")
        assert sample("broker_failover_phase", {**which, "phase": "Degraded"}) == 1
        assert sample("broker_failover_phase", {**which, "phase": "Healthy"}) == 0
        series.failover("Failover", 0.4)
        assert sample("broker_failover_failovers_total", {**which, "kind": "Failover"}) == 1
    finally:
        metrics.forget_cluster(key)
    left = [
        s
        for family in REGISTRY.collect()
        for s in family.samples
        if s.labels.get("brokercluster") == "series-test"
    ]
    assert left == []


@pytest.fixture
def default_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("default_thresholds")
def test_the_operator_collects_young_objects_in_larger_batches() -> None:
    gc.set_threshold(700, 10, 10)
    tune_collector()
    assert gc.get_threshold() == THRESHOLDS
    assert THRESHOLDS[0] > 700  # the point: see broker_operator/garbage_collection.py


def _status(phase: str, active: str | None = "b0") -> ClusterStatus:
    return ClusterStatus(phase=phase, active=active, epoch=1)


async def test_the_status_writer_skips_what_was_recorded_and_writes_in_order() -> None:
    written: list[str] = []

    async def write(status: ClusterStatus) -> None:
        await asyncio.sleep(0)
        written.append(status.phase)

    writer = StatusWriter("c", write, _status("Healthy"))
    writer.submit(_status("Healthy"))  # what the previous engine recorded: no write
    await writer.flush()
    assert written == []
    writer.submit(_status("FailingOver", None))
    await asyncio.sleep(0)  # its write begins
    writer.submit(_status("Pending", None))  # while it runs: folded into the newest
    writer.submit(_status("Degraded", "b1"))
    await writer.flush()
    assert written == ["FailingOver", "Degraded"]
    assert writer.recorded == _status("Degraded", "b1")


async def test_a_failed_status_write_is_written_again_when_handed_over_again() -> None:
    failures = [RuntimeError("API server away")]
    written: list[str] = []

    async def write(status: ClusterStatus) -> None:
        if failures:
            raise failures.pop()
        written.append(status.phase)

    writer = StatusWriter("c", write, None)
    writer.submit(_status("Healthy"))
    await writer.flush()
    assert written == [] and writer.recorded is None
    writer.submit(_status("Healthy"))  # the loop's next step hands the same status over
    await writer.flush()
    assert written == ["Healthy"] and writer.recorded == _status("Healthy")


async def test_the_event_writer_posts_every_event_in_order_past_a_failed_one() -> None:
    posted: list[str] = []

    async def post(reason: str, message: str, warning: bool) -> None:
        await asyncio.sleep(0)
        if reason == "EpochConflict":
            raise RuntimeError("API server away")
        posted.append(f"{reason}:{message}:{warning}")

    writer = EventWriter("c", post)
    writer.submit("Failover", "b0 -> b1", True)
    await asyncio.sleep(0)  # its post begins
    writer.submit("EpochConflict", "lost", True)  # while it runs: queued, never folded
    writer.submit("Failback", "b1 -> b0", False)
    await writer.flush()
    assert posted == ["Failover:b0 -> b1:True", "Failback:b1 -> b0:False"]


async def test_the_event_writer_keeps_the_newest_events_when_posts_cannot_keep_up() -> None:
    gate = asyncio.Event()
    posted: list[str] = []

    async def post(reason: str, message: str, warning: bool) -> None:
        await gate.wait()
        posted.append(message)

    writer = EventWriter("c", post)
    writer.submit("StaleEpoch", "0", True)
    await asyncio.sleep(0)  # "0" is being posted (the API server hangs)
    for n in range(1, EVENT_BACKLOG + 6):
        writer.submit("StaleEpoch", str(n), True)  # 1 to 5 dropped for the newest
    gate.set()
    await writer.flush()
    assert posted == ["0", *(str(n) for n in range(6, EVENT_BACKLOG + 6))]


@pytest.mark.parametrize("grace", [0.5, 0.0])
async def test_the_event_writer_lands_what_was_handed_over_within_the_grace(grace: float) -> None:
    posted: list[str] = []

    async def post(reason: str, message: str, warning: bool) -> None:
        await asyncio.sleep(0.05)
        posted.append(reason)

    writer = EventWriter("c", post)
    writer.submit("Switchover", "b0 -> b2", False)
    writer.submit("Activated", "b2", False)
    writer.cancel_after(grace)
    await asyncio.sleep(grace + 0.3)
    assert posted == (["Switchover", "Activated"] if grace else [])


async def test_a_status_refused_as_stale_is_not_recorded_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = [True, True]
    written: list[str] = []

    async def write(status: ClusterStatus) -> None:
        if refusing:
            refusing.pop()
            raise StatusFenced("the stored epoch is above this engine's")
        written.append(status.phase)

    writer = StatusWriter("c", write, None)
    with caplog.at_level(logging.DEBUG, logger="broker_operator.status_writer"):
        writer.submit(_status("Healthy"))
        await writer.flush()
        writer.submit(_status("Healthy"))  # handed over again: refused again, said no louder
        await writer.flush()
    assert written == [] and writer.recorded is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not recorded" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # a refusal is no error: no traceback
    writer.submit(_status("Degraded"))  # this engine holds the newest epoch again
    await writer.flush()
    assert written == ["Degraded"] and writer.recorded == _status("Degraded")
