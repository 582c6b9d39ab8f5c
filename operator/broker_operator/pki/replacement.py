"""Replacing the CA's key, in phases, so that no party ever meets a certificate it does not trust.

Same-key renewal (``renewal``) needs no coordination: old and new CA certificates verify the same
leaves. A new key does: a leaf signed by it is refused by every party that does not trust it yet,
and dropping the old CA refuses every leaf it signed that is still served. So a replacement is an
explicit act, asked for by a new value of the ``broker.failover.dev/replace-ca-key`` annotation
(any string; a value not seen before starts one), and runs as ``advance`` steps through phases:

    Done       bundle = [CA]; the CA signs.  A new token: make the new CA, go to Trusting.
    Trusting   bundle = [old, new]; the old CA signs. Wait until every broker has loaded this
               bundle (it reports the ``bundle_version``), and a person has confirmed that the
               clients outside the cluster (SAP STRUST, the PI/PO TrustedCAs view) trust the new
               CA too: the operator cannot see their trust stores.
    Reissuing  bundle = [old, new]; the new CA signs, so ``renewal`` reissues both leaves
               ("does not verify against the current CA"). Wait until every broker serves the
               server certificate of the new CA (its serial, as seen in the operator's own TLS
               handshake) and the operator presents a client certificate of the new CA.
    Retiring   bundle = [new]; the new CA signs. Wait until every broker has loaded it: Done.

The invariant, which tests/unit/pki drive with hypothesis against brokers that load bundles and
certificates late: a CA leaves the published bundle only when no broker serves a leaf of it and
the operator presents none, and a leaf of a CA is issued only once every broker trusts that CA.

One transition per step: each wait is on something the previous step published, which no
observation can already confirm. A new token during a replacement waits for it to finish and
then starts another (replacing the CA being introduced mid-way would need a third CA in trust).
Removing the annotation does not stop a replacement under way.

What it does not do: issue leaves (``renewal`` decides, ``authority`` issues), store the state
(the shell keeps it beside the CA in the CA Secret), or observe anything itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from broker_operator.controller.names import GROUP
from broker_operator.pki.material import CertificateInfo, KeyPair
from broker_operator.pki.trust import bundle_version, trust_bundle

__all__ = [
    "ANNOTATION_REPLACE_CA_KEY",
    "ReplacementPhase",
    "ReplacementState",
    "ReplacementStep",
    "TrustObservations",
    "advance",
]

ANNOTATION_REPLACE_CA_KEY: Final = f"{GROUP}/replace-ca-key"


class ReplacementPhase(StrEnum):
    TRUSTING = "Trusting"
    REISSUING = "Reissuing"
    RETIRING = "Retiring"
    DONE = "Done"


@dataclass(frozen=True)
class ReplacementState:
    """What the CA Secret records between steps.

    ``ca`` signs outside a replacement, and is the old CA in Trusting and Reissuing; ``incoming``
    is the new CA in those two phases. ``token`` is the value of the last replacement started: a
    new CA Secret records the annotation's value of that moment, so making a CA starts nothing.
    """

    ca: KeyPair
    incoming: KeyPair | None = None
    token: str | None = None
    phase: ReplacementPhase = ReplacementPhase.DONE

    def __post_init__(self) -> None:
        replacing = self.phase in (ReplacementPhase.TRUSTING, ReplacementPhase.REISSUING)
        if replacing != (self.incoming is not None):
            raise ValueError(
                f"a replacement in phase {self.phase} must {'' if replacing else 'not '}hold a new CA"
            )


@dataclass(frozen=True)
class TrustObservations:
    """What the shell saw since the last step."""

    brokers: frozenset[str]  # every broker that must confirm: the cluster's members now
    # broker -> the bundle_version it reports having loaded into its live TLS context
    loaded_bundles: Mapping[str, str]
    # broker -> the serial of the server certificate it presented in the operator's last handshake
    served_serials: Mapping[str, str]
    server: CertificateInfo | None  # the brokers' server certificate as the Secret holds it now
    # The client certificate the operator presents now; with several operator processes, the one
    # of the old CA while any process still presents one.
    client: CertificateInfo | None
    external_trust_confirmed: bool  # a person confirmed the outside clients trust the new CA


@dataclass(frozen=True)
class ReplacementStep:
    state: ReplacementState  # to record
    trust_bundle: bytes  # to publish to the brokers, and what the operator trusts
    bundle_version: str
    signing_ca: KeyPair  # the CA leaves are issued from now
    transition: str | None  # what changed in this step (an event), or None
    waiting_for: str | None  # what the phase waits on (a status message), or None


def _short(token: str) -> str:
    return repr(token if len(token) <= 64 else token[:61] + "...")


def _fingerprint(ca: KeyPair) -> str:
    return ca.info().fingerprint[:16]


def _pending(brokers: Iterable[str], done: Callable[[str], bool]) -> list[str]:
    return sorted(broker for broker in brokers if not done(broker))


def _listed(brokers: list[str]) -> str:
    shown = ", ".join(brokers[:5])
    return shown if len(brokers) <= 5 else f"{shown} and {len(brokers) - 5} more"


def _step(state: ReplacementState, transition: str | None, waiting_for: str | None) -> ReplacementStep:
    if state.incoming is None:
        bundle, signing = trust_bundle(state.ca.certificate_pem), state.ca
    else:
        bundle = trust_bundle(state.ca.certificate_pem, state.incoming.certificate_pem)
        signing = state.incoming if state.phase is ReplacementPhase.REISSUING else state.ca
    return ReplacementStep(state, bundle, bundle_version(bundle), signing, transition, waiting_for)


def advance(
    state: ReplacementState,
    requested_token: str | None,
    observed: TrustObservations,
    *,
    new_ca: Callable[[], KeyPair],
) -> ReplacementStep:
    """One step of the replacement: the bundle to publish, the CA that signs, the state to record.

    ``new_ca`` makes the incoming CA (``authority.new_ca`` with the cluster's name and policy);
    it is called only when a replacement starts.
    """
    if state.phase is ReplacementPhase.DONE:
        return _from_done(state, requested_token, new_ca)
    if state.phase is ReplacementPhase.TRUSTING:
        return _from_trusting(state, observed)
    if state.phase is ReplacementPhase.REISSUING:
        return _from_reissuing(state, observed)
    return _from_retiring(state, observed)


def _from_done(
    state: ReplacementState, requested: str | None, new_ca: Callable[[], KeyPair]
) -> ReplacementStep:
    if not requested or requested == state.token:
        return _step(state, None, None)
    incoming = new_ca()
    return _step(
        replace(state, incoming=incoming, token=requested, phase=ReplacementPhase.TRUSTING),
        f"CA key replacement {_short(requested)} started: every broker is to trust the new CA "
        f"{_fingerprint(incoming)} beside the old {_fingerprint(state.ca)} before a leaf of it is issued",
        None,
    )


def _not_loaded(current: ReplacementStep, observed: TrustObservations) -> list[str]:
    """The brokers that have not reported loading the bundle ``current`` publishes."""
    return _pending(observed.brokers, lambda b: observed.loaded_bundles.get(b) == current.bundle_version)


def _from_trusting(state: ReplacementState, observed: TrustObservations) -> ReplacementStep:
    current = _step(state, None, None)
    waits = []
    loading = _not_loaded(current, observed)
    if loading:
        waits.append(f"{_listed(loading)} to load trust bundle {current.bundle_version} (old and new CA)")
    if not observed.external_trust_confirmed:
        waits.append("confirmation that clients outside the cluster (SAP STRUST, PI/PO) trust the new CA")
    if waits:
        return _step(state, None, "waiting for " + "; ".join(waits))
    return _step(
        replace(state, phase=ReplacementPhase.REISSUING),
        f"every broker trusts the new CA (bundle {current.bundle_version}): issuing leaves from it",
        None,
    )


def _from_reissuing(state: ReplacementState, observed: TrustObservations) -> ReplacementStep:
    assert state.incoming is not None  # ReplacementState.__post_init__
    new = state.incoming.info()
    server, client = observed.server, observed.client
    waits = []
    if server is None or not server.signed_by(new):
        waits.append("the server certificate to be issued from the new CA")
    else:
        serial = server.serial
        serving = _pending(observed.brokers, lambda b: observed.served_serials.get(b) == serial)
        if serving:
            waits.append(f"{_listed(serving)} to serve the new CA's server certificate (serial {serial})")
    if client is None or not client.signed_by(new):
        waits.append("the operator to present a client certificate of the new CA")
    if waits or server is None or client is None:
        return _step(state, None, "waiting for " + "; ".join(waits))
    return _step(
        replace(state, ca=state.incoming, incoming=None, phase=ReplacementPhase.RETIRING),
        f"every broker serves serial {server.serial} and the operator presents serial {client.serial}, "
        f"both of the new CA: dropping the old CA {_fingerprint(state.ca)} from trust",
        None,
    )


def _from_retiring(state: ReplacementState, observed: TrustObservations) -> ReplacementStep:
    current = _step(state, None, None)
    loading = _not_loaded(current, observed)
    if loading:
        return _step(
            state, None, f"waiting for {_listed(loading)} to load trust bundle {current.bundle_version}"
        )
    return _step(
        replace(state, phase=ReplacementPhase.DONE),
        f"CA key replacement {_short(state.token or '')} done: every broker trusts the new CA alone",
        None,
    )
