"""The event loop's lateness (operator/broker_operator/loop_lag.py), measured on a real loop: a
callback that blocks the loop shows as the sampler waking late, and only for calls that overlapped
it."""

from __future__ import annotations

import asyncio
import time

from broker_operator.loop_lag import KEEP_SECONDS, NOTABLE_SECONDS, LoopLag, loop_lag, stop_sampling


async def test_a_blocked_loop_is_seen_late_by_calls_that_overlapped_it() -> None:
    lag = loop_lag()
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.2)  # the sampler runs
    before = loop.time()
    assert lag.max_lateness_since(before) == 0.0
    time.sleep(0.6)  # noqa: ASYNC251 - the point: a callback holding the loop, as a busy operator does
    await asyncio.sleep(0.2)  # the sampler wakes and records
    assert lag.max_lateness_since(before) >= 0.5
    after = loop.time()
    await asyncio.sleep(0.2)
    assert lag.max_lateness_since(after) < 0.5  # a call that started after the block saw none
    assert loop_lag() is lag  # one sampler per loop
    await stop_sampling()


def test_samples_are_bounded_and_forgotten() -> None:
    lag = LoopLag()
    lag.record(1.0, NOTABLE_SECONDS / 2)  # jitter: not kept
    assert lag.max_lateness_since(0.0) == 0.0
    lag.record(2.0, 0.7)
    lag.record(2.0 + KEEP_SECONDS + 1, 0.1)  # the first one is now older than kept
    assert lag.max_lateness_since(0.0) == 0.1
    for index in range(100_000):
        lag.record(3.0 + KEEP_SECONDS + index * 1e-6, 0.05)
    assert len(lag._samples) <= int(KEEP_SECONDS / 0.05) + 1
