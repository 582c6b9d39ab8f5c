"""The broker's two bearer credentials, re-read when their mounted Secret files change.

Kubernetes updates a Secret volume in place: the kubelet writes the new keys into a fresh
timestamped directory and swaps the volume's ``..data`` symlink to it in one rename, so the
path the broker was given (``<mount>/token -> ..data/token``) names a new file from one instant
to the next. A credential read once at start would keep the old value until a restart, and a
restart of the active broker is a failover. So each credential here:

- remembers the ``stat`` of its path (device, inode, size, mtime, following the symlinks) and
  compares it at most every ``check_seconds`` on the request path, and at once when a presented
  credential matches nothing (the caller may already hold the new one). A stat is a syscall of
  a microsecond; the file is read only when the stat changed, never per request;
- on a change, keeps the value it replaces as *previous* and accepts it for ``grace_seconds``
  more. The operator learns of a rotation on its own schedule (its Secret re-read), not at the
  instant the kubelet swapped this pod's files, and a heartbeat refused in that gap would count
  as a failed heartbeat; the window closes that gap. After it the old value is refused.

Comparisons stay constant-time (``hmac.compare_digest``) for every value compared. A change that
cannot be used (file missing or unreadable mid-update, empty, or equal to the other role's
credential) is logged and ignored: the broker keeps the credential it has rather than lock out
its operator.

Not here: which operation needs which role (``server.py``) and the settings themselves
(``settings.py``). A credential given as an environment value (``BROKER_TOKEN``) has no file and
never changes.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from broker_service.settings import BrokerSettings

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
_Signature = tuple[int, int, int, int]


class Role(enum.Enum):
    """Who presented a credential: the operator or the backend (they hold different ones)."""

    OPERATOR = "operator"
    BACKEND = "backend"


def _signature(path: Path) -> _Signature | None:
    try:
        stat = os.stat(path)  # follows ..data and the key's symlink to the file itself
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


class RotatingCredential:
    """One role's credential: the current value, and the previous one while its grace lasts."""

    def __init__(
        self,
        role: Role,
        value: str,
        path: Path | None,
        *,
        grace_seconds: float,
        check_seconds: float,
        clock: Clock = time.monotonic,
    ) -> None:
        self.role = role
        self.path = path
        self.current = value.encode()
        self.previous: bytes | None = None
        self.previous_until = 0.0
        self.grace_seconds = grace_seconds
        self.check_seconds = check_seconds
        self._signature: _Signature | None = None
        self._next_check = 0.0
        self._previous_used = False
        # Set by BrokerCredentials: a value this credential must not take (the other role's).
        self.conflicts_with: Callable[[bytes], bool] = lambda value: False
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
        try:
            value = self.path.read_text(encoding="utf-8").strip().encode()
        except (OSError, UnicodeDecodeError) as error:
            logger.warning(
                "the %s credential file %s cannot be read (%s); keeping the current one",
                self.role.value,
                self.path,
                error,
            )
            return False
        if not value or value == self.current:
            if not value:
                logger.warning(
                    "the %s credential file %s is empty; keeping the current one", self.role.value, self.path
                )
            return False
        if self.conflicts_with(value):
            logger.error(
                "the %s credential file %s now holds the other role's credential; refused, keeping the "
                "current one: give each role a credential of its own",
                self.role.value,
                self.path,
            )
            return False
        self.previous, self.current = self.current, value
        self.previous_until = now + self.grace_seconds
        self._previous_used = False
        logger.info(
            "the %s credential changed (%s); the previous one is accepted for %gs more",
            self.role.value,
            self.path,
            self.grace_seconds,
        )
        return True

    def matches(self, given: bytes, now: float) -> bool:
        """Whether ``given`` is the current value, or the previous one within its grace window."""
        if hmac.compare_digest(given, self.current):
            return True
        if self.previous is None:
            return False
        if now >= self.previous_until:
            self.previous = None  # the window has closed: the old value opens nothing any more
            return False
        if hmac.compare_digest(given, self.previous):
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
    """The backend's and the operator's credentials, with the rotation rules above."""

    def __init__(self, backend: RotatingCredential, operator: RotatingCredential, clock: Clock) -> None:
        self.backend = backend
        self.operator = operator
        self._clock = clock
        backend.conflicts_with = lambda value: hmac.compare_digest(value, operator.current)
        operator.conflicts_with = lambda value: hmac.compare_digest(value, backend.current)

    @classmethod
    def from_settings(cls, settings: BrokerSettings, clock: Clock = time.monotonic) -> BrokerCredentials:
        def credential(role: Role, value: str, path: Path | None) -> RotatingCredential:
            return RotatingCredential(
                role,
                value,
                path,
                grace_seconds=settings.token_grace_seconds,
                check_seconds=settings.token_check_seconds,
                clock=clock,
            )

        return cls(
            credential(Role.BACKEND, settings.backend_token, settings.backend_token_file),
            credential(Role.OPERATOR, settings.token, settings.token_file),
            clock,
        )

    def _match(self, given: bytes, now: float) -> Role | None:
        # The backend's first: it is the hot path (SendMessages).
        if self.backend.matches(given, now):
            return Role.BACKEND
        if self.operator.matches(given, now):
            return Role.OPERATOR
        return None

    def role_of(self, given: bytes) -> Role | None:
        """The role whose credential ``given`` is; None if it is neither (after a forced re-check)."""
        now = self._clock()
        self.backend.refresh(now)
        self.operator.refresh(now)
        role = self._match(given, now)
        if role is None:
            # The caller may hold a value written a moment ago: look at the files now.
            changed = self.backend.refresh(now, force=True) | self.operator.refresh(now, force=True)
            if changed:
                role = self._match(given, now)
        return role
