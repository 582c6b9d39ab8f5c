"""The term machine's vocabulary: the effects it asks its caller to perform, and its answers.

Split from :mod:`broker_service.term` so that the rules read in one file; these are plain
records with no behaviour. :mod:`broker_service.term` re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_contracts.message_log import Event
from broker_contracts.soap import BrokerState, HeartbeatReply


def reply_of(
    state: BrokerState, epoch: int, code: str | None = None, message: str | None = None
) -> HeartbeatReply:
    """The answer to one Heartbeat: the contract's ``HeartbeatReply`` (the WSDL's response)."""
    return HeartbeatReply(state=state, unavailability_code=code, unavailability_message=message, epoch=epoch)


# ---- effects: what the caller performs, in the order given ------------------------------------


@dataclass(frozen=True, slots=True)
class StoreEpoch:
    """Make ``epoch`` the durable stored epoch; then :meth:`TermMachine.epoch_stored` (awaited)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Activate:
    """Probe the cloud, ask the backend to resend, apply its cursors (awaited; may fail with a code)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class StartRelaying:
    """The broker is Active under ``epoch``: start the forwarders and the cloud poller."""

    epoch: int


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """The broker is no longer Active from this instant (its bundles are refused already)."""

    reason: str


@dataclass(frozen=True, slots=True)
class SelfFenced:
    """The broker fenced itself at ``epoch``: say why, and drain later, in a task under the lock."""

    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class StopRelaying:
    """Drain (bounded): bundles being journaled, in-flight cloud bundles, pending confirmations."""

    epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class LogLifecycle:
    """A message-log ``activated``/``deactivated`` record; ``close_segment`` after a drain."""

    event: Event
    epoch: int
    close_segment: bool = False


@dataclass(frozen=True, slots=True)
class HandoverRenewed:
    """A handover renewal extended the lease of the term at ``epoch`` to ``seconds`` (log it once)."""

    epoch: int
    seconds: float


@dataclass(frozen=True, slots=True)
class StallSeen:
    """The lease watcher found the event loop stalled for ``seconds`` (over ``limit``)."""

    seconds: float
    limit: float


Effect = (
    StoreEpoch
    | Activate
    | StartRelaying
    | StopAccepting
    | SelfFenced
    | StopRelaying
    | LogLifecycle
    | HandoverRenewed
    | StallSeen
)


@dataclass(frozen=True, slots=True)
class Answer:
    """What one heartbeat input decided: the reply (once known), effects, and the I/O it awaits."""

    reply: HeartbeatReply | None = None
    effects: tuple[Effect, ...] = ()
    awaiting: StoreEpoch | Activate | None = None
