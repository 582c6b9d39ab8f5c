"""The handover renewal: what a stopping operator sends its active so that a restart moves nothing.

An active broker stays active only while the operator renews its lease (``leaseSeconds``, 10 s by
default). Replacing the operator's pod (an upgrade, a drain of its node) takes longer than that on
a loaded node, and longer the more clusters the new process must resume: the active would fence
itself and be activated again under a new epoch, a pause in traffic at every upgrade. So when the
operator process exits, each engine whose active is confirmed and steady renews it once more with
``handoverLeaseSeconds`` (the WSDL's ``leaseSeconds``; the broker caps it at its
``--max-lease-seconds``), and stops.

The fence stays whole because every engine that starts counts every broker possibly active for
the longest lease any predecessor could have granted it, a handover's, plus the window in which a
predecessor sends them (``HeartbeatSettings.start_fence_seconds``), whether or not it read a status
that says so; docs/failover-engine.md, "Operator restarts and upgrades: the fence".
"""

from __future__ import annotations

from broker_contracts.soap import BrokerState
from broker_operator.core.actions import SendHeartbeat
from broker_operator.core.knowledge import ClusterConfig, EngineState


def handover_renewal(state: EngineState, config: ClusterConfig, now: float) -> SendHeartbeat | None:
    """The handover renewal of the active, or None when there is nothing steady to hand over.

    Only an active that answered its last renewal ``Active`` and whose lease, as this engine
    counts it, still runs: a handover must never revive a broker that may have fenced itself (it
    would refuse anyway, at the same epoch) nor keep a failing active in place for the successor
    to wait out. Never during a move: the successor re-walks from the status, and an activation
    this engine was making is fenced by the successor's start fence like everything else.
    """
    if state.active is None or state.move is not None:
        return None
    broker = state.broker(state.active)
    target = config.target(state.active)
    if broker is None or target is None or not broker.in_spec:
        return None
    steady = broker.state == BrokerState.ACTIVE.value and broker.failures == 0 and not broker.dead
    if not steady or broker.gone_at is not None or not broker.possibly_active(now):
        return None
    return SendHeartbeat(
        broker.name,
        target.url,
        active=True,
        epoch=state.active_epoch,
        lease_seconds=config.settings.granted_handover_seconds,
    )
