"""What the decision core asks the shell to do, and what the shell reports back.

Actions and observations are the only way the pure core (:mod:`.decisions`) talks
to the world: the loop in ``engine.py`` carries out actions and turns their
outcomes into observations for the next step. Keeping both as small frozen
values makes a step easy to log, to replay, and to drive from hypothesis.

Parallelism contract: every action returned by one step may run concurrently.
The core makes that safe by never putting an activation (``SendHeartbeat`` with
``active=True`` to a broker that is not yet the active) in the same step as an
epoch allocation or another activation. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_operator.core.model import HeartbeatReply


@dataclass(frozen=True)
class SendHeartbeat:
    broker: str
    url: str
    active: bool
    epoch: int
    # False: a pure check of the active (WSDL ``renewLease=false``), sent after a
    # renewal failed; it cannot renew the lease, so it does not extend the fence.
    renew: bool = True
    # The move's candidate being activated: it may take longer than a renewal (the broker
    # tells both targets its epoch before it answers), so the loop waits at least
    # ACTIVATION_MIN_TIMEOUT_SECONDS for it.
    activation: bool = False
    # A handover renewal (WSDL ``leaseSeconds``): the lease a stopping operator grants its active
    # so that its successor has time to start; None: the broker's own lease (core/handover.py).
    lease_seconds: float | None = None


@dataclass(frozen=True)
class AllocateEpoch:
    """Ask the shell to record ``epoch`` durably, only if the stored epoch is still ``current``.

    ``epoch`` is ``current + 1`` unless a broker reported a higher stored epoch: then it is
    one above the highest reported, so that a re-created cluster whose brokers remember
    epoch 94 gets there in one compare-and-swap rather than climbing one write at a time.
    """

    current: int
    epoch: int

    def __post_init__(self) -> None:
        if self.epoch <= self.current:
            raise ValueError(f"AllocateEpoch: epoch {self.epoch} must be above current {self.current}")


@dataclass(frozen=True)
class PointActive:
    """Point the ``<cluster>-active`` Service at ``active`` (at ``url``'s address), or at nobody.

    ``epoch`` fences the write: the active's epoch, or the cluster's while none is active. A
    shell that finds the Service already pointed under a higher epoch refuses (another term
    has begun). The ``role=active`` label follows, for people and ``kubectl get pods -l``.
    """

    active: str | None
    epoch: int
    url: str | None = None


@dataclass(frozen=True)
class RecordEvent:
    reason: str
    message: str
    warning: bool


Action = SendHeartbeat | AllocateEpoch | PointActive | RecordEvent


@dataclass(frozen=True)
class HeartbeatAnswered:
    broker: str
    active: bool  # what was asked
    epoch: int
    reply: HeartbeatReply
    renew: bool = True


@dataclass(frozen=True)
class HeartbeatFailed:
    broker: str
    active: bool
    epoch: int
    # False only when the request surely never reached the broker (connection
    # refused): then an active=true call cannot have renewed its lease.
    reached: bool
    reason: str
    renew: bool = True
    # Reached, but the connection was reset or closed by the peer before any reply: no live
    # process answered it (proof of nothing by itself; see observe._process_gone).
    peer_closed: bool = False
    # A timeout while the operator's own event loop ran late by at least half the timeout
    # (loop_lag.py): the delay was the operator's, so the timeout says nothing about the broker.
    operator_late: bool = False
    # TLS failed with the broker (its certificate did not verify, or it refused the operator's):
    # proof of nothing about the broker, and never a reason to fail over, since every broker of
    # the cluster shares the PKI and the next one would fail the same way (heartbeat_client.py).
    tls_error: bool = False


@dataclass(frozen=True)
class EpochGranted:
    epoch: int


@dataclass(frozen=True)
class EpochRefused:
    current: int | None  # the stored epoch, when the shell knows it
    reason: str


@dataclass(frozen=True)
class ActivePointed:
    active: str | None


@dataclass(frozen=True)
class ConnectionLost:
    """The operator's watch connection to ``broker`` at ``url`` broke (an EOF or a reset).

    Proof of nothing: a hung broker, a partition or a middlebox can cause one. It counts as a
    failed heartbeat of that broker, and the broker is checked again at once.
    """

    broker: str
    url: str
    reason: str


@dataclass(frozen=True)
class ProcessGone:
    """The broker process the operator watched at ``url`` is gone, proven at ``at``.

    Its watch stream ended with a FIN (its kernel closed it) and, at ``at``, a new connection to
    the same pod address and admin port was refused: nothing listens there. It proves the process
    is not active because a broker never closes its admin listener while it may act
    (docs/failover-engine.md, "Proofs of death"). A process that answered, or a call that may
    have reached one, after ``at`` voids it.
    """

    broker: str
    url: str
    at: float
    reason: str


Observation = (
    HeartbeatAnswered
    | HeartbeatFailed
    | EpochGranted
    | EpochRefused
    | ActivePointed
    | ConnectionLost
    | ProcessGone
)
