"""TLS failures are not evidence against a broker (issue 41): no failover, no flapping.

``ARCHITECTURE.md``: a certificate error is never a proof of death. Every broker of a cluster
shares the PKI (the operator's CA, its client certificate), so a failover away from a broker the
operator cannot handshake with would meet the same failure at the next one, and come back.
``HeartbeatFailed.tls_error`` (set by the heartbeat client for a certificate that did not verify,
or the operator's refused) is therefore not counted against the active nor a move's candidate,
like a timeout the operator caused itself (``test_operator_late.py``); it stays visible as the
broker's ``tls_problem``. The world is the property tests' (``simulation.World``): the real
decision core against brokers running the broker's own term machine.
"""

from __future__ import annotations

from broker_contracts.soap import BrokerState
from broker_operator.core import HeartbeatFailed
from broker_operator.core.frozen import replace
from broker_operator.core.knowledge import TLS_ERROR, Move, MoveKind
from broker_operator.core.observe import observe
from tests.unit.core.simulation import World
from tests.unit.core.test_handover import SETTINGS, steady_world

BROKEN_FOR = 5 * SETTINGS.lease_seconds  # far past failureThreshold times the interval


def tls_failure(broker: str, *, active: bool = True, epoch: int = 1) -> HeartbeatFailed:
    return HeartbeatFailed(
        broker, active, epoch, False, "certificate verify failed: certificate has expired", tls_error=True
    )


def test_a_tls_failure_of_the_active_is_not_counted_and_stays_visible() -> None:
    world = steady_world()
    state = observe(world.state, world.config, tls_failure("b0"), world.now)
    b0 = state.broker("b0")
    assert b0 is not None
    assert b0.failures == 0 and b0.state == BrokerState.ACTIVE.value
    assert b0.tls_problem == "certificate verify failed: certificate has expired"
    # The same failure without the flag is counted, and shown as the broker's state.
    counted = observe(world.state, world.config, HeartbeatFailed("b0", True, 1, False, "refused"), world.now)
    assert counted.broker("b0").failures == 1  # type: ignore[union-attr]
    assert counted.broker("b0").state == BrokerState.UNAVAILABLE.value  # type: ignore[union-attr]


def test_a_standby_failing_tls_is_shown_unavailable_with_code_tls_error() -> None:
    world = steady_world()
    state = observe(world.state, world.config, tls_failure("b1", active=False), world.now)
    b1 = state.broker("b1")
    assert b1 is not None
    assert (b1.state, b1.code) == (BrokerState.UNAVAILABLE.value, TLS_ERROR)
    assert b1.tls_problem is not None and not b1.ready


def test_an_answer_clears_the_tls_problem() -> None:
    world = steady_world()
    world.tls_broken = {"b1"}
    world.run(2 * SETTINGS.standby_probe_seconds)
    assert world.state.broker("b1").tls_problem is not None  # type: ignore[union-attr]
    world.tls_broken = set()
    world.run(2 * SETTINGS.standby_probe_seconds)
    b1 = world.state.broker("b1")
    assert b1 is not None and b1.tls_problem is None and b1.ready


def test_tls_failing_with_every_broker_fails_nothing_over() -> None:
    world = steady_world()
    world.tls_broken = {"b0", "b1"}  # the operator's certificate expired: every broker refuses it
    world.run(BROKEN_FOR)
    # The active's lease ran out (no renewal got through) and it fenced itself, but the engine
    # activated nobody else: the next broker refuses the same certificate.
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)]
    assert world.state.active == "b0" and world.state.broker("b0").failures == 0  # type: ignore[union-attr]
    assert world.state.move is None and world.state.failovers == 0
    assert world.actives() == []
    # Fixed (a renewed certificate): the cluster has one active again.
    world.tls_broken = set()
    world.run(BROKEN_FOR)
    assert len(world.actives()) == 1


def test_tls_failing_with_the_active_alone_fails_it_not_over() -> None:
    # The rule does not guess whose certificate is at fault: as written in ARCHITECTURE.md, a
    # certificate error is never a reason to fail over. The condition tells a person.
    world = steady_world()
    world.tls_broken = {"b0"}
    world.run(BROKEN_FOR)
    assert [(name, epoch) for _, name, epoch in world.activations] == [("b0", 1)]
    assert world.state.failovers == 0 and world.state.active == "b0"


def test_a_crash_still_fails_over_while_tls_fails_with_the_active() -> None:
    # The kubelet's report (pod mode) is a proof; a TLS failure does not hide it.
    world = World.create(["b0", "b1"], SETTINGS, pod_mode=True)
    world.run(3.0)
    assert world.actives() == ["b0"]
    world.tls_broken = {"b0"}
    world.run(1.0)
    world.crash("b0")
    world.run(BROKEN_FOR)
    assert world.actives() == ["b1"] and world.state.active == "b1"


def test_a_candidate_failing_tls_is_asked_again_after_an_interval_not_in_a_loop() -> None:
    world = steady_world()
    move = Move(
        MoveKind.FAILOVER, "b0", "CONTAINER_TERMINATED", world.now, ("b0", "b1"), frozenset({"b0"}), "b1"
    )
    state = replace(world.state, active=None, epoch=2, move=replace(move, attempted=True))
    state = observe(state, world.config, tls_failure("b1", epoch=state.epoch), world.now)
    assert state.move is not None and state.move.candidate is None
    assert "b1" not in state.move.tried  # not passed over: asked again...
    assert state.move.retry_at == world.now + SETTINGS.interval_seconds  # ... after an interval
    b1 = state.broker("b1")
    assert b1 is not None and b1.activation_failed_at is None and b1.tls_problem is not None


def test_a_failover_gets_past_a_standby_failing_tls_and_fails_back_once_fixed() -> None:
    # b0 crashes; b1, next in priority, fails TLS (its serving certificate not trusted yet, say).
    # Its activation is asked again an interval later, but the probes meanwhile show it
    # unavailable (code TLS_ERROR), and the walk activates the ready b2: a crash must not wait for
    # a certificate. Fixed, b1 is ready again and Automatic failback returns to it, once.
    world = World.create(["b0", "b1", "b2"], SETTINGS, pod_mode=True)
    world.run(3.0)
    assert world.actives() == ["b0"]
    world.tls_broken = {"b1"}
    world.crash("b0")
    world.run(BROKEN_FOR)
    assert world.actives() == ["b2"]
    b1 = world.state.broker("b1")
    assert b1 is not None and b1.code == TLS_ERROR and b1.activation_failed_at is None
    world.tls_broken = set()
    world.run(BROKEN_FOR + SETTINGS.failback_stable_seconds)
    assert world.actives() == ["b1"]
    assert [name for _, name, _ in world.activations] == ["b0", "b2", "b1"]
