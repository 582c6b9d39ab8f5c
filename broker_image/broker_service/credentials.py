"""The broker's two credential verifiers, re-read when their mounted Secret files change.

A broker holds no bearer token: for each role (the operator, the backend) it holds a *verifier*,
the SHA-256 of the token (``broker_contracts.token_verifier``), and takes a caller for that role
when the digest of the presented value equals it. So a compromised broker, or anyone who reads
its files, environment or memory, learns nothing that opens a call on its peers: the operator
keeps the tokens, and writes only their verifiers into the Secret the brokers mount.

Kubernetes updates a Secret volume in place: the kubelet writes the new keys into a fresh
timestamped directory and swaps the volume's ``..data`` symlink to it in one rename, so the
path the broker was given (``<mount>/token.sha256 -> ..data/token.sha256``) names a new file from
one instant to the next. A verifier read once at start would keep the old value until a restart,
and a restart of the active broker is a failover. So each verifier here:

- remembers the ``stat`` of its path (device, inode, size, mtime, following the symlinks) and
  compares it at most every ``check_seconds`` on the request path, and at once when a presented
  credential matches nothing (the caller may already hold the new one). A stat is a syscall of
  a microsecond; the file is read only when the stat changed, never per request;
- on a change, keeps the verifier it replaces as *previous* and accepts its token for
  ``grace_seconds`` more. The operator learns of a rotation on its own schedule (its Secret
  re-read), not at the instant the kubelet swapped this pod's files, and a heartbeat refused in
  that gap would count as a failed heartbeat; the window closes that gap. After it the old token
  is refused.

A presented value is hashed once per request and the digests are compared in constant time
(``hmac.compare_digest``). A change that cannot be used (file missing or unreadable mid-update,
empty, not a verifier, or equal to the other role's verifier) is logged (never its content) and
ignored: the broker keeps the verifier it has rather than lock out its operator.

Every refusal is counted (``broker_auth_failures_total`` by the role the call needed and the
reason) and logged with the peer's address and the operation, at most once per
:data:`AUTH_LOG_WINDOW_SECONDS` (:class:`AuthFailureLog`), so that a caller hammering a broker with
guesses neither goes unnoticed nor floods the log. The presented value is never logged or counted.

Not here: which operation needs which role (``server.py``) and the settings themselves
(``settings.py``). A verifier given as an environment value (``BROKER_TOKEN_VERIFIER``) has no
file and never changes.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Counter

from broker_contracts.token_verifier import VerifierError, parse_verifier, token_digest
from broker_service.settings import BrokerSettings

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
_Signature = tuple[int, int, int, int]
AUTH_LOG_WINDOW_SECONDS = 60.0  # at most one warning about refused credentials per window


class Role(enum.Enum):
    """Who presented a credential: the operator or the backend (they hold different ones)."""

    OPERATOR = "operator"
    BACKEND = "backend"


class AuthFailure(enum.Enum):
    """Why a call was refused, as counted and logged (never with the presented value)."""

    MISSING = "missing"  # no ``Authorization: Bearer`` value at all
    UNKNOWN = "unknown"  # a value that matches neither role's verifier
    WRONG_ROLE = "wrong_role"  # the other role's valid credential, for an operation not its own
    # --allowed-client-subjects (client_certificates.py): the connection presented no client
    # certificate, or one whose subject is not listed.
    NO_CLIENT_CERTIFICATE = "no_client_certificate"
    CLIENT_SUBJECT_NOT_ALLOWED = "client_subject_not_allowed"


class AuthFailureLog:
    """Counts every refused call and logs a warning about them at most once per window.

    The count is exact (the metric); the log is bounded (one line per window, saying how many
    refusals it stands for), because an unauthenticated caller decides how many there are.
    """

    def __init__(
        self,
        counter: Counter | None = None,
        *,
        window_seconds: float = AUTH_LOG_WINDOW_SECONDS,
        clock: Clock = time.monotonic,
    ) -> None:
        self._counter = counter
        self._window = window_seconds
        self._clock = clock
        self._next_log = float("-inf")
        self._unlogged = 0

    def record(self, needed: str, reason: AuthFailure, peer: str | None, operation: str) -> None:
        """One refused call: ``needed`` is the role the call needed (``operator``, ``backend``, or
        ``any`` before the operation is known), ``operation`` what was asked (method and path, or
        the SOAP operation), ``peer`` the caller's address."""
        if self._counter is not None:
            self._counter.labels(role=needed, reason=reason.value).inc()
        self._unlogged += 1
        now = self._clock()
        if now < self._next_log:
            return
        self._next_log = now + self._window
        logger.warning(
            "refused %s from %s: %s credential (needs the %s credential); %d refusal(s) since the last "
            "such warning, the next at most %gs from now (broker_auth_failures_total counts them all)",
            operation,
            peer or "an unknown peer",
            reason.value.replace("_", " "),
            needed,
            self._unlogged,
            self._window,
        )
        self._unlogged = 0


def _signature(path: Path) -> _Signature | None:
    try:
        stat = os.stat(path)  # follows ..data and the key's symlink to the file itself
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


class RotatingCredential:
    """One role's verifier: the current digest, and the previous one while its grace lasts."""

    def __init__(
        self,
        role: Role,
        verifier: str,
        path: Path | None,
        *,
        grace_seconds: float,
        check_seconds: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self.role = role
        self.path = path
        self.current = parse_verifier(verifier)  # the settings checked it; a digest, never a token
        self.previous: bytes | None = None
        self.previous_until = 0.0
        self.grace_seconds = grace_seconds
        self.check_seconds = check_seconds
        self._signature: _Signature | None = None
        self._next_check = 0.0
        self._previous_used = False
        # Set by BrokerCredentials: a digest this credential must not take (the other role's).
        self.conflicts_with: Callable[[bytes], bool] = lambda digest: False
        # Read once more now: the file may have changed since the settings read it.
        self.refresh(clock(), force=True)

    def refresh(self, now: float, *, force: bool = False) -> bool:
        """Re-read the file if its stat changed (at most every ``check_seconds`` unless ``force``)."""
        if self.path is None or (not force and now < self._next_check):
            return False
        self._next_check = now + self.check_seconds
        signature = _signature(self.path)
        if signature is None or signature == self._signature:
            return False
        self._signature = signature
        digest = self._read(self.path)
        if digest is None:
            return False
        if digest == self.current:
            return False
        if self.conflicts_with(digest):
            logger.error(
                "the %s verifier file %s now holds the other role's verifier; refused, keeping the "
                "current one: give each role a token of its own",
                self.role.value,
                self.path,
            )
            return False
        self.previous, self.current = self.current, digest
        self.previous_until = now + self.grace_seconds
        self._previous_used = False
        logger.info(
            "the %s verifier changed (%s); the previous token is accepted for %gs more",
            self.role.value,
            self.path,
            self.grace_seconds,
        )
        return True

    def _read(self, path: Path) -> bytes | None:
        """The digest the file names now; None (logged, never its content) if it names none."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            logger.warning(
                "the %s verifier file %s cannot be read (%s); keeping the current one",
                self.role.value,
                path,
                error,
            )
            return None
        if not text.strip():
            logger.warning("the %s verifier file %s is empty; keeping the current one", self.role.value, path)
            return None
        try:
            return parse_verifier(text)
        except VerifierError as error:  # its message never holds the text (it may be a token)
            logger.error("the %s verifier file %s: %s; keeping the current one", self.role.value, path, error)
            return None

    def matches(self, digest: bytes, now: float) -> bool:
        """Whether ``digest`` (of a presented token) is the current verifier's, or the previous
        one's within its grace window."""
        if hmac.compare_digest(digest, self.current):
            return True
        if self.previous is None:
            return False
        if now >= self.previous_until:
            self.previous = None  # the window has closed: the old token opens nothing any more
            return False
        if hmac.compare_digest(digest, self.previous):
            if not self._previous_used:
                self._previous_used = True
                logger.info(
                    "accepted the previous %s credential (rotation in progress, %.1fs of grace left)",
                    self.role.value,
                    self.previous_until - now,
                )
            return True
        return False


class BrokerCredentials:
    """The backend's and the operator's verifiers, with the rotation rules above, and the log of
    the calls they refused."""

    def __init__(
        self,
        backend: RotatingCredential,
        operator: RotatingCredential,
        clock: Clock,
        failures: AuthFailureLog | None = None,
    ) -> None:
        self.backend = backend
        self.operator = operator
        self.failures = failures or AuthFailureLog(clock=clock)
        self._clock = clock
        backend.conflicts_with = lambda digest: hmac.compare_digest(digest, operator.current)
        operator.conflicts_with = lambda digest: hmac.compare_digest(digest, backend.current)

    @classmethod
    def from_settings(
        cls, settings: BrokerSettings, clock: Clock = time.monotonic, failures: AuthFailureLog | None = None
    ) -> BrokerCredentials:
        def credential(role: Role, verifier: str, path: Path | None) -> RotatingCredential:
            return RotatingCredential(
                role,
                verifier,
                path,
                grace_seconds=settings.token_grace_seconds,
                check_seconds=settings.token_check_seconds,
                clock=clock,
            )

        return cls(
            credential(Role.BACKEND, settings.backend_token_verifier, settings.backend_token_verifier_file),
            credential(Role.OPERATOR, settings.token_verifier, settings.token_verifier_file),
            clock,
            failures,
        )

    def _match(self, digest: bytes, now: float) -> Role | None:
        # The backend's first: it is the hot path (SendMessages).
        if self.backend.matches(digest, now):
            return Role.BACKEND
        if self.operator.matches(digest, now):
            return Role.OPERATOR
        return None

    def role_of(self, given: bytes) -> Role | None:
        """The role whose token ``given`` is; None if it is neither (after a forced re-check)."""
        now = self._clock()
        self.backend.refresh(now)
        self.operator.refresh(now)
        digest = token_digest(given)
        role = self._match(digest, now)
        if role is None:
            # The caller may hold a token whose verifier was written a moment ago: look at the files now.
            changed = self.backend.refresh(now, force=True) | self.operator.refresh(now, force=True)
            if changed:
                role = self._match(digest, now)
        return role
