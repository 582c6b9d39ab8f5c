"""The failover engine's public surface: the per-cluster heartbeat loop and its shell protocol.

``ClusterLoop`` runs one BrokerCluster: it asks the pure decision core
(:mod:`broker_operator.core`) what to do, carries the actions out (heartbeats via
:class:`HeartbeatClient`, epochs, the ``-active`` Service, status and events via a
:class:`ClusterShell`), and feeds the outcomes back. The kopf controller runs one
loop per cluster in a daemon; the local runner and the benchmarks run the same
loop with shells of their own, without Kubernetes.

How the loop keeps the core's promises:
- heartbeats of one step run concurrently, but the core never puts two
  activations, or an activation and an epoch allocation, in one step, so
  activations happen strictly one at a time and in priority order;
- every heartbeat is bounded by ``timeoutSeconds`` here as well as in the client, an
  activation by at least ``ACTIVATION_MIN_TIMEOUT_SECONDS``: the broker tells the cloud and the
  backend its epoch before it answers, two round trips a renewal does not make, and a candidate
  given up on too soon must be fenced for a whole lease before the walk goes on;
- status is written only when the engine-owned fields change (heartbeat times
  alone do not count, nor does the epoch: ``allocate_epoch`` is its only writer),
  by a ``StatusWriter`` beside the loop, so that no status write sits between a failover's
  steps; events as the core emits them, by an ``EventWriter`` beside it likewise.

What it does not do: read Kubernetes objects, decide ``Conflict``, or own the
operator's HTTP server. On cancellation it simply stops, leaving brokers as they
are (an active broker keeps its lease until it expires or a new engine renews it);
only the status and the events it handed over may still land (``status_grace_seconds``).
When the operator process exits, :meth:`ClusterLoop.hand_over` then renews a steady active
once more with the handover lease (``core/handover.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from broker_operator import metrics
from broker_operator.broker_watch import BrokerWatches
from broker_operator.core import (
    ActivePointed,
    AllocateEpoch,
    ClusterConfig,
    EpochGranted,
    EpochRefused,
    HeartbeatAnswered,
    HeartbeatFailed,
    MoveKind,
    Observation,
    PointActive,
    RecordEvent,
    SendHeartbeat,
    initial_state,
    status_of,
    step,
)
from broker_operator.core.frozen import replace
from broker_operator.core.handover import handover_renewal
from broker_operator.core.knowledge import LastMove
from broker_operator.core.model import BrokerTarget, HeartbeatSettings, PodFacts, SettingsError
from broker_operator.core.status import BrokerStatus, ClusterStatus, LastFailover, Phase, parse_time
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError, HeartbeatReply
from broker_operator.loop_lag import LoopLag, loop_lag
from broker_operator.status_writer import EventWriter, StatusWriter
from broker_operator.wakeup import Wakeup

__all__ = [
    "BrokerStatus",
    "BrokerTarget",
    "ClusterLoop",
    "ClusterShell",
    "ClusterStatus",
    "EpochConflict",
    "HeartbeatClient",
    "HeartbeatError",
    "HeartbeatReply",
    "HeartbeatSettings",
    "LastFailover",
    "Phase",
    "PodFacts",
    "SettingsError",
]

logger = logging.getLogger(__name__)

# Event reasons the core emits when the active changed (see core/observe.py).
_CHANGES_OF_ACTIVE = frozenset(metrics.CHANGES_OF_ACTIVE)


class EpochConflict(Exception):  # noqa: N818 - the name is part of the engine/shell contract
    """``allocate_epoch`` lost an optimistic-concurrency race (another writer changed the epoch).

    ``current`` is the epoch the shell found stored, when it knows it; the engine
    then allocates above it on its next try.
    """

    def __init__(self, message: str, current: int | None = None) -> None:
        super().__init__(message)
        self.current = current


# An activation answers after the broker told both targets its epoch (two HTTP round trips): with
# the sub-second timeouts a fast failover uses, a busy node made it miss them (docs/benchmarks.md).
ACTIVATION_MIN_TIMEOUT_SECONDS = 1.0
# A heartbeat's timeout is the operator's own when its event loop ran this late (a share of the
# timeout) during the call: the rest of the timeout is then too short to blame the broker.
OPERATOR_LATE_SHARE = 0.5


class ServiceFenced(Exception):  # noqa: N818 - named for what it is, like EpochConflict
    """The ``-active`` Service was pointed under a higher epoch than the write carried: a newer
    term has begun, and an older one must not move the Service back."""


class ClusterShell(Protocol):
    """What the engine needs from its surroundings (Kubernetes, or a local state file)."""

    async def allocate_epoch(self, current: int, epoch: int) -> int:
        """Record ``epoch`` (above ``current``) durably and return it, or raise :class:`EpochConflict`
        if the stored epoch is above ``current``. The only writer of the stored epoch."""
        ...

    async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
        """Point the ``-active`` Service at ``active`` (the broker activated at ``url``) or at
        nobody, fenced by ``epoch``: raise :class:`ServiceFenced` if it was pointed under a
        higher one. Then move the ``role=active`` label."""
        ...

    async def record_status(self, status: ClusterStatus) -> None:
        """Called only when the engine-owned status changed; never writes ``status.epoch``."""
        ...

    async def record_event(self, reason: str, message: str, warning: bool) -> None: ...

    def pod_facts(self) -> Mapping[str, PodFacts]:
        """Facts per broker name; an empty mapping in endpoints mode."""
        ...


def _recorded_last_move(recorded: ClusterStatus | None) -> LastMove | None:
    """The status's ``lastFailover`` as the engine's own record of it (None if absent or unreadable)."""
    last = recorded.last_failover if recorded is not None else None
    completed = parse_time(last.time) if last is not None else None
    if last is None or completed is None:
        return None
    return LastMove(
        completed_wall=completed,
        from_=last.from_,
        to=last.to,
        reason=last.reason,
        duration_ms=last.duration_ms,
    )


def cluster_phase(cluster: str) -> float:
    """Where in each period a cluster's periodic heartbeats fall (``ClusterConfig.next_on_phase``):
    a fraction spread evenly over the clusters' names, the same in every operator process."""
    return zlib.crc32(cluster.encode()) / 2**32


class ClusterLoop:
    """The heartbeat loop of one BrokerCluster (see the module docstring)."""

    def __init__(  # noqa: PLR0917 - positional order fixed by the engine/shell contract
        self,
        cluster: str,
        targets: Sequence[BrokerTarget],
        settings: HeartbeatSettings,
        shell: ClusterShell,
        heartbeats: HeartbeatClient,
        initial: ClusterStatus | None = None,
        preferred_active: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
        start_jitter: bool = True,
        watch: bool = False,
        status_grace_seconds: float = 0.0,
        halted: Callable[[], bool] | None = None,
        namespace: str = "",
        paused: bool = False,
    ) -> None:
        """``watch``: hold a watch connection to each broker (``broker_watch``), pods mode only:
        it hears of a crash at once and can prove a process gone. ``status_grace_seconds``: how
        long the status and the events handed over by a cancellation may still take to land (see
        :meth:`run`). ``halted``: asked before every step; once true the loop ends without acting
        (the operator process is exiting: no engine of it may act after the first saw that).
        ``namespace``: the BrokerCluster's, for its metric series (none in the local runner).
        ``paused``: reconciliation is paused (``core/pause.py``); :meth:`update` changes it."""
        self.cluster = cluster
        self._phase = cluster_phase(cluster)
        self._paused = paused
        self._config = self._config_of(targets, settings, preferred_active)
        self._shell = shell
        self._heartbeats = heartbeats
        self._clock = clock
        self._status = StatusWriter(cluster, shell.record_status, initial)
        self._events = EventWriter(cluster, shell.record_event)
        self._state = initial_state(
            self._config,
            now=clock(),
            wall_now=wall_clock(),
            epoch=initial.epoch if initial else 0,
            last_active=initial.active if initial else None,
            active_epoch=initial.active_epoch if initial else None,
            failovers=initial.failovers if initial else 0,
            last_move=_recorded_last_move(initial),
        )
        logger.info(
            "%s: starting from status active=%s epoch=%s activeEpoch=%s; brokers with addresses: %s;"
            " epoch %s",
            cluster,
            initial.active if initial else None,
            initial.epoch if initial else 0,
            initial.active_epoch if initial else None,
            ", ".join(t.name for t in targets) or "none",
            (
                f"kept for {self._state.epoch_holder}"
                if self._state.epoch_holder
                else "ended"
                if self._state.epoch_ended
                else "none granted yet"
            ),
        )
        self._wakeup = Wakeup()
        self._start_jitter = 1.0 if start_jitter else 0.0
        self._watch = watch
        self._signals: list[Observation] = []  # from the watch connections, for the next step
        self._status_grace = status_grace_seconds
        self._halted = halted or (lambda: False)
        self._handover: asyncio.Future[bool] | None = None
        self._series = metrics.ClusterSeries(metrics.ClusterKey(namespace, cluster))
        self._series.paused(paused)

    @property
    def status(self) -> ClusterStatus:
        """The status as the engine sees it now (recorded or about to be)."""
        return status_of(self._state, self._config)

    def update(
        self, targets: Sequence[BrokerTarget], settings: HeartbeatSettings, preferred_active: str | None,
        *, paused: bool | None = None,
    ) -> None:  # fmt: skip
        """The spec changed: take the new brokers, settings and preferred active at the next step;
        and the pause, unless ``paused`` is None (kept as it is)."""
        if paused is not None:
            self._paused = paused
            self._series.paused(paused)
        self._config = self._config_of(targets, settings, preferred_active)
        self._wakeup.set()

    def _config_of(
        self, targets: Sequence[BrokerTarget], settings: HeartbeatSettings, preferred_active: str | None
    ) -> ClusterConfig:
        return ClusterConfig.of(
            self.cluster, targets, settings, preferred_active, self._phase, paused=self._paused
        )

    def wake(self) -> None:
        """A pod fact changed: re-evaluate now (a dead active fails over at once)."""
        self._wakeup.set()

    def signal(self, observation: Observation) -> None:
        """A watch connection saw something (``ConnectionLost``, ``ProcessGone``): step now."""
        self._signals.append(observation)
        self._wakeup.set()

    def repoint(self) -> None:
        """The ``-active`` Service's endpoints were lost (deleted by hand): write them again now."""
        self._state = replace(self._state, pointed_known=False, point_retry_at=0.0)
        self._wakeup.set()

    async def run(self) -> None:
        # Many loops start together when the operator starts; a random phase within
        # one interval spreads their heartbeats instead of sending them in bursts.
        # Safe: the lease exceeds interval x failureThreshold, so the active outlives it.
        await asyncio.sleep(random.uniform(0, self._config.settings.interval_seconds) * self._start_jitter)
        watches = BrokerWatches(self._heartbeats, self.signal, self._clock) if self._watch else None
        try:
            await self._run(watches)
        finally:
            # The steps stop here, at once: a stopped engine must not act while the replica that
            # takes over may already have read the status. What it knows may still be written,
            # for a bounded time, including a step cancelled during its calls: cancelled with the
            # engine, a drain's switchover was lost from the status (docs/operator.md, "Stopping").
            if self._status_grace > 0:
                self._hand_over_status()
            self._status.cancel_after(self._status_grace)
            self._events.cancel_after(self._status_grace)
            if watches is not None:
                await watches.close()

    async def hand_over(self, deadline: float) -> bool:
        """When the operator exits: the handover renewal of a steady active (``core/handover.py``),
        sent only before ``deadline`` (monotonic) and bounded by it. True when the active took it.
        Once per loop: a later call waits for the first one's outcome."""
        if self._handover is None:
            self._handover = asyncio.ensure_future(self._send_handover(deadline))
        return await asyncio.shield(self._handover)

    async def _send_handover(self, deadline: float) -> bool:
        action = handover_renewal(self._state, self._config, self._clock())
        if action is None or self._clock() >= deadline:
            return False
        try:
            async with asyncio.timeout(deadline - self._clock()):
                outcome = await self._heartbeat(action)
        except TimeoutError:
            outcome = None
        taken = isinstance(outcome, HeartbeatAnswered) and outcome.reply.state == "Active"
        logger.info(
            "%s: handed %s over at epoch %d with a %gs lease: %s",
            self.cluster,
            action.broker,
            action.epoch,
            action.lease_seconds,
            "taken" if taken else f"not taken ({outcome})",
        )
        return taken

    async def _run(self, watches: BrokerWatches | None) -> None:
        observations: list[Observation] = []
        last_phase: str | None = None
        followed: tuple[BrokerTarget, ...] | None = None
        while not self._halted():
            self._wakeup.clear()
            if watches is not None and self._config.targets is not followed:
                followed = self._config.targets  # a new tuple only when update() took a new spec
                watches.follow(followed)
            # The outcomes of the last step first, then what the watches saw since: a proof of
            # death is weighed against every answer that came before it (core.observe).
            observations, self._signals = [*observations, *self._signals], []
            decision = step(self._state, self._config, self._shell.pod_facts(), self._clock(), observations)
            self._state = decision.state
            observations = await self._carry_out(decision.actions)
            # After the step's calls: the Service is pointed at a new active before the status names
            # it (tests and people act on the status); written beside the next steps.
            status = self._hand_over_status()
            if status.phase != last_phase:
                self._series.phase(status.phase)
                last_phase = status.phase
            self._series.epoch(status.epoch)
            if observations:
                continue  # fold the outcomes in at once: the next activation may depend on them
            delay = decision.wake_at - self._clock()
            if delay > 0:
                await self._wakeup.sleep(delay)

    async def _carry_out(self, actions: Sequence[object]) -> list[Observation]:
        # Pointing the Service runs alongside the heartbeats rather than after them
        # (and is started first): the backend reaches the new active only through it,
        # and a heartbeat of the same step to a frozen broker takes a whole timeout.
        calls = [
            self._heartbeat(action)
            if isinstance(action, SendHeartbeat)
            else self._allocate(action)
            if isinstance(action, AllocateEpoch)
            else self._point(action)
            for action in actions
            if isinstance(action, SendHeartbeat | AllocateEpoch | PointActive)
        ]
        try:
            if len(calls) == 1:
                outcomes = [await calls[0]]  # a renewal, most steps: a task for it would only cost
            else:
                outcomes = await asyncio.gather(*calls)
        finally:
            # After the calls, and also when they are cancelled: the events tell what the step
            # learnt (a completed move among them), which the status handed over at a
            # cancellation already shows (run()).
            for action in actions:
                if isinstance(action, RecordEvent):
                    self._event(action)
        return [outcome for outcome in outcomes if outcome is not None]

    async def _point(self, action: PointActive) -> Observation | None:
        try:
            await self._shell.point_active(action.active, action.epoch, action.url)
        except ServiceFenced as fenced:  # a newer term moved it; our renewals will hear so
            logger.warning("%s: not pointing the Service at %s: %s", self.cluster, action.active, fenced)
            return None
        except Exception:  # the core retries once per interval
            logger.exception("%s: pointing the Service at %s failed", self.cluster, action.active)
            return None
        return ActivePointed(action.active)

    async def _heartbeat(self, action: SendHeartbeat) -> Observation:
        target = self._config.target(action.broker) or BrokerTarget(action.broker, action.url, priority=-1)
        started = time.perf_counter()
        lag, sent_at = loop_lag(), asyncio.get_running_loop().time()
        timeout = self._config.settings.timeout_seconds
        if action.activation:
            timeout = max(timeout, ACTIVATION_MIN_TIMEOUT_SECONDS)
        try:
            async with asyncio.timeout(timeout):
                reply = await self._heartbeats.heartbeat(
                    target,
                    action.active,
                    action.epoch,
                    renew=action.renew,
                    limit_seconds=timeout,
                    lease_seconds=action.lease_seconds,
                )
        except TimeoutError:
            outcome: Observation = self._timed_out(
                action, f"timeout after {timeout:g}s", timeout, lag, sent_at
            )
        except HeartbeatError as error:
            if error.timed_out:
                outcome = self._timed_out(action, error.reason, timeout, lag, sent_at)
            else:
                outcome = HeartbeatFailed(
                    action.broker,
                    action.active,
                    action.epoch,
                    reached=error.reached,
                    reason=error.reason,
                    renew=action.renew,
                    peer_closed=error.peer_closed,
                    tls_error=error.tls_error,
                )
        else:
            outcome = HeartbeatAnswered(action.broker, action.active, action.epoch, reply, action.renew)
        if isinstance(outcome, HeartbeatAnswered):
            kind = outcome.reply.state.lower()
        else:
            kind = (
                "late"
                if isinstance(outcome, HeartbeatFailed) and outcome.operator_late
                else "tls"
                if isinstance(outcome, HeartbeatFailed) and outcome.tls_error
                else "failed"
            )
        self._series.heartbeat(kind, time.perf_counter() - started, action.broker)
        return outcome

    def _timed_out(
        self, action: SendHeartbeat, reason: str, timeout: float, lag: LoopLag, sent_at: float
    ) -> HeartbeatFailed:
        """A heartbeat with no reply in time; the operator's own fault if its loop ran late: the
        sampler saw it late during the call, or this very timeout came late (a loop blocked up to
        now has not let the sampler record that yet)."""
        overdue = asyncio.get_running_loop().time() - (sent_at + timeout)
        late = max(overdue, lag.max_lateness_since(sent_at))
        operator_late = late >= OPERATOR_LATE_SHARE * timeout
        if operator_late:
            reason = f"{reason}, this operator's event loop {late:.1f}s late: not counted against the broker"
        return HeartbeatFailed(
            action.broker,
            action.active,
            action.epoch,
            reached=True,
            reason=reason,
            renew=action.renew,
            operator_late=operator_late,
        )

    async def _allocate(self, action: AllocateEpoch) -> Observation:
        try:
            return EpochGranted(await self._shell.allocate_epoch(action.current, action.epoch))
        except EpochConflict as conflict:
            return EpochRefused(conflict.current, str(conflict))
        except Exception as error:  # an API server hiccup: retried after an interval
            logger.exception("%s: allocating epoch %d failed", self.cluster, action.epoch)
            return EpochRefused(None, f"{type(error).__name__}: {error}")

    def _event(self, event: RecordEvent) -> None:
        log = logger.warning if event.warning else logger.info
        log("%s: %s: %s", self.cluster, event.reason, event.message)
        if event.reason in _CHANGES_OF_ACTIVE:
            last = self._state.last_move
            self._series.failover(event.reason, last.duration_ms / 1000 if last is not None else None)
        self._events.submit(event.reason, event.message, event.warning)  # posted beside the steps

    def _hand_over_status(self) -> ClusterStatus:
        """The status of what the engine knows now, handed to the writer unless it is still
        confirming the recorded active (see below)."""
        status = status_of(self._state, self._config)
        if not self._confirming_recorded_active():
            self._status.submit(status)
        return status

    def _confirming_recorded_active(self) -> bool:
        """The first round after a (re)start, while the active that status names is asked again.

        Status stays as the previous engine wrote it until that round ends, rather than showing
        Pending with no active for the second it takes. Each of those writes was one per cluster
        at every operator restart (and its way back, another), and at 1,000 clusters the renewals'
        token reads queued behind them past every lease (docs/benchmarks.md). Status is what
        people read; the epoch and the brokers' leases are the fence, and neither waits for it.
        """
        move = self._state.move
        return (
            move is not None
            and move.kind is MoveKind.STARTUP
            and move.rounds <= 1
            and self._state.held_failover is None  # a pause holds the round: it never ends
            and self._status.recorded is not None
            and self._status.recorded.active is not None
        )
