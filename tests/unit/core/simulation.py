"""Simulated brokers that follow the broker's Heartbeat rules, and a world that drives the core.

The decision core is pure, so it can be run against a model of the brokers with a
simulated clock: every ``SendHeartbeat`` is answered by a :class:`SimBroker` that
follows ARCHITECTURE.md "Broker rules" (stale epochs refused, epoch stored on
``active=true``, synchronous activation that may fail, self-fencing after the
lease). The world checks the safety properties at the only moments they can
break (when a broker acts on a request) and records what happened for the
convergence checks. Nothing here mocks our code: it stands in for broker
processes, which the integration tests run for real.

Faults modelled: crash (connection refused), restart (Inactive, epoch kept),
partition (the request is lost; the caller times out), slow replies (the broker
acts, the reply arrives after the timeout), activation failures (Unavailable),
epoch-allocation conflicts, and clock steps (everyone's time jumps). Spec
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

    def fence(self, now: float) -> None:
        """Self-fencing: an active broker with no renewal for a lease deactivates itself."""
        if self.active and now - self.renewed_at >= self.lease:
            self.active = False

    def handle(self, active: bool, epoch: int, now: float) -> HeartbeatReply:
        self.fence(now)
        if not active:
            self.active = False
            self.epoch = max(self.epoch, epoch)  # as the real broker: a probe raises the stored epoch
            return HeartbeatReply(BrokerState.INACTIVE, None, None, self.epoch)
        if epoch < self.epoch:
            code = UnavailabilityCode.STALE_EPOCH.value
            return HeartbeatReply(BrokerState.UNAVAILABLE, code, f"epoch {epoch} < {self.epoch}", self.epoch)
        self.epoch = epoch
        if not self.active and self.activation_fails:
            code = UnavailabilityCode.BACKEND_UNREACHABLE.value
            return HeartbeatReply(BrokerState.UNAVAILABLE, code, "backend down", self.epoch)
        self.active = True
        self.renewed_at = now
        return HeartbeatReply(BrokerState.ACTIVE, None, None, self.epoch)


@dataclass
class World:
    config: ClusterConfig
    brokers: dict[str, SimBroker]
    state: EngineState
    pod_mode: bool = False
    now: float = 1000.0
    stored_epoch: int = 0
    refuse_next_allocations: int = 0
    label: str | None = None
    events: list[RecordEvent] = field(default_factory=list)
    activations: list[tuple[float, str, int]] = field(default_factory=list)
    epoch_owner: dict[int, str] = field(default_factory=dict)
    active_true_calls: list[tuple[float, str]] = field(default_factory=list)
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
        return world

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
                    allowed = {state.active, move.candidate if move else None}
                    assert action.broker in allowed, (
                        f"active=true to {action.broker}: neither the active ({state.active}) nor candidate"
                    )
                    assert action.epoch <= self.stored_epoch, (
                        f"activation of {action.broker} with epoch {action.epoch} never granted"
                        f" (granted: {self.stored_epoch})"
                    )
                latency = max(latency, self._heartbeat(action))
            elif isinstance(action, AllocateEpoch):
                latency = max(latency, RTT)
                if self.refuse_next_allocations > 0:
                    self.refuse_next_allocations -= 1
                    self.stored_epoch += 1  # another writer bumped it
                    self.pending.append(EpochRefused(self.stored_epoch, "conflict (simulated)"))
                elif action.current != self.stored_epoch:
                    self.pending.append(EpochRefused(self.stored_epoch, "stale current"))
                else:
                    self.stored_epoch += 1
                    self.pending.append(EpochGranted(self.stored_epoch))
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
            self.pending.append(HeartbeatFailed(action.broker, action.active, action.epoch, False, "refused"))
            return RTT
        if broker.partitioned:
            self.pending.append(HeartbeatFailed(action.broker, action.active, action.epoch, True, "timeout"))
            return timeout
        was_active = broker.active
        reply = broker.handle(action.active, action.epoch, self.now)
        if broker.active and not was_active:
            self._check_activation(broker)
        if broker.slow:
            self.pending.append(HeartbeatFailed(action.broker, action.active, action.epoch, True, "timeout"))
            return timeout
        self.pending.append(HeartbeatAnswered(action.broker, action.active, action.epoch, reply))
        return RTT

    def _check_activation(self, broker: SimBroker) -> None:
        self.actives()  # self-fence whoever's lease ran out
        others = [b.name for b in self.processes() if b is not broker and b.active and b.alive]
        assert not others, f"{broker.name} activated at t={self.now:.3f} while {others} still active"
        owner = self.epoch_owner.setdefault(broker.epoch, broker.name)
        assert owner == broker.name, f"epoch {broker.epoch} given to both {owner} and {broker.name}"
        self.activations.append((self.now, broker.name, broker.epoch))
