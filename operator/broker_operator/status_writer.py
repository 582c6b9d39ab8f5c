"""Status and events written beside the failover, never in its way.

The engine's loop used to await each status write before its next step. A failover is several
steps in a row (epoch, activation, the Service), and the status changes at each, so one or two
API writes of 20-50 ms sat between the dead active and the new one's traffic
(docs/benchmarks.md, issue 23). Status is what people read; the epoch and the brokers' leases
are the fence, and neither depends on it. So the loop hands each status here and goes on:

- one write at a time, in order, so a slow write is never overtaken by an older status;
- the newest status wins: statuses handed over while a write runs are folded into one write
  of the last of them (intermediate phases may not reach the API server at all);
- a failed write is logged and left for the next status the loop hands over, which comes
  within an interval (the loop re-evaluates at least once per interval);
- a write refused because a newer engine's term has begun (:class:`StatusFenced`: the stored
  epoch is above this engine's) is logged once and lands nothing: the newer status stands, and a
  later hand-over is tried again (it goes through once this engine holds the newest epoch).

Events go the same way, every one of them, in order. They were kopf's to post, from a queue
that kopf drops when the operator stops: a drain's ``Switchover`` was lost with the evicted
replica that made it (CI, 2026-11-27). Here, like the status, they get the stopped engine's
grace (``cancel_after``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from broker_operator.core.status import ClusterStatus

logger = logging.getLogger(__name__)

# Events waiting while the API server does not take them: the oldest go first past this.
EVENT_BACKLOG = 100


class StatusFenced(Exception):  # noqa: N818 - named for what it is, like engine.ServiceFenced
    """The status was not written: the cluster's stored epoch is above the writer's, so a newer
    engine has begun a term and its status must stand (``controller/status_fence.py``)."""


class _BackgroundWriter:
    """One task at a time that writes what was handed over; bounded when the engine stops."""

    def __init__(self, cluster: str) -> None:
        self._cluster = cluster
        self._task: asyncio.Task[None] | None = None

    def _start(self, what: str) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{what} {self._cluster}")

    async def flush(self) -> None:
        """Until nothing handed over is left unwritten (tests; a loop stopping)."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def cancel_after(self, seconds: float) -> None:
        """Let what was handed over land within ``seconds``; cancel whatever is left then (at once
        for 0)."""
        if seconds <= 0 or self._task is None:
            self.cancel()
            return
        asyncio.get_running_loop().call_later(seconds, self.cancel)

    async def _run(self) -> None:
        try:
            await self._write_all()
        finally:
            self._task = None

    async def _write_all(self) -> None:
        raise NotImplementedError


class StatusWriter(_BackgroundWriter):
    """Writes the newest status handed to :meth:`submit`, one write at a time, in a task of its own."""

    def __init__(
        self, cluster: str, write: Callable[[ClusterStatus], Awaitable[None]], recorded: ClusterStatus | None
    ) -> None:
        super().__init__(cluster)
        self._write = write
        self.recorded = recorded  # the last status the API server took (or the one resumed from)
        self._wanted: ClusterStatus | None = None
        self._fenced: ClusterStatus | None = None  # the last status refused as stale (said once)

    def submit(self, status: ClusterStatus) -> None:
        """Have ``status`` written soon, unless it is what was last written."""
        if status == self.recorded and self._task is None:
            return
        self._wanted = status
        self._start("status")

    async def _write_all(self) -> None:
        while self._wanted is not None:
            status, self._wanted = self._wanted, None
            if status == self.recorded:
                continue
            try:
                await self._write(status)
            except StatusFenced as fenced:  # a newer engine's status stands; this one is stale
                (logger.debug if status == self._fenced else logger.warning)(
                    "%s: status not recorded: %s", self._cluster, fenced
                )
                self._fenced = status
                continue
            except Exception:  # the loop hands the status over again at its next step
                logger.exception("%s: recording status failed", self._cluster)
                continue
            self.recorded = status


class EventWriter(_BackgroundWriter):
    """Posts each event handed to :meth:`submit`, in order, one at a time, in a task of its own."""

    def __init__(self, cluster: str, post: Callable[[str, str, bool], Awaitable[None]]) -> None:
        super().__init__(cluster)
        self._post = post
        self._pending: deque[tuple[str, str, bool]] = deque()

    def submit(self, reason: str, message: str, warning: bool) -> None:
        if len(self._pending) >= EVENT_BACKLOG:
            reason_dropped = self._pending.popleft()[0]
            logger.warning(
                "%s: %d events unposted, the oldest dropped: %s", self._cluster, EVENT_BACKLOG, reason_dropped
            )
        self._pending.append((reason, message, warning))
        self._start("events")

    async def _write_all(self) -> None:
        while self._pending:
            reason, message, warning = self._pending.popleft()
            try:
                await self._post(reason, message, warning)
            except Exception:  # events are for people; one lost must not hold up the others
                logger.exception("%s: recording event %s failed", self._cluster, reason)
