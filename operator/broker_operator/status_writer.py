"""Status written beside the failover, never in its way.

The engine's loop used to await each status write before its next step. A failover is several
steps in a row (epoch, activation, the Service), and the status changes at each, so one or two
API writes of 20-50 ms sat between the dead active and the new one's traffic
(docs/benchmarks.md, issue 23). Status is what people read; the epoch and the brokers' leases
are the fence, and neither depends on it. So the loop hands each status here and goes on:

- one write at a time, in order, so a slow write is never overtaken by an older status;
- the newest status wins: statuses handed over while a write runs are folded into one write
  of the last of them (intermediate phases may not reach the API server at all);
- a failed write is logged and left for the next status the loop hands over, which comes
  within an interval (the loop re-evaluates at least once per interval).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker_operator.core.status import ClusterStatus

logger = logging.getLogger(__name__)


class StatusWriter:
    """Writes the newest status handed to :meth:`submit`, one write at a time, in a task of its own."""

    def __init__(
        self, cluster: str, write: Callable[[ClusterStatus], Awaitable[None]], recorded: ClusterStatus | None
    ) -> None:
        self._cluster = cluster
        self._write = write
        self.recorded = recorded  # the last status the API server took (or the one resumed from)
        self._wanted: ClusterStatus | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, status: ClusterStatus) -> None:
        """Have ``status`` written soon, unless it is what was last written."""
        if status == self.recorded and self._task is None:
            return
        self._wanted = status
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"status {self._cluster}")

    async def flush(self) -> None:
        """Until nothing handed over is left unwritten (tests; a loop stopping)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def cancel_after(self, seconds: float) -> None:
        """Let the write under way, and one of the newest status handed over, land within
        ``seconds``; cancel whatever is left then (at once for 0)."""
        if seconds <= 0 or self._task is None:
            self.cancel()
            return
        asyncio.get_running_loop().call_later(seconds, self.cancel)

    async def _run(self) -> None:
        try:
            while self._wanted is not None:
                status, self._wanted = self._wanted, None
                if status == self.recorded:
                    continue
                try:
                    await self._write(status)
                except Exception:  # the loop hands the status over again at its next step
                    logger.exception("%s: recording status failed", self._cluster)
                    continue
                self.recorded = status
        finally:
            self._task = None
