"""Simulated brokers that follow the broker's Heartbeat rules, and a world that drives the core.

The decision core is pure, so it can be run against a model of the brokers with a
simulated clock: every ``SendHeartbeat`` is answered by a :class:`SimBroker` that
follows ARCHITECTURE.md "Broker rules" (stale epochs refused, epoch stored on
``active=true``, synchronous activation that may fail, self-fencing after the
lease) and the rules docs/broker.md adds: a ``renewLease=false`` check changes
nothing; a broker whose process was stalled longer than the lease margin fences
itself before it handles anything; and a self-fenced term is never revived by
an ``active=true`` at the epoch it fenced at (``LEASE_EXPIRED``). The world
checks the safety properties at the only moments they can break (when a
broker acts on a request) and records what happened for the convergence
checks. Nothing here mocks our code: it stands in for broker processes, which
the integration tests run for real.

The cluster's stored epoch (``status.epoch`` on Kubernetes) is modelled with
every write that reaches it: the engine's compare-and-swap allocations, another
operator's allocations (``other_operator_allocates``), and the status patches the
shell writes whenever the engine's status changes, applied as the merge patch the
Kubernetes shell sends (``ClusterStatus.to_status_patch``). So a status patch that
carried the epoch would write it here too, and the world's record of every value
the stored epoch took and every grant lets the property tests check that it never
goes down and that no epoch is granted twice.

Faults modelled: crash (connection refused), restart (Inactive, epoch kept),
partition (the request is lost; the caller times out), slow replies (the broker
acts, the reply arrives after the timeout), pauses (SIGSTOP: requests queue
unanswered and are handled when the process resumes, possibly long after the
caller gave up), activation failures (Unavailable), epoch-allocation conflicts,
and clock steps (everyone's time jumps). An activation tells the targets its
epoch, and one below what they have seen fails, as with the real broker: that is
what stops a paused candidate from acting on an activation it finds queued when
it resumes, after another broker was activated with a newer epoch. Spec
changes: brokers added, removed (the process keeps running and may stay active
until fenced or self-fenced) and re-addressed (a new process at the new
address; in endpoints mode the old one keeps running unreachable, in pods mode
it is gone, as a pod name is reused only after the old pod is deleted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker_contracts.soap import BrokerState, UnavailabilityCode
from broker_operator.core import (
    AllocateEpoch,
    BrokerTarget,
    ClusterConfig,
    ClusterStatus,
    EngineState,
    EpochGranted,
    EpochRefused,
    HeartbeatAnswered,
    HeartbeatFailed,
    HeartbeatReply,
    HeartbeatSettings,
    LabelMoved,
    MoveActiveLabel,
    Observation,
    PodFacts,
    RecordEvent,
    SendHeartbeat,
    initial_state,
    status_of,
    step,
)

RTT = 0.002  # a loopback round trip, in simulated seconds
NAMES_POOL = ["b0", "b1", "b2", "b3", "b4", "b5"]  # priority = index


def pool_url(name: str) -> str:
    """The first address of a pooled broker; re-addressing gives it others."""
    return f"http://127.0.0.1:{9000 + NAMES_POOL.index(name)}/soap"


@dataclass
class SimBroker:
    name: str
    lease: float
    alive: bool = True
    partitioned: bool = False
    slow: bool = False
    activation_fails: bool = False
    active: bool = False
    epoch: int = 0
    renewed_at: float = 0.0
    fenced_epoch: int = -1  # the epoch of the last self-fenced term: never revived
    paused_at: float | None = None  # SIGSTOPped since then; requests queue in `queued`
    queued: list[SendHeartbeat] = field(default_factory=list)

    def fence(self, now: float) -> None:
        """Self-fencing: an active broker with no renewal for a lease deactivates itself."""
        if self.active and now - self.renewed_at >= self.lease:
            self.self_fence()

    def self_fence(self) -> None:
        if self.active:
            self.active = False
            self.fenced_epoch = self.epoch

    def stalled(self, seconds: float, stall_limit: float) -> bool:
        """The process did not run for ``seconds``: past the stall limit it fences itself first."""
        if seconds > stall_limit:
            self.self_fence()
            return True
        return False

    def handle(
        self, active: bool, epoch: int, now: float, renew: bool = True, target_epoch: int = 0
    ) -> HeartbeatReply:
        """``target_epoch``: the highest epoch the backend and cloud have seen; an activation
        below it fails, as the real broker's resend request and cloud probe do (STALE_EPOCH)."""
        self.fence(now)
        if not active:
            self.active = False
            self.epoch = max(self.epoch, epoch)  # as the real broker: a probe raises the stored epoch
            return HeartbeatReply(BrokerState.INACTIVE, None, None, self.epoch)
        if not renew:
            state = BrokerState.ACTIVE if self.active else BrokerState.INACTIVE
            return HeartbeatReply(state, None, None, self.epoch)
        refusal = self._refusal(epoch, target_epoch)
        if refusal is not None:
            return HeartbeatReply(BrokerState.UNAVAILABLE, refusal, refusal, self.epoch)
        self.active = True
        self.renewed_at = now
        return HeartbeatReply(BrokerState.ACTIVE, None, None, self.epoch)

    def _refusal(self, epoch: int, target_epoch: int) -> str | None:
        """Why an ``active=true`` at ``epoch`` is refused (the epoch is stored first unless stale)."""
        if epoch < self.epoch:
            return UnavailabilityCode.STALE_EPOCH.value
        if epoch <= self.fenced_epoch:
            return UnavailabilityCode.LEASE_EXPIRED.value
        self.epoch = epoch
        if not self.active and epoch < target_epoch:
            return UnavailabilityCode.STALE_EPOCH.value
        if not self.active and self.activation_fails:
            return UnavailabilityCode.BACKEND_UNREACHABLE.value
        return None


@dataclass
class World:
    config: ClusterConfig
    brokers: dict[str, SimBroker]
    state: EngineState
    pod_mode: bool = False
    now: float = 1000.0
    stored_epoch: int = 0  # status.epoch of the BrokerCluster object
    refuse_next_allocations: int = 0
    # Every value status.epoch took, in order, and every epoch granted, with to whom
    # ("engine", or "other" for a second operator); the engine may activate with the
    # epochs granted to it and those it inherited from its previous life (at start).
    stored_epochs: list[int] = field(default_factory=list)
    grants: list[tuple[int, str]] = field(default_factory=list)
    engine_epochs: set[int] = field(default_factory=set)
    recorded_status: ClusterStatus | None = None
    status_writes: int = 0
    label: str | None = None
    events: list[RecordEvent] = field(default_factory=list)
    activations: list[tuple[float, str, int]] = field(default_factory=list)
    epoch_owner: dict[int, str] = field(default_factory=dict)
    active_true_calls: list[tuple[float, str]] = field(default_factory=list)
    renewals: list[tuple[float, str]] = field(default_factory=list)  # active=true that may renew a lease
    target_epoch: int = 0  # the highest epoch the (simulated) backend and cloud were told of
    pending: list[Observation] = field(default_factory=list)
    # Processes at addresses the spec no longer names: unreachable, still counted.
    retired: list[SimBroker] = field(default_factory=list)
    addresses: int = 0
    # Requests go to whatever process listens at the URL the engine used: an engine
    # that has not seen a re-addressing yet still reaches the old process.
    by_url: dict[str, SimBroker] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        names: list[str],
        settings: HeartbeatSettings,
        *,
        pod_mode: bool = False,
        preferred: str | None = None,
        stored_epoch: int = 0,
        last_active: str | None = None,
        processes: tuple[str, ...] = (),
    ) -> World:
        targets = [
            BrokerTarget(
                name, f"http://127.0.0.1:{9000 + NAMES_POOL.index(name)}/soap", NAMES_POOL.index(name)
            )
            for name in names
        ]
        config = ClusterConfig.of("sim", targets, settings, preferred)
        now = 1000.0
        state = initial_state(config, now=now, wall_now=1.7e9, epoch=stored_epoch, last_active=last_active)
        # Processes may run before the spec names them (pods without IPs yet).
        brokers = {name: SimBroker(name, settings.lease_seconds) for name in [*names, *processes]}
        world = cls(config, brokers, state, pod_mode=pod_mode, now=now, stored_epoch=stored_epoch)
        world.by_url = {pool_url(name): broker for name, broker in brokers.items()}
        world.stored_epochs = [stored_epoch]
        world.engine_epochs = set(range(1, stored_epoch + 1))  # granted to its previous life
        return world

    # -- the BrokerCluster object's status.epoch -----------------------------

    def _store_epoch(self, epoch: int) -> None:
        self.stored_epoch = epoch
        self.stored_epochs.append(epoch)

    def _grant(self, epoch: int, to: str) -> None:
        self._store_epoch(epoch)
        self.grants.append((epoch, to))
        if to == "engine":
            self.engine_epochs.add(epoch)

    def other_operator_allocates(self) -> None:
        """A second operator (a stalled replica, an upgrade) wins a compare-and-swap of its own."""
        self._grant(self.stored_epoch + 1, "other")

    def _record_status(self) -> None:
        """What the shell does after each step: merge-patch the status, if it changed."""
        status = status_of(self.state, self.config)
        if status == self.recorded_status:
            return
        self.recorded_status = status
        self.status_writes += 1
        patch = status.to_status_patch()
        if "epoch" in patch:  # a merge patch writes whatever it carries, with no precondition
            self._store_epoch(int(patch["epoch"]))

    # -- the world's own view -------------------------------------------------

    def processes(self) -> list[SimBroker]:
        return [*self.brokers.values(), *self.retired]

    def actives(self) -> list[str]:
        for broker in self.processes():
            broker.fence(self.now)
        return [b.name for b in self.processes() if b.active and b.alive]

    def set_targets(self, names: list[str], readdress: frozenset[str] = frozenset()) -> None:
        """A spec change: these brokers (created if new), some of them at a new address."""
        config = self.config
        old = {t.name: t for t in config.targets}
        targets = []
        for name in names:
            if name not in self.brokers:
                self.brokers[name] = self.by_url[pool_url(name)] = SimBroker(
                    name, config.settings.lease_seconds
                )
            current = self.brokers[name]
            url = next(u for u, b in self.by_url.items() if b is current)
            if name in old and name in readdress:
                previous = self.brokers[name]
                if self.pod_mode:
                    previous.alive = previous.active = False  # the old pod is gone
                self.retired.append(previous)
                self.addresses += 1
                url = f"http://127.0.1.{self.addresses}:{9000 + NAMES_POOL.index(name)}/soap"
                fresh = SimBroker(name, config.settings.lease_seconds, epoch=previous.epoch)
                self.brokers[name] = self.by_url[url] = fresh
            targets.append(BrokerTarget(name, url, NAMES_POOL.index(name)))
        self.config = ClusterConfig.of(config.cluster, targets, config.settings, config.preferred_active)

    def pod_facts(self) -> dict[str, PodFacts]:
        if not self.pod_mode:
            return {}
        return {
            t.name: PodFacts(exists=True, container_terminated=not self.brokers[t.name].alive)
            for t in self.config.targets
        }

    # -- faults ----------------------------------------------------------------

    def crash(self, name: str) -> None:
        broker = self.brokers[name]
        broker.alive = False
        broker.active = False  # kill -9: the process and its activity are gone; the epoch is on disk

    def restart(self, name: str) -> None:
        broker = self.brokers[name]
        broker.alive = True
        broker.active = False  # a broker always starts Inactive with its stored epoch
        broker.fenced_epoch = -1  # in memory only; a restarted broker is Inactive anyway
        broker.paused_at, broker.queued = None, []

    def pause(self, name: str) -> None:
        broker = self.brokers[name]
        if broker.paused_at is None:
            broker.paused_at = self.now

    def resume(self, name: str) -> None:
        """SIGCONT: the stall check runs first, then the queued requests are handled (answers are lost).

        After a stall longer than the limit the broker refuses every ``active=true`` that waited
        it out (``EVENT_LOOP_STALLED``), an activation included; shorter pauses are handled as if
        the requests had just arrived.
        """
        broker = self.brokers[name]
        if broker.paused_at is None:
            return
        stalled = broker.stalled(self.now - broker.paused_at, self.config.settings.lease_margin_seconds)
        broker.paused_at, queued, broker.queued = None, broker.queued, []
        for action in queued:
            if broker.alive and not (stalled and action.active):
                self._act(broker, action)

    def clock_step(self, seconds: float) -> None:
        """Everyone's time jumps (a paused VM): every process notices its stall when it runs again."""
        self.now += seconds
        for broker in self.processes():
            broker.stalled(seconds, self.config.settings.lease_margin_seconds)

    # -- driving the engine ----------------------------------------------------

    def run(self, seconds: float) -> None:
        """Run the engine for ``seconds`` of simulated time, answering its actions."""
        until = self.now + seconds
        # Bounded: a few steps per interval per broker is plenty; more means a livelock.
        max_steps = 100 + int(seconds / self.config.settings.interval_seconds) * 8 * len(self.brokers)
        recent: list[str] = []
        for _ in range(max_steps):
            if self.now >= until:  # outcomes still pending are folded in by the next run
                return
            decision = step(self.state, self.config, self.pod_facts(), self.now, self.pending)
            self.state = decision.state
            recent = [*recent[-4:], f"t={self.now:.3f} {decision.actions} move={self.state.move}"]
            self.pending = []
            latency = self._carry_out(decision)
            self._record_status()
            if self.pending:
                self.now += latency
            else:
                self.now = max(self.now, min(decision.wake_at, until))
        raise AssertionError(
            f"engine did not settle within {max_steps} steps (livelock?):" + "\n".join(recent)
        )

    def _carry_out(self, decision: object) -> float:
        latency = 0.0
        state = self.state
        move = state.move
        for action in decision.actions:  # type: ignore[attr-defined]
            if isinstance(action, SendHeartbeat):
                if action.active:
                    self.active_true_calls.append((self.now, action.broker))
                    if action.renew:
                        self.renewals.append((self.now, action.broker))
                    allowed = {state.active, move.candidate if move else None}
                    assert action.broker in allowed, (
                        f"active=true to {action.broker}: neither the active ({state.active}) nor candidate"
                    )
                    assert action.epoch in self.engine_epochs, (
                        f"active=true to {action.broker} with epoch {action.epoch}, never granted to"
                        f" this engine (grants: {self.grants}, inherited up to {self.stored_epochs[0]})"
                    )
                latency = max(latency, self._heartbeat(action))
            elif isinstance(action, AllocateEpoch):
                latency = max(latency, RTT)
                if self.refuse_next_allocations > 0:
                    # Another writer got there between our read and our write: a 409.
                    self.refuse_next_allocations -= 1
                    self.other_operator_allocates()
                    self.pending.append(EpochRefused(None, "conflict (simulated)"))
                elif self.stored_epoch > action.current:
                    # As controller/epochs.py: someone else allocated since we last knew.
                    self.pending.append(EpochRefused(self.stored_epoch, "stored epoch above current"))
                else:
                    self._grant(action.epoch, "engine")
                    self.pending.append(EpochGranted(action.epoch))
            elif isinstance(action, MoveActiveLabel):
                self.label = action.active
                self.pending.append(LabelMoved(action.active))
            elif isinstance(action, RecordEvent):
                self.events.append(action)
        return latency

    def _heartbeat(self, action: SendHeartbeat) -> float:
        broker = self.by_url[action.url]
        timeout = self.config.settings.timeout_seconds
        if not broker.alive:
            self.pending.append(
                HeartbeatFailed(action.broker, action.active, action.epoch, False, "refused", action.renew)
            )
            return RTT
        timed_out = HeartbeatFailed(action.broker, action.active, action.epoch, True, "timeout", action.renew)
        if broker.partitioned:
            self.pending.append(timed_out)
            return timeout
        if broker.paused_at is not None:
            broker.queued.append(action)
            self.pending.append(timed_out)
            return timeout
        reply = self._act(broker, action)
        if broker.slow:
            self.pending.append(timed_out)
            return timeout
        answered = HeartbeatAnswered(action.broker, action.active, action.epoch, reply, action.renew)
        self.pending.append(answered)
        return RTT

    def _act(self, broker: SimBroker, action: SendHeartbeat) -> HeartbeatReply:
        was_active = broker.active
        reply = broker.handle(action.active, action.epoch, self.now, action.renew, self.target_epoch)
        if broker.active and not was_active:
            self.target_epoch = max(self.target_epoch, broker.epoch)
            self._check_activation(broker)
        return reply

    def _check_activation(self, broker: SimBroker) -> None:
        self.actives()  # self-fence whoever's lease ran out
        others = [b.name for b in self.processes() if b is not broker and b.active and b.alive]
        assert not others, f"{broker.name} activated at t={self.now:.3f} while {others} still active"
        owner = self.epoch_owner.setdefault(broker.epoch, broker.name)
        assert owner == broker.name, f"epoch {broker.epoch} given to both {owner} and {broker.name}"
        self.activations.append((self.now, broker.name, broker.epoch))
