"""What the engine knows about one cluster's brokers, and how observations change it.

The central fact kept per broker is ``possibly_active_until``: the monotonic time
after which the broker is certainly not active. ``None`` means it is known not
active now (it answered ``active=false``, or Kubernetes confirmed its container
dead). Every ``active=true`` call that may have reached the broker pushes the
bound to (outcome time + lease + margin), because the broker renews its lease on
receipt, and receipt happens no later than the outcome we observe. This is
stricter than "lease since the last *acknowledged* heartbeat": an unanswered
call (a timeout) may still have renewed the lease, so counting from the last
answer could activate a second broker while the first is still active.

A restarted operator knows nothing, so every broker starts possibly active for
one fence period unless it answers ``active=false`` sooner.

Pure code: no I/O, no asyncio, no clock reads (time is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker_contracts.soap import BrokerState, UnavailabilityCode
from broker_operator.core.frozen import replace
from broker_operator.core.model import BrokerTarget, HeartbeatSettings, PodFacts

UNKNOWN_STATE = "Unknown"


class MoveKind(StrEnum):
    STARTUP = "Startup"  # the engine (re)started and must settle who is active
    FAILOVER = "Failover"  # the active failed
    SWITCHOVER = "Switchover"  # spec.preferredActive asked for a planned move
    FAILBACK = "Failback"  # Automatic failback to a higher-priority broker

    @property
    def planned(self) -> bool:
        return self in (MoveKind.SWITCHOVER, MoveKind.FAILBACK)


@dataclass(frozen=True)
class ClusterConfig:
    """The spec side of one cluster: who to heartbeat, how, and who is preferred."""

    cluster: str
    targets: tuple[BrokerTarget, ...]
    settings: HeartbeatSettings
    preferred_active: str | None = None
    # Where in each period this cluster's periodic heartbeats fall, as a fraction of it (see
    # ``next_on_phase``); None: one period after the event that scheduled them.
    phase: float | None = None
    # Reconciliation paused (the annotation, ``core/pause.py``): no term begins or ends meanwhile.
    paused: bool = False

    @classmethod
    def of(
        cls,
        cluster: str,
        targets: Sequence[BrokerTarget],
        settings: HeartbeatSettings,
        preferred_active: str | None = None,
        phase: float | None = None,
        *,
        paused: bool = False,
    ) -> ClusterConfig:
        names = [t.name for t in targets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"BrokerCluster {cluster}: broker names {duplicates} appear more than once")
        if phase is not None and not 0.0 <= phase < 1.0:
            raise ValueError(f"BrokerCluster {cluster}: phase {phase} is not in [0, 1)")
        ordered = tuple(sorted(targets, key=lambda t: (t.priority, t.name)))
        return cls(cluster, ordered, settings, preferred_active or None, phase, paused)

    def target(self, name: str) -> BrokerTarget | None:
        return next((t for t in self.targets if t.name == name), None)

    def next_on_phase(self, now: float, period: float, broker: str | None = None) -> float:
        """When a periodic heartbeat scheduled at ``now`` is due: ``now + period`` without a phase,
        else the first instant after ``now`` that lies at the phase within ``period`` (shifted
        per broker, so that a cluster's standbys are not probed together).

        Why: the engines of many clusters schedule these at the same instants (an operator
        restart confirms every active at once, and each activation probes every standby
        at once), and a fixed period keeps them together; bench/bench_operator.py saw the
        event loop stall every second at 2,000 clusters. The phase only ever brings a
        heartbeat sooner, never later, so leases and fences are as safe as before.
        """
        if self.phase is None or period <= 0:
            return now + period
        phase = self.phase
        if broker is not None:
            index = next((i for i, t in enumerate(self.targets) if t.name == broker), 0)
            phase = (phase + index / max(1, len(self.targets))) % 1.0
        offset = (phase * period - now) % period
        # Right on the phase (or a rounding error away from it): the next place, a period on.
        return now + (offset if offset > 1e-6 else period)


@dataclass(frozen=True)
class BrokerKnowledge:
    name: str
    url: str
    priority: int
    in_spec: bool = True  # False: removed from the spec, kept only until known not active
    state: str = UNKNOWN_STATE  # Active | Inactive | Unavailable | Unknown, as last seen
    code: str | None = None
    message: str | None = None
    possibly_active_until: float | None = None  # None = known not active
    failures: int = 0  # consecutive failed renewals while it is the active
    ready_since: float | None = None  # answering Inactive to probes without a break since
    # When it last failed an activation (refused or no answer): Automatic failback to it
    # waits FAILBACK_HOLDOFF after that, or a standby that answers probes but cannot
    # activate would have the active drained and restored over and over.
    activation_failed_at: float | None = None
    # What its last failed activation came back with: the broker's own code and message
    # (BACKEND_UNREACHABLE, STALE_EPOCH, ...) or the heartbeat's failure. Status shows it
    # until a broker is active again: the fence that follows a refused activation answers
    # Inactive, and a person must still see why the cluster is Unavailable.
    activation_code: str | None = None
    activation_message: str | None = None
    reported_epoch: int = -1  # highest epoch it ever reported (-1: never heard)
    dead: bool = False  # Kubernetes says its container terminated or its pod is gone
    draining: bool = False  # its pod's node is being drained (PodFacts.node_draining)
    # When the operator proved the process at ``url`` gone (its watch ended, its port refused):
    # an active fails over at once. Cleared by any answer, which only a live process gives.
    gone_at: float | None = None
    # An active=true call that may have arrived got no answer: a paused broker can
    # still act on it when it resumes, so it is fenced every interval until it
    # answers active=false, even after its lease bound has passed.
    unanswered_activation: bool = False
    last_reply_at: float | None = None
    # The latest outcome that a live process may have given or received: an answer, a timeout, an
    # unusable reply; not a refusal, nor a reset or close before any reply. A proof of death from
    # before it is void (observe._process_gone).
    last_contact_at: float | None = None
    # Why TLS with it failed at the last try (a heartbeat's redacted reason), until it answers
    # again: for a condition or an event; such a failure is not counted against it (observe).
    tls_problem: str | None = None
    next_probe_at: float = 0.0  # standby probe with active=false
    next_fence_at: float = 0.0  # active=false to a broker that may still be active

    # The spec moved this broker to a new address while a process at the old one
    # may still be active: until then it counts as possibly active whatever the
    # new address answers, because active=false can no longer reach the old one.
    earlier_address_active_until: float | None = None

    def possibly_active(self, now: float) -> bool:
        if self.dead:
            return False
        until, earlier = self.possibly_active_until, self.earlier_address_active_until
        return (until is not None and until > now) or (earlier is not None and earlier > now)

    def earlier_address_possibly_active(self, now: float) -> bool:
        bound = self.earlier_address_active_until
        return not self.dead and bound is not None and bound > now

    def needs_fencing(self, now: float) -> bool:
        return not self.dead and (self.possibly_active(now) or self.unanswered_activation)

    @property
    def ready(self) -> bool:
        """Last seen as a healthy standby: a candidate worth activating first."""
        return not self.dead and self.state == BrokerState.INACTIVE.value


@dataclass(frozen=True)
class Move:
    """A change of active under way: a walk over candidates in ``order``."""

    kind: MoveKind
    from_: str | None
    reason: str
    started_at: float
    order: tuple[str, ...]  # preference order; re-derived when the spec's brokers change
    tried: frozenset[str] = frozenset()
    candidate: str | None = None  # sent active=true this step; awaiting its answer
    rounds: int = 1  # > 1: every candidate failed at least once (phase Unavailable)
    retry_at: float = 0.0  # after an exhausted round, when to walk again
    # Rounds so far in which every activation tried failed (the retry backoff's exponent),
    # and whether the round under way has sent any activation yet. A round that found
    # nobody to try (every pod dead, no addresses yet) costs no API write and does not count.
    failed_rounds: int = 0
    attempted: bool = False
    # The designated first choice (switchover/failback target, the active before
    # an engine restart), tried before ready standbys; None for a failover.
    first: str | None = None


@dataclass(frozen=True)
class LastMove:
    completed_wall: float
    from_: str | None
    to: str | None
    reason: str
    duration_ms: int


@dataclass(frozen=True)
class EngineState:
    brokers: tuple[BrokerKnowledge, ...]
    epoch: int  # the highest epoch granted to this cluster
    epoch_holder: str | None  # the broker ``epoch`` was sent to with active=true, if any
    active: str | None = None  # acknowledged active that we keep renewing
    active_epoch: int = 0  # the epoch the active was activated with
    next_active_heartbeat_at: float = 0.0
    move: Move | None = None
    # Where the ``-active`` Service points (a broker, or nobody), as this engine last wrote it;
    # unknown until its first write, which a restarted engine makes once it has an active.
    pointed: str | None = None
    pointed_known: bool = False
    point_retry_at: float = 0.0
    epoch_retry_at: float = 0.0
    honoured_preferred: str | None = None  # preferredActive already acted upon
    last_move: LastMove | None = None
    failovers: int = 0
    wall_offset: float = 0.0  # wall-clock seconds minus the engine clock, fixed at start
    events_due: tuple[tuple[str, str, bool], ...] = field(default=())
    # The holder's term at ``epoch`` is over (a failover away from it, or it refused the
    # epoch as the one it fenced itself at): the next activation, of the holder too,
    # needs a new epoch, as the design's "epoch+1" for every failover says.
    epoch_ended: bool = False
    # The active's node is being drained and no standby could take over: said once per drain.
    drain_blocked_reported: bool = False
    # Why the failover a pause holds back is needed (core/pause.py), None when none is held.
    held_failover: str | None = None

    def resumes_holder(self, name: str) -> bool:
        """Whether ``name`` is a restarted engine's start move's first candidate: the recorded
        active, with the newest epoch, which the status says it was activated with.

        The successor resumes a term rather than starting one, so it treats that broker as the
        running engine treats its active: renewed before the others are fenced (issue 40: a
        successor that first waited for every standby's ``active=false`` answer let the active's
        lease run out whenever one came late, or never, from a standby cut off during an
        upgrade), and passed over only after ``failureThreshold`` failures (one slow answer to a
        takeover's burst moved 11 actives of 500). No second broker can be active meanwhile: the
        newest epoch went to this broker alone (``decisions.epoch_usable``), every other broker
        was known inactive when it was activated with it, and none was activated since, which
        takes a newer epoch the stored ``status.epoch`` would show (``initial_state``).
        """
        move = self.move
        return (
            move is not None
            and move.kind is MoveKind.STARTUP
            and move.from_ == name
            and self.epoch_holder == name
            and not self.epoch_ended
        )

    def broker(self, name: str) -> BrokerKnowledge | None:
        for broker in self.brokers:  # a loop, not next() over a generator: called often per step
            if broker.name == name:
                return broker
        return None

    def with_broker(self, name: str, **changes: Any) -> EngineState:
        return replace(
            self, brokers=tuple(replace(b, **changes) if b.name == name else b for b in self.brokers)
        )

    def with_event(self, reason: str, message: str, warning: bool) -> EngineState:
        return replace(self, events_due=(*self.events_due, (reason, message, warning)))


def initial_state(
    config: ClusterConfig,
    *,
    now: float,
    wall_now: float,
    epoch: int = 0,
    last_active: str | None = None,
    failovers: int = 0,
    active_epoch: int | None = None,
    last_move: LastMove | None = None,
) -> EngineState:
    """The engine's knowledge right after (re)start: everyone possibly active for the start fence.

    The start fence (``HeartbeatSettings.start_fence_seconds``) is the longest lease a predecessor
    could have granted, a handover's, whether or not this engine read a status that says so. A
    cluster whose recorded ``epoch`` is 0 was never activated by anyone (an epoch is granted by a
    conditional write to this object before any activation), so no broker of it was handed over:
    its brokers get the lease's fence, as before.

    ``epoch`` may be sent again only to the broker that holds it: ``last_active``, if the status
    says it was activated with that very epoch (``active_epoch``). An earlier engine allocates an
    epoch before it activates anyone and records the new active after, so a stop in between
    leaves ``epoch`` ahead, maybe sent to another broker (a drain evicted the handling operator
    mid-switchover, and its successor sent the same epoch to the old active: one epoch, two
    brokers). Then, or with no active recorded, the epoch is ended and the next activation
    allocates above it.

    ``last_move`` is the last change of active the status records: kept until this engine makes
    one, so that its status does not erase it (a replica taking over right after a drain's
    switchover wrote ``lastFailover: null`` over the switchover it had not seen happen).
    """
    settings = config.settings
    fence_until = now + (settings.start_fence_seconds if epoch > 0 else settings.fence_seconds)
    brokers = tuple(
        BrokerKnowledge(name=t.name, url=t.url, priority=t.priority, possibly_active_until=fence_until)
        for t in config.targets
    )
    if config.target(last_active or "") is None:
        # Out of the spec (scaled down, pods without IPs yet): it is not renewed, and the epoch it
        # holds ends with it. Asked before `holds_epoch`, or its epoch went to the next broker
        # activated (a property test found b1 activated with the epoch b0 held).
        last_active = None
    holds_epoch = last_active is not None and active_epoch == epoch
    startup = Move(MoveKind.STARTUP, from_=last_active, reason="OperatorStarted", started_at=now, order=())
    return EngineState(
        brokers=brokers,
        epoch=epoch,
        epoch_holder=last_active if holds_epoch else None,
        epoch_ended=epoch > 0 and not holds_epoch,
        # A preferredActive already set before the restart was honoured by the
        # previous engine; do not switch over again just because we restarted.
        honoured_preferred=config.preferred_active,
        move=reorder_move(startup, config),
        failovers=failovers,
        last_move=last_move,
        wall_offset=wall_now - now,
    )


def later_bound(bound: float | None, until: float) -> float:
    """A broker's ``possibly_active_until`` after an ``active=true`` that may have renewed it to
    ``until``: the broker keeps the later of its lease deadlines (a handover's may be the later)."""
    return until if bound is None else max(bound, until)


def preference_order(
    config: ClusterConfig, first: str | None, *, hoist_preferred: bool = True
) -> tuple[str, ...]:
    """Brokers in the order a move tries them: ``first``, then ``preferredActive``, then by priority."""
    names = [t.name for t in config.targets]
    preferred = config.preferred_active
    if hoist_preferred and preferred in names and preferred != first:
        names.remove(preferred)
        names.insert(0, preferred)
    if first in names:
        names.remove(first)
        names.insert(0, first)
    return tuple(names)


def reorder_move(move: Move, config: ClusterConfig) -> Move:
    """The move's candidate order for the spec's current brokers.

    Derived from the spec rather than fixed when the move started: an engine
    started with no brokers (pods without IPs yet) must walk the brokers that
    arrive later, and a removed broker must not stay a candidate.
    """
    names = {t.name for t in config.targets}
    if move.kind is MoveKind.STARTUP:
        # After a restart the recorded active goes first (renew, do not re-elect);
        # otherwise the highest-priority broker, preferredActive having been
        # honoured by whoever set it before this engine started.
        first = move.from_ if move.from_ in names else (config.targets[0].name if config.targets else None)
        return replace(move, first=first, order=preference_order(config, first, hoist_preferred=False))
    first = move.first if move.first in names else None
    return replace(move, first=first, order=preference_order(config, first))


def reconcile_targets(state: EngineState, config: ClusterConfig, now: float) -> EngineState:
    """Follow a spec change: add new brokers, re-rank, re-address, keep removed ones until fenced.

    Safety, per ARCHITECTURE.md rule 2: a broker that may be active is never
    forgotten. A removed broker that may be active (the active among them), or
    whose activation is in flight, stays known (``in_spec=False``) and is fenced
    with ``active=false`` until it is known not active; the failover away from a
    removed or re-addressed active goes through the gate like any other. A new
    broker, or a known one at a new address, may be active through someone
    else's doing, so it is fenced for one period unless it answers sooner.
    """
    followed = [(b.name, b.url, b.priority) for b in state.brokers if b.in_spec]
    wanted = [(t.name, t.url, t.priority) for t in config.targets]
    if len(followed) == len(state.brokers) and followed == wanted:
        return state  # the common case, every step: nothing to follow
    fence_until = now + config.settings.fence_seconds
    in_flight = state.move.candidate if state.move is not None else None
    known = {b.name: b for b in state.brokers}
    brokers: list[BrokerKnowledge] = []
    for target in config.targets:
        current = known.pop(target.name, None)
        if current is None:
            # A broker we never talked to may be active (someone else's doing):
            # treat it like every broker at start-up until it answers.
            current = BrokerKnowledge(
                target.name, target.url, target.priority, possibly_active_until=fence_until
            )
        elif current.url != target.url:
            # The active's renewal or the candidate's activation may be in flight to the old
            # address; its outcome is folded in only after this, into the new address's knowledge.
            in_flight_to_old = current.name in (state.active, in_flight)
            current = _readdressed(current, target.url, fence_until, now, in_flight=in_flight_to_old)
        brokers.append(replace(current, priority=target.priority, in_spec=True))
    for leftover in known.values():
        if leftover.needs_fencing(now) or leftover.name in (state.active, in_flight):
            brokers.append(replace(leftover, in_spec=False))
    brokers.sort(key=lambda b: (not b.in_spec, b.priority, b.name))
    state = replace(state, brokers=tuple(brokers))
    move = state.move
    if move is None:
        return state
    if move.kind.planned and state.active is not None and config.target(move.first or "") is None:
        # The switchover or failback target left the spec before the active was
        # drained: nothing to move to, the active stays.
        return replace(state, move=None)
    return replace(state, move=reorder_move(move, config))


def _readdressed(
    broker: BrokerKnowledge, url: str, fence_until: float, now: float, *, in_flight: bool
) -> BrokerKnowledge:
    """The spec gave a known broker a new address: a process we cannot tell from a new broker.

    Whatever may be active at the old address stays possibly active until its
    bound (an ``active=true`` in flight or unanswered there gets a fresh fence
    period), and the new address is fenced like a new broker's.
    """
    bounds = [b for b in (broker.possibly_active_until, broker.earlier_address_active_until) if b is not None]
    if broker.unanswered_activation or in_flight:
        bounds.append(fence_until)
    earlier = (
        max(bounds) if broker.possibly_active(now) or broker.unanswered_activation or in_flight else None
    )
    return replace(
        broker,
        url=url,
        state=UNKNOWN_STATE,
        code=None,
        message=None,
        activation_code=None,
        activation_message=None,
        possibly_active_until=fence_until,
        earlier_address_active_until=earlier,
        failures=0,
        ready_since=None,
        unanswered_activation=False,
        next_probe_at=0.0,
        next_fence_at=0.0,
    )


def apply_pod_facts(state: EngineState, facts: Mapping[str, PodFacts]) -> EngineState:
    """Dead containers are known not active; a container that came back starts Inactive."""
    for broker in state.brokers:
        fact = facts.get(broker.name)
        if fact is None:
            continue
        if fact.node_draining != broker.draining:
            state = state.with_broker(broker.name, draining=fact.node_draining)
        if fact.dead and not broker.dead:
            code = "CONTAINER_TERMINATED" if fact.exists else "POD_NOT_FOUND"
            message = (
                "Kubernetes reports the broker's container terminated"
                if fact.exists
                else "the broker's pod does not exist"
            )
            state = state.with_broker(
                broker.name,
                dead=True,
                possibly_active_until=None,
                earlier_address_active_until=None,
                unanswered_activation=False,
                state=BrokerState.UNAVAILABLE.value,
                code=code,
                message=message,
                ready_since=None,
            )
        elif not fact.dead and broker.dead:
            # A new container starts Inactive; probe it now to learn whether it is ready.
            # What the old process answered to an activation says nothing about the new one.
            state = state.with_broker(
                broker.name,
                dead=False,
                gone_at=None,
                state=UNKNOWN_STATE,
                code=None,
                message=None,
                activation_code=None,
                activation_message=None,
                next_probe_at=0.0,
            )
    return state


TLS_ERROR = "TLS_ERROR"


def failure_code(reason: str, reached: bool, *, tls_error: bool = False) -> str:
    """The 30-character code shown for a heartbeat that got no answer."""
    if tls_error:
        return TLS_ERROR
    if not reached:
        return "UNREACHABLE"
    return "HEARTBEAT_TIMEOUT" if "timeout" in reason.lower() else "HEARTBEAT_FAILED"


STALE = UnavailabilityCode.STALE_EPOCH.value
LEASE_EXPIRED = UnavailabilityCode.LEASE_EXPIRED.value
