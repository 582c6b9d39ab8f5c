"""The simulation's brokers answer as the real broker does, because they run its term state machine.

Until issue 13 item 7 the property tests ran a model of the broker's rules (``SimBroker``
had rules of its own). The model differed from the broker in what an engine hears after a
self-fence: it answered a check (``renewLease=false``) of a fenced broker ``Inactive`` where
the broker answers ``Unavailable/LEASE_EXPIRED``, a renewal that waited out a stall
``LEASE_EXPIRED`` where the broker answers ``EVENT_LOOP_STALLED``, and a check with an epoch
below the stored one ``Active`` where the broker answers ``STALE_EPOCH``. The rows below are
the answers ``tests/integration/broker/test_heartbeat.py`` pins on a real broker process
(SIGSTOP, real leases); each failed against the old model, and the property tests now drive
the engine with these answers.
"""

from __future__ import annotations

from broker_contracts.soap import BrokerState
from tests.unit.core.simulation import SimBroker, World
from tests.unit.core.test_decisions import FAST


def _answers_from(
    world: World, name: str, since: int
) -> list[tuple[bool, bool, str, str | None, str | None]]:
    return [
        (
            action.active,
            action.renew,
            reply.state.value,
            reply.unavailability_code,
            reply.unavailability_message,
        )
        for _, action, reply in world.answers[since:]
        if action.broker == name
    ]


def test_after_a_vm_pause_the_engine_hears_stalled_then_lease_expired_and_fails_over() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    assert world.actives() == ["b0"]
    since = len(world.answers)
    world.clock_step(5.0)  # every process stalls; b0 fences itself at its first tick
    world.run(2.0)
    answers = _answers_from(world, "b0", since)
    # The renewal read right after the stall is refused without being acted on (the old model
    # said LEASE_EXPIRED); the check after it names the fenced term (the old model: Inactive).
    active, renew, state, code, message = answers[0]
    assert (active, renew, state, code) == (True, True, "Unavailable", "EVENT_LOOP_STALLED")
    active, renew, state, code, message = answers[1]
    assert (active, renew, state, code) == (True, False, "Unavailable", "LEASE_EXPIRED")
    assert message is not None and "stalled" in message  # as test_heartbeat.py's stall test pins
    assert world.actives() == ["b1"]


def test_a_check_of_an_active_that_a_short_sigstop_fenced_answers_lease_expired() -> None:
    world = World.create(["b0", "b1"], FAST)
    world.run(2.0)
    since = len(world.answers)
    world.pause("b0")
    world.run(0.4)  # over tick + margin (0.35 s): a stall, though shorter than one interval
    world.resume("b0")
    world.run(1.0)
    checks = [a for a in _answers_from(world, "b0", since) if a[:2] == (True, False)]
    assert checks and checks[0][2:4] == ("Unavailable", "LEASE_EXPIRED")


def test_a_check_with_an_epoch_below_the_stored_one_is_stale() -> None:
    broker = SimBroker("b0", FAST.lease_seconds)
    broker.run_until(10.0)
    assert broker.handle(True, 2, 10.0).state is BrokerState.ACTIVE
    broker.run_until(10.5)
    reply = broker.handle(True, 1, 10.5, renew=False)  # the old model answered Active
    assert (reply.state, reply.unavailability_code) == (BrokerState.UNAVAILABLE, "STALE_EPOCH")
    assert broker.active  # and nothing changed


def test_a_simulated_broker_honours_a_handover_renewal_as_the_broker_does() -> None:
    broker = SimBroker("b0", lease=1.0, max_lease=4.0)
    assert broker.handle(True, 1, 0.0).state is BrokerState.ACTIVE
    broker.run_until(0.5)
    assert broker.handle(True, 1, 0.5, lease_seconds=100.0).state is BrokerState.ACTIVE  # capped at 4 s
    broker.run_until(4.5)
    assert broker.active and broker.acts_as_active(4.5)  # past its 1 s lease: the handover's holds
    broker.run_until(4.6)
    assert not broker.active  # fenced once the capped lease ran out, with nothing after it
