"""How late this process's event loop has been running its callbacks: the operator's own delay.

Every engine of a process shares one event loop. When that loop is behind (a takeover starting
hundreds of engines at once, a burst of API work, CPU taken by other processes on the node), a
heartbeat's timeout measures the operator, not the broker: the reply may have been waiting in the
socket the whole time. Counted as a broker's failure, such timeouts failed healthy actives over
(issue 40: a takeover of 200 clusters failed 16 over with every lease held; at 500, 426).

So a sampler task sleeps ``TICK_SECONDS`` again and again and records how much later than asked
it woke (its lateness), keeping the samples of the last ``KEEP_SECONDS``. ``max_lateness_since``
answers how late the loop ran at worst since a moment: the engine asks it when a heartbeat timed
out (``engine.ClusterLoop``). One sampler per event loop, started by the first engine on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from typing import Final

TICK_SECONDS: Final = 0.05
KEEP_SECONDS: Final = 30.0  # longer than any heartbeat timeout the engine waits (activation: 10 s)
NOTABLE_SECONDS: Final = 0.02  # lateness below this is the loop's normal jitter: not kept
MAX_SAMPLES: Final = int(KEEP_SECONDS / TICK_SECONDS) + 1  # a bound even if the clock misbehaves


class LoopLag:
    """The lateness samples of one event loop: (loop time the sampler woke, how late it was)."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def record(self, woke: float, lateness: float) -> None:
        if lateness < NOTABLE_SECONDS:
            return
        self._samples.append((woke, lateness))
        while self._samples and self._samples[0][0] < woke - KEEP_SECONDS:
            self._samples.popleft()

    def max_lateness_since(self, since: float) -> float:
        """The worst lateness of a wake-up whose wait overlapped ``since`` or came after it (0.0:
        the loop was on time). A wake-up late by L at time t covers the stretch [t - L, t]."""
        return max((late for woke, late in self._samples if woke >= since), default=0.0)

    async def sample(self, tick: float = TICK_SECONDS) -> None:
        """Sleep ``tick`` and record each wake-up's lateness, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + tick
            await asyncio.sleep(tick)
            woke = loop.time()
            self.record(woke, woke - asked)


_RUNNING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[LoopLag, asyncio.Task[None]]] = (
    weakref.WeakKeyDictionary()
)


def loop_lag() -> LoopLag:
    """The running loop's ``LoopLag``, its sampler started on first use (a task that lives as long
    as the loop: ``asyncio.run`` cancels it at the end)."""
    loop = asyncio.get_running_loop()
    found = _RUNNING.get(loop)
    if found is None or found[1].done():
        lag = LoopLag()
        task = loop.create_task(lag.sample(), name="event loop lateness sampler")
        found = _RUNNING[loop] = (lag, task)
    return found[0]


async def stop_sampling() -> None:
    """Stop the running loop's sampler (tests that check for leftover tasks call it)."""
    found = _RUNNING.pop(asyncio.get_running_loop(), None)
    if found is not None:
        found[1].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await found[1]
