"""Mode Operator, replacing the CA's key: where the phases' state lives, what they observe, what they say.

The rules are ``pki.replacement`` (Done, Trusting, Reissuing, Retiring; one ``advance`` per pass);
``operator_certificates.plan_and_issue`` calls it once per pass, and this module is the part of
the shell that is not I/O:

- **State** lives in ``<name>-ca``, beside the CA it replaces, so that it is written with the same
  conditional patch (``resourceVersion``) as the CA itself and two operator replicas can never
  both move a phase: ``ca.crt``/``ca.key`` stay the old CA until the Reissuing phase ends,
  ``incoming.crt``/``incoming.key`` hold the new CA in Trusting and Reissuing, and
  ``replacement.token``/``replacement.phase`` the annotation value last started and its phase. A
  Secret of the layout before this has none of the four: phase Done, no token.
- **The request** is the annotation ``broker.failover.dev/replace-ca-key`` on the BrokerCluster
  (any new value starts a replacement), and **the confirmation** that the clients outside the
  cluster trust the new CA is a second annotation, ``broker.failover.dev/replace-ca-key-trusted``,
  set by a person to the same value once SAP's STRUST (and the PI/PO TrustedCAs view, and any
  other client) holds the new CA: the operator cannot see those trust stores. A confirmation of
  another value confirms nothing, so one left over from an earlier replacement cannot let the
  next one through.
- **Observations** (:class:`Seen`) come from the heartbeat client through the daemon
  (``ClusterObservations``): the bundle each broker's admin port named in its latest reply, the
  serial each served in the operator's latest handshake, and the client certificate the
  heartbeats present now: the one in use, not the one in ``<name>-operator-client``, because
  the heartbeats take a new material a poll after the controller writes it, and the old CA must
  not leave the brokers' trust while the heartbeats still present a certificate of it.
- **Status** (:func:`status_of`) is ``status.tls.caReplacement``: ``token``, ``phase`` and a
  ``message`` that says what the phase waits for, including the ``kubectl annotate`` line a
  person runs to confirm.

What it does not do: decide (``pki.replacement``), issue (``operator_certificates``), or read,
write or post anything (``certificates.py``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker_contracts.tls.serial import serial_hex
from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.pki import (
    ANNOTATION_REPLACE_CA_KEY,
    CertificateError,
    CertificateInfo,
    KeyPair,
    ReplacementPhase,
    ReplacementState,
    ReplacementStep,
    certificate_info,
)

__all__ = [
    "ANNOTATION_REPLACE_CA_KEY",
    "ANNOTATION_REPLACE_CA_KEY_TRUSTED",
    "REPLACEMENT_KEYS",
    "Request",
    "Seen",
    "event_reason",
    "read_state",
    "request_of",
    "state_data",
    "status_of",
]

ANNOTATION_REPLACE_CA_KEY_TRUSTED: Final = f"{names.GROUP}/replace-ca-key-trusted"
INCOMING_CERT_KEY: Final = "incoming.crt"
INCOMING_KEY_KEY: Final = "incoming.key"
TOKEN_KEY: Final = "replacement.token"
PHASE_KEY: Final = "replacement.phase"
REPLACEMENT_KEYS: Final = (INCOMING_CERT_KEY, INCOMING_KEY_KEY, TOKEN_KEY, PHASE_KEY)
MAX_TOKEN_CHARS: Final = 253  # the CRD's bound on status.tls.caReplacement.token


@dataclass(frozen=True)
class Request:
    """The BrokerCluster's two annotations: the replacement asked for, and the one confirmed."""

    token: str | None = None
    trusted: str | None = None


def request_of(body: Mapping[str, Any]) -> Request:
    """The annotations of a BrokerCluster body (empty values count as absent)."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    token = str(annotations.get(ANNOTATION_REPLACE_CA_KEY) or "") or None
    trusted = str(annotations.get(ANNOTATION_REPLACE_CA_KEY_TRUSTED) or "") or None
    return Request(token, trusted)


def _hex_serial(serial: str) -> str | None:
    """A served serial as ``CertificateInfo.serial`` writes it (``serial_hex``), whatever case or
    zero padding it came in; None if it is not a serial."""
    try:
        return serial_hex(int(serial, 16))
    except ValueError:
        return None


@dataclass(frozen=True)
class Seen:
    """What the heartbeats saw, as the daemon publishes it (empty while no engine runs)."""

    brokers: frozenset[str] = frozenset()  # every broker that must confirm: the cluster's members
    loaded_bundles: Mapping[str, str] = field(default_factory=dict)
    served_serials: Mapping[str, str] = field(default_factory=dict)
    presented_certificate: bytes | None = field(default=None, repr=False)

    def served(self) -> dict[str, str]:
        normalised = {broker: _hex_serial(serial) for broker, serial in self.served_serials.items()}
        return {broker: serial for broker, serial in normalised.items() if serial is not None}

    def client(self) -> CertificateInfo | None:
        if not self.presented_certificate:
            return None
        try:
            return certificate_info(self.presented_certificate, what="the heartbeats' client certificate")
        except CertificateError:
            return None


def _text(secret: Mapping[str, Any], key: str) -> str | None:
    raw = shapes.secret_pem(secret, key, what=f"CA Secret {key}")
    return None if raw is None else raw.decode("utf-8", errors="replace")


def read_state(secret: Mapping[str, Any], ca: KeyPair) -> ReplacementState:
    """The replacement recorded in ``<name>-ca`` (its CA is ``ca``); ``CertificateError`` says what
    is inconsistent (a phase that needs a new CA without one, an unknown phase)."""
    token, phase_text = _text(secret, TOKEN_KEY), _text(secret, PHASE_KEY)
    incoming = shapes.key_pair(secret, INCOMING_CERT_KEY, INCOMING_KEY_KEY, what="CA Secret incoming")
    try:
        phase = ReplacementPhase(phase_text) if phase_text else ReplacementPhase.DONE
    except ValueError:
        raise CertificateError(
            f"the CA Secret's {PHASE_KEY} is {str(phase_text)[:40]!r}, not one of "
            f"{', '.join(p.value for p in ReplacementPhase)}"
        ) from None
    replacing = phase in (ReplacementPhase.TRUSTING, ReplacementPhase.REISSUING)
    try:
        return ReplacementState(ca=ca, incoming=incoming if replacing else None, token=token, phase=phase)
    except ValueError as error:
        raise CertificateError(f"the CA Secret's replacement record is inconsistent: {error}") from None


def state_data(state: ReplacementState) -> dict[str, bytes]:
    """What ``<name>-ca`` holds for ``state``: the CA, and the replacement's keys when there is one."""
    data = shapes.ca_secret_data(state.ca)
    if state.incoming is not None:
        data[INCOMING_CERT_KEY] = state.incoming.certificate_pem
        data[INCOMING_KEY_KEY] = state.incoming.key_pem
    if state.token is not None:
        data[TOKEN_KEY] = state.token.encode()
        data[PHASE_KEY] = state.phase.value.encode()
    return data


def stale_keys(secret: Mapping[str, Any] | None, data: Mapping[str, bytes]) -> tuple[str, ...]:
    """The replacement's keys ``secret`` holds that ``data`` does not (the new CA, once it is the CA)."""
    held = (secret or {}).get("data") or {}
    return tuple(key for key in REPLACEMENT_KEYS if key in held and key not in data)


def event_reason(phase: ReplacementPhase) -> str:
    """The Normal event of a transition into ``phase``: ``CAReplacementTrusting`` and so on."""
    return f"CAReplacement{phase.value}"


def _shown(token: str) -> str:
    return token if len(token) <= 64 else token[:61] + "..."


NONE_REPORTED: Final = (
    " (no broker has reported a trust bundle: a broker reports it in the X-Broker-Trust-Bundle header of "
    "its admin port's TLS replies, so one that does not serve TLS, or runs an image older than the "
    "operator, never does)"
)


def status_of(
    step: ReplacementStep, *, namespace: str, cluster: str, confirmed: bool, reported_any: bool = True
) -> dict[str, str] | None:
    """``status.tls.caReplacement`` after ``step``; None when no replacement was ever asked for.
    ``reported_any``: some broker named the bundle it trusts (otherwise a wait on loading says why
    none may ever)."""
    state = step.state
    if state.token is None:
        return None
    token = state.token[:MAX_TOKEN_CHARS]
    if step.transition is not None:
        message = step.transition
    elif state.phase is ReplacementPhase.DONE:
        message = (
            f"CA key replacement {_shown(state.token)!r} is done; set the annotation "
            f"{ANNOTATION_REPLACE_CA_KEY} to a new value to replace the key again"
        )
    else:
        message = step.waiting_for or f"phase {state.phase.value}"
        if not reported_any and "to load trust bundle" in message:
            message += NONE_REPORTED
    if state.phase is ReplacementPhase.TRUSTING and not confirmed:
        command = shlex.join(
            [
                "kubectl", "annotate", "--overwrite", "-n", namespace, f"brokercluster/{cluster}",
                f"{ANNOTATION_REPLACE_CA_KEY_TRUSTED}={state.token}",
            ]
        )  # fmt: skip
        message += (
            f". Import the new CA into SAP STRUST (and the PI/PO TrustedCAs view, and every other client "
            f"outside the cluster): `kubectl broker ca {cluster} -n {namespace}` prints both CAs. "
            f"Then confirm: {command}"
        )
    return {"token": token, "phase": state.phase.value, "message": message}
