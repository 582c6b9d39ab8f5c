"""The engine loop's sleep: until a delay has passed or something wakes it, whichever is first."""

from __future__ import annotations

import asyncio


class Wakeup:
    """Sleep until a delay has passed or ``set()`` is called, whichever comes first; ``set()``
    before the sleep makes it return at once, until ``clear()``.

    What ``asyncio.timeout`` around ``Event.wait`` does, without its exceptions: that ends every
    idle wait in a CancelledError and a TimeoutError, whose tracebacks are reference cycles the
    cyclic collector has to find, thousands a second with 2,000 clusters (docs/benchmarks.md).
    """

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None:
            _resolve(self._waiter)

    def clear(self) -> None:
        self._set = False

    async def sleep(self, delay: float) -> None:
        if self._set:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(delay, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
