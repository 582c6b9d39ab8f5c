"""Simulated brokers that run the broker's own term rules, and a world that drives the core.

The decision core is pure, so it can be run against simulated broker processes with a
simulated clock: every ``SendHeartbeat`` is answered by a :class:`SimBroker`, which runs
the broker's term state machine (:class:`broker_service.term.TermMachine`, the object the
real ``Broker`` runs) in the order the broker drives it. So ARCHITECTURE.md "Broker
rules" and the rules docs/broker.md adds (checks, stalls, the fenced-term restriction)
are the broker's code here, not a model of it; only the I/O is simulated (storing the
epoch, the targets' answer to an activation) and the process's clock: a running
process's lease watcher ticks on time, a paused one's does not. A process "acts as the
active" at an instant when the broker would admit a bundle then (Active, in lease, its
loop not stalled); the world checks the safety properties at the only moments they can
break (when a broker acts on a request, and after every step) and records what happened
for the convergence checks. Nothing here mocks our code: it stands in for broker
processes, which the integration tests run for real.

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
acts, the reply arrives after the timeout), journal failures (the broker fences
itself and answers ``JOURNAL_ERROR`` until restarted), pauses (SIGSTOP: requests queue
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

from dataclasses import dataclass, field, replace

from broker_operator.core import (
    ActivePointed,
    AllocateEpoch,
    BrokerTarget,
    ClusterConfig,
    ClusterStatus,
    ConnectionLost,
    EngineState,
    EpochGranted,
    EpochRefused,
    HeartbeatAnswered,
    HeartbeatFailed,
    HeartbeatReply,
    HeartbeatSettings,
    Observation,
    PodFacts,
    PointActive,
    ProcessGone,
    RecordEvent,
    SendHeartbeat,
    initial_state,
    status_of,
    step,
)
from broker_operator.core.handover import handover_renewal
from tests.unit.core.sim_broker import SimBroker

RTT = 0.002  # a loopback round trip, in simulated seconds
NAMES_POOL = ["b0", "b1", "b2", "b3", "b4", "b5"]  # priority = index


def pool_url(name: str) -> str:
    """The first address of a pooled broker; re-addressing gives it others."""
    return f"http://127.0.0.1:{9000 + NAMES_POOL.index(name)}/soap"


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
    written_statuses: list[ClusterStatus] = field(default_factory=list)  # each write, in order
    # The -active Service as the Kubernetes shell writes it: (broker or None, epoch), fenced.
    service: tuple[str | None, int] = (None, 0)
    service_writes: list[tuple[float, str | None, int]] = field(default_factory=list)
    terms: set[tuple[str, int]] = field(default_factory=set)  # (broker, epoch) it was ever active with
    # What the operator's watch connections report, each delivered at its time (may be late).
    signals: list[tuple[float, Observation]] = field(default_factory=list)
    events: list[RecordEvent] = field(default_factory=list)
    activations: list[tuple[float, str, int]] = field(default_factory=list)
    epoch_owner: dict[int, str] = field(default_factory=dict)
    active_true_calls: list[tuple[float, str]] = field(default_factory=list)
    renewals: list[tuple[float, str]] = field(default_factory=list)  # active=true that may renew a lease
    handovers: list[tuple[float, str]] = field(default_factory=list)  # handover renewals sent
    # Every answer the engine received: when, to which request, what the broker said.
    answers: list[tuple[float, SendHeartbeat, HeartbeatReply]] = field(default_factory=list)
    target_epoch: int = 0  # the highest epoch the (simulated) backend and cloud were told of
    pending: list[Observation] = field(default_factory=list)
    # Processes at addresses the spec no longer names: unreachable, still counted.
    retired: list[SimBroker] = field(default_factory=list)
    addresses: int = 0
    # Requests go to whatever process listens at the URL the engine used: an engine
    # that has not seen a re-addressing yet still reaches the old process.
    by_url: dict[str, SimBroker] = field(default_factory=dict)
    # Brokers whose pod's node is being drained (pod mode): PodFacts.node_draining.
    draining: set[str] = field(default_factory=set)
    # The operator's own event loop runs late (loop_lag.py): every reply misses its timeout, and
    # the engine knows the delay was its own (HeartbeatFailed.operator_late).
    operator_late: bool = False
    # Brokers whose TLS handshake with the operator fails (a certificate that does not verify, or
    # the operator's refused): every call fails before it is sent (HeartbeatFailed.tls_error).
    tls_broken: set[str] = field(default_factory=set)

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
        phase: float | None = None,
    ) -> World:
        targets = [
            BrokerTarget(
                name, f"http://127.0.0.1:{9000 + NAMES_POOL.index(name)}/soap", NAMES_POOL.index(name)
            )
            for name in names
        ]
        config = ClusterConfig.of("sim", targets, settings, preferred, phase)
        now = 1000.0
        state = initial_state(
            config,
            now=now,
            wall_now=1.7e9,
            epoch=stored_epoch,
            last_active=last_active,
            active_epoch=stored_epoch if last_active else None,  # left active with it (left_active)
        )
        # Processes may run before the spec names them (pods without IPs yet).
        handover = settings.granted_handover_seconds
        brokers = {name: SimBroker(name, settings.lease_seconds, handover) for name in [*names, *processes]}
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
        self.written_statuses.append(status)
        patch = status.to_status_patch()
        if "epoch" in patch:  # a merge patch writes whatever it carries, with no precondition
            self._store_epoch(int(patch["epoch"]))

    # -- the world's own view -------------------------------------------------

    def processes(self) -> list[SimBroker]:
        return [*self.brokers.values(), *self.retired]

    def _run_processes(self) -> None:
        """Every process that runs (alive, not paused) has run up to now."""
        for broker in self.processes():
            if broker.alive and broker.paused_at is None:
                broker.run_until(self.now)

    def actives(self) -> list[str]:
        """The processes that would act as the active if they ran now (a paused one included)."""
        self._run_processes()
        return [b.name for b in self.processes() if b.acts_as_active(self.now)]

    def set_targets(self, names: list[str], readdress: frozenset[str] = frozenset()) -> None:
        """A spec change: these brokers (created if new), some of them at a new address."""
        config = self.config
        old = {t.name: t for t in config.targets}
        targets = []
        for name in names:
            if name not in self.brokers:
                self.brokers[name] = self.by_url[pool_url(name)] = SimBroker(
                    name, config.settings.lease_seconds, config.settings.granted_handover_seconds
                )
            current = self.brokers[name]
            url = next(u for u, b in self.by_url.items() if b is current)
            if name in old and name in readdress:
                previous = self.brokers[name]
                if self.pod_mode:
                    previous.alive = False  # the old pod is gone
                    previous.new_process()
                self.retired.append(previous)
                self.addresses += 1
                url = f"http://127.0.1.{self.addresses}:{9000 + NAMES_POOL.index(name)}/soap"
                fresh = SimBroker(
                    name,
                    config.settings.lease_seconds,
                    config.settings.granted_handover_seconds,
                    epoch=previous.term.epoch,
                )
                self.brokers[name] = self.by_url[url] = fresh
            targets.append(BrokerTarget(name, url, NAMES_POOL.index(name)))
        self.config = ClusterConfig.of(
            config.cluster,
            targets,
            config.settings,
            config.preferred_active,
            config.phase,
            paused=config.paused,
        )

    def set_paused(self, paused: bool) -> None:
        """The pause annotation set (or removed) on the BrokerCluster: ``core/pause.py``."""
        self.config = replace(self.config, paused=paused)

    def pod_facts(self) -> dict[str, PodFacts]:
        if not self.pod_mode:
            return {}
        return {
            t.name: PodFacts(
                exists=True,
                container_terminated=not self.brokers[t.name].alive,
                node_draining=t.name in self.draining,
            )
            for t in self.config.targets
        }

    # -- faults ----------------------------------------------------------------

    def journal_fails(self, name: str) -> None:
        """A journal write fails (disk full, I/O error): the broker fences itself, as Broker does."""
        broker = self.brokers[name]
        if broker.alive and broker.paused_at is None:
            broker.run_until(self.now)
            broker.journal_error = "No space left on device (simulated)"
            broker.term.fence(f"journal failed: {broker.journal_error}")

    def left_active(self, name: str, epoch: int) -> None:
        """A previous operator's last act: ``name`` activated with ``epoch`` just now."""
        broker = self.brokers[name]
        broker.run_until(self.now)
        broker.handle(True, epoch, self.now)
        self.target_epoch = max(self.target_epoch, epoch)
        assert broker.active, f"{name} could not be left active with epoch {epoch}"
        self.terms.add((name, epoch))

    def only_spec_brokers_may_be_active(self) -> bool:
        """No process outside the spec's current brokers is active (in its own view)."""
        current = {id(self.brokers.get(t.name)) for t in self.config.targets}
        return not any(b.active and id(b) not in current for b in self.processes())

    def operator_restarts(self, lost_status_writes: int = 0) -> None:
        """The operator's process restarts (kill -9, an eviction mid-switchover): a new engine
        knows only the BrokerCluster as stored, ``status.epoch`` (the compare-and-swap's, always
        current) and the status as written, of which the last ``lost_status_writes`` never
        landed (the old process died with them queued). Its answers and watch signals in flight
        are lost with it; what it sent has reached the brokers."""
        landed = self.written_statuses[: max(0, len(self.written_statuses) - lost_status_writes)]
        status = landed[-1] if landed else None
        self.state = initial_state(
            self.config,
            now=self.now,
            wall_now=1.7e9 + self.now,
            epoch=self.stored_epoch,
            last_active=status.active if status else None,
            failovers=status.failovers if status else 0,
            active_epoch=status.active_epoch if status else None,
        )
        self.recorded_status = status
        self.pending, self.signals = [], []
        self.engine_epochs = set(range(1, self.stored_epoch + 1))  # all inherited now

    def operator_hands_over(self, gap: float, lost_status_writes: int = 0) -> None:
        """The operator exits gracefully (an upgrade): its engine's handover renewal
        (core/handover.py) goes out like any heartbeat (a partitioned, paused or dead broker does
        not take it), no engine runs for ``gap`` seconds (the pod's replacement), and then the
        successor starts as in :meth:`operator_restarts`."""
        action = handover_renewal(self.state, self.config, self.now)
        if action is not None:
            self.active_true_calls.append((self.now, action.broker))
            self.renewals.append((self.now, action.broker))
            self.handovers.append((self.now, action.broker))
            self._heartbeat(action)
        self._run_processes()
        self.now += gap
        self._run_processes()  # the brokers' lease watchers ran on meanwhile
        self.operator_restarts(lost_status_writes)

    def crash(self, name: str, *, noticed_after: float | None = None) -> None:
        """kill -9. ``noticed_after``: the watch proves it (FIN, then a refused connect, now) and the
        engine hears of it that much later, possibly after a restart: the proof must not carry
        over to the new process."""
        broker = self.brokers[name]
        broker.alive = False
        broker.new_process()  # kill -9: the process and its activity are gone; the epoch is on disk
        target = self.config.target(name)
        if noticed_after is not None and target is not None:
            gone = ProcessGone(name, target.url, self.now, "watch ended; admin port refused (simulated)")
            self.signals.append((self.now + noticed_after, gone))

    def connection_lost(self, name: str, *, after: float = 0.0) -> None:
        """The watch connection breaks with the process alive or not: proof of nothing."""
        target = self.config.target(name)
        if target is not None:
            lost = ConnectionLost(name, target.url, "reset by peer (simulated)")
            self.signals.append((self.now + after, lost))

    def restart(self, name: str) -> None:
        broker = self.brokers[name]
        broker.alive = True
        # A broker always starts Inactive with its stored epoch; the fence restriction was in memory.
        broker.new_process()
        broker.run_until(self.now)

    def pause(self, name: str) -> None:
        broker = self.brokers[name]
        if broker.paused_at is None:
            if broker.alive:
                broker.run_until(self.now)  # its watcher's last tick is now
            broker.paused_at = self.now

    def resume(self, name: str, *, watcher_first: bool = True) -> None:
        """SIGCONT: the queued requests are handled (their answers are lost) and the watcher ticks.

        Either may run first after a resume: ``watcher_first`` (its tick sees the pause as the
        gap since its last one) or the handlers first (each sees it as the time since the
        watcher's last tick). Longer than tick + margin is a stall: an active broker fences
        itself, and every ``active=true`` that waited it out is refused
        (``EVENT_LOOP_STALLED``), an activation included. The term machine decides.
        """
        broker = self.brokers[name]
        if broker.paused_at is None:
            return
        broker.paused_at, queued, broker.queued = None, broker.queued, []
        if not broker.alive:
            return
        if watcher_first:
            broker.term.tick(self.now)
        for action in queued:
            self._act(broker, action, watcher_ran=watcher_first)
        broker.term.tick(self.now)

    def clock_step(self, seconds: float) -> None:
        """Everyone's time jumps (a paused VM): every process notices its stall when it runs again.

        A running process's watcher sees it at its next tick; a paused one when it resumes.
        """
        self._run_processes()
        self.now += seconds
        for broker in self.processes():
            if broker.alive and broker.paused_at is None:
                broker.term.tick(self.now)

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
            due = [signal for at, signal in self.signals if at <= self.now]
            self.signals = [(at, signal) for at, signal in self.signals if at > self.now]
            self.pending = [*self.pending, *due]  # as the loop: outcomes first, then signals
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
                    if self.config.paused:
                        # While paused only the active, or a restarted engine's recorded active, at
                        # the epoch it holds (core/pause.py): no term begins.
                        assert action.broker == state.active or state.resumes_holder(action.broker), (
                            f"active=true to {action.broker} while paused (active {state.active})"
                        )
                    assert action.epoch in self.engine_epochs, (
                        f"active=true to {action.broker} with epoch {action.epoch}, never granted to"
                        f" this engine (grants: {self.grants}, inherited up to {self.stored_epochs[0]})"
                    )
                latency = max(latency, self._heartbeat(action))
            elif isinstance(action, AllocateEpoch):
                assert not self.config.paused, f"epoch {action.epoch} allocated while paused"
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
            elif isinstance(action, PointActive):
                self._point_service(action)
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
        if broker.name in self.tls_broken:
            self.pending.append(
                HeartbeatFailed(
                    action.broker,
                    action.active,
                    action.epoch,
                    False,
                    "certificate verify failed: certificate has expired (simulated)",
                    action.renew,
                    tls_error=True,
                )
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
        if broker.slow or self.operator_late:
            self.pending.append(replace(timed_out, operator_late=self.operator_late))
            return timeout
        answered = HeartbeatAnswered(action.broker, action.active, action.epoch, reply, action.renew)
        self.pending.append(answered)
        self.answers.append((self.now, action, reply))
        return RTT

    def _act(self, broker: SimBroker, action: SendHeartbeat, *, watcher_ran: bool = True) -> HeartbeatReply:
        if watcher_ran:
            broker.run_until(self.now)
        was_active, was_epoch = broker.active, broker.term.epoch
        reply = broker.handle(
            action.active, action.epoch, self.now, action.renew, self.target_epoch, action.lease_seconds
        )
        # A new term: an inactive broker activated, or an active one took a higher epoch (its log
        # shows the term end and the next begin, ``TermMachine.epoch_stored``).
        if broker.active and (not was_active or broker.term.epoch != was_epoch):
            self.target_epoch = max(self.target_epoch, broker.term.epoch)
            self._check_activation(broker)
        return reply

    def _point_service(self, action: PointActive) -> None:
        """As controller/endpoints.py: refused under a lower epoch than the Service's."""
        if action.epoch < self.service[1]:
            return  # ServiceFenced: the engine sees no ActivePointed and retries
        if action.active is not None:
            # The Service only ever names a broker that was activated with that very epoch.
            assert (action.active, action.epoch) in self.terms, (
                f"Service pointed at {action.active} under epoch {action.epoch}, never its activation"
            )
        self.service = (action.active, action.epoch)
        self.service_writes.append((self.now, action.active, action.epoch))
        self.pending.append(ActivePointed(action.active))

    def _check_activation(self, broker: SimBroker) -> None:
        self._run_processes()  # self-fence whoever's lease ran out
        others = [b.name for b in self.processes() if b is not broker and b.acts_as_active(self.now)]
        assert not others, f"{broker.name} activated at t={self.now:.3f} while {others} still active"
        epoch = broker.term.epoch
        # A pause begins no term: at most the one the broker held goes on (a restart's resumed holder).
        assert not self.config.paused or (broker.name, epoch) in self.terms, (
            f"{broker.name} activated with epoch {epoch} while paused"
        )
        owner = self.epoch_owner.setdefault(epoch, broker.name)
        assert owner == broker.name, f"epoch {epoch} given to both {owner} and {broker.name}"
        self.activations.append((self.now, broker.name, epoch))
        self.terms.add((broker.name, epoch))
