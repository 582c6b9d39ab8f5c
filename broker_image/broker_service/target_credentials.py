"""What the broker presents to the backend and the cloud, and the URL it calls them at.

A target's credential comes from one of two places:

* a directory holding a mounted Secret's keys (``--backend-credentials-dir`` /
  ``--cloud-credentials-dir``; the operator mounts ``spec.backend.credentialsSecretRef`` there):
  a ``token`` key is sent as ``Authorization: Bearer <token>``; else ``username`` and ``password``
  (the keys of a ``kubernetes.io/basic-auth`` Secret) are sent as HTTP Basic. This is the way
  docs/crd.md recommends: the credential never sits in a URL, so no URL the broker prints can
  carry it.
* the URL's userinfo (``https://user:password@host/...``), still honoured as HTTP Basic, as
  aiohttp did with it before, but discouraged. The userinfo is taken out of the URL the broker
  calls, so no library's exception can repeat it.

Both at once is refused (:class:`TargetCredentialError`): which one the target gets would
otherwise be a guess. A query in the URL (``?sig=...``, the shape of SAS-style tokens) is kept on
every call and counted among the secrets.

Every value here (token, username, password, the Basic credential they make, query values) is in
:attr:`RelayTarget.secrets`, which the relay client hands to :func:`broker_contracts.redact.redact`
with every error text it produces. A Secret rotated in place is read again: the directory is
looked at no more often than every ``check_seconds``, and the replaced values stay among the
secrets, so an error still in flight with the old value is masked too.

Not here: sending anything (``relay_client.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from yarl import URL

from broker_contracts.redact import basic_credential, redact_url

TOKEN_KEY: Final = "token"
USERNAME_KEY: Final = "username"
PASSWORD_KEY: Final = "password"
_MAX_CREDENTIAL_BYTES: Final = 16 * 1024  # a credential file larger than this is not a credential


class TargetCredentialError(ValueError):
    """A target's URL or credential that cannot be used; the text names the setting (never a value)."""


def _read_key(directory: Path, key: str) -> str | None:
    path = directory / key
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_CREDENTIAL_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise TargetCredentialError(f"{path} cannot be read: {error.strerror}") from None
    if len(data) > _MAX_CREDENTIAL_BYTES:
        raise TargetCredentialError(f"{path} is larger than {_MAX_CREDENTIAL_BYTES} bytes")
    try:
        return data.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        raise TargetCredentialError(f"{path} is not UTF-8 text") from None


def _authorization_from_dir(directory: Path, flag: str) -> tuple[str, tuple[str, ...]]:
    """``(Authorization value, its secrets)`` from a mounted Secret's keys."""
    token = _read_key(directory, TOKEN_KEY)
    if token is not None:
        return f"Bearer {token}", (token,)
    username, password = _read_key(directory, USERNAME_KEY), _read_key(directory, PASSWORD_KEY)
    if username is None or password is None:
        raise TargetCredentialError(
            f"{flag} = {str(directory)!r} holds neither a '{TOKEN_KEY}' key nor both '{USERNAME_KEY}' "
            f"and '{PASSWORD_KEY}'"
        )
    basic = basic_credential(username, password)
    return f"Basic {basic}", (username, password, basic)


@dataclass
class RelayTarget:
    """One target as the relay client calls it. ``url`` has no userinfo; ``display`` is the
    redacted URL for messages; ``authorization`` is the header value to send, if any."""

    name: str
    url: URL
    display: str
    credentials_dir: Path | None = None
    credentials_flag: str = ""
    check_seconds: float = 1.0
    authorization: str | None = None
    secrets: tuple[str, ...] = ()
    _checked: float = field(default=0.0, repr=False)
    _stamp: tuple[int, ...] = field(default=(), repr=False)

    @property
    def configured(self) -> bool:
        return self.url.scheme in ("http", "https") and bool(self.url.host)

    def call_url(self, path: str, query: dict[str, str] | None = None) -> URL:
        """The target's URL with ``path`` appended under its own path, its query kept."""
        base = self.url
        url = base.with_path(base.path.rstrip("/") + path).with_query(base.query)
        return url.update_query(query) if query else url

    def display_of(self, path: str) -> str:
        return self.display.split("?", 1)[0].rstrip("/") + path

    def current_authorization(self) -> str | None:
        """The header value, re-read from the credentials directory when its files changed."""
        if self.credentials_dir is None:
            return self.authorization
        now = time.monotonic()
        if now - self._checked >= self.check_seconds:
            self._checked = now
            stamp = _stamp(self.credentials_dir)
            if stamp != self._stamp:
                authorization, secrets = _authorization_from_dir(self.credentials_dir, self.credentials_flag)
                self.authorization = authorization
                self.secrets = tuple(dict.fromkeys((*secrets, *self.secrets)))  # the old ones too
                self._stamp = stamp
        return self.authorization


def _stamp(directory: Path) -> tuple[int, ...]:
    """What changes when a mounted Secret is updated (the kubelet swaps a symlink) or a file is."""
    stamps = []
    for entry in (directory, *(directory / key for key in (TOKEN_KEY, USERNAME_KEY, PASSWORD_KEY))):
        try:
            status = entry.stat()
        except OSError:
            stamps.append(-1)
            continue
        stamps += [status.st_mtime_ns, status.st_ino, status.st_size]
    return tuple(stamps)


def relay_target(
    name: str,
    url_text: str,
    credentials_dir: Path | None,
    *,
    flag: str,
    dir_flag: str,
    check_seconds: float = 1.0,
) -> RelayTarget:
    """A target from its URL setting and its credentials directory setting (either may be empty).

    Raises :class:`TargetCredentialError` for a URL with userinfo *and* a credentials directory,
    or an unreadable or incomplete directory; the message names the flags, never a value.
    """
    url = URL(url_text) if url_text else URL()
    secrets: list[str] = [value for _key, value in url.query.items() if value]
    authorization = None
    if url.user is not None or url.password is not None:
        if credentials_dir is not None:
            raise TargetCredentialError(
                f"{flag} carries credentials (user:password@) and {dir_flag} is set too; give the "
                f"credentials once, in {dir_flag} (a Secret's keys), and the URL without them"
            )
        user, password = url.user or "", url.password or ""
        basic = basic_credential(user, password)
        authorization = f"Basic {basic}"
        secrets += [
            value for value in (user, password, url.raw_user or "", url.raw_password or "", basic) if value
        ]
        url = url.with_user(None)
    target = RelayTarget(
        name=name,
        url=url,
        display=redact_url(url_text),
        credentials_dir=credentials_dir,
        credentials_flag=dir_flag,
        check_seconds=check_seconds,
        authorization=authorization,
        secrets=tuple(secrets),
    )
    if credentials_dir is not None:
        target.current_authorization()  # read now: a wrong directory fails at start, not at activation
    return target
