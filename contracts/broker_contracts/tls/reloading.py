"""A server's TLS context that follows its mounted files: rotated certificates with no restart.

A restart of the active broker is a failover, so a renewed certificate, or a trust bundle that
gained a CA, must reach a running listener. How it reaches it is the point of this module:

* **Never reload a live context.** ``load_cert_chain`` on the ``SSLContext`` a server is using
  tore handshakes on this machine: the new certificate went out with the old key and every new
  handshake failed while keep-alive connections went on (DAY2_FACTS.md). A context here is built
  once and never changed.
* **Swap at the handshake.** The listener is given one context, :attr:`context` (the first one
  built). Its ``sni_callback`` runs early in every handshake (with or without SNI from the
  client) and points the connection at the newest complete context
  (``ssl_object.context = current``). From then on the handshake uses that context's certificate,
  key and trust store. What stays the listener context's: the protocol floor, the ciphers and
  whether a client certificate is asked for, which OpenSSL copies into each connection when it
  is created; so every context here comes from the same ``build`` and those never differ. A
  connection already open keeps the certificate it was made with.
* **Swap only what loaded.** The files are read and hashed (SHA-256 of their contents, not their
  mtimes: the kubelet updates a Secret volume by swapping its ``..data`` symlink, and a copy can
  keep an mtime), a new context is built from them, and the files are hashed again: only if the
  two hashes agree, and the certificate's serial can be read, is the new context swapped in.
  Otherwise the current one stays. A file that does not load (half-written, garbage, a key that
  is not the certificate's, a bundle without a CA) is a warning, logged once per distinct
  problem, and tried again only when the files change again; files that changed while they were
  being loaded are simply read again at the next check.
* **Bounded work.** :meth:`check` reads each file up to :data:`MAX_FILE_BYTES` and builds at most
  one context. Its caller runs it every few seconds (the broker: ``--tls-reload-seconds``, on its
  event loop: a context of a few certificates builds in well under a millisecond, and Secret
  volumes are tmpfs); no thread, no asyncio here.

:attr:`serial` is the serial of the certificate new connections are served (``tls.crt``'s first
block, :mod:`broker_contracts.tls.serial`), for logs and metrics; :attr:`reloads` and
:attr:`failures` count swaps and contents that did not load. With a ``trust_file`` (the admin
port's ``ca.crt``), :attr:`trust_bundle_version` names the trust bundle of the context new
handshakes use (:mod:`broker_contracts.tls.bundle`), computed from the very bytes that context was
built from and swapped with it: what the operator waits on before it issues certificates of a new
CA or drops an old one.

The reading, hashing, loading, swapping and warning are :class:`ReloadingFiles`, which the
client side shares (:mod:`broker_contracts.tls.reloading_client`: a client has no handshake
callback to swap in, so its callers take the newest context per request instead).

Not here: which files, which trust, which verification (the caller's ``build``).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Generic, NamedTuple, TypeVar

from broker_contracts.tls.bundle import BundleVersionError, bundle_version
from broker_contracts.tls.serial import CertificateSerialError, certificate_serial

logger = logging.getLogger(__name__)

MAX_FILE_BYTES: Final = 1024 * 1024  # a certificate bundle of thousands of CAs is still far below


class TlsFilesError(ValueError):
    """The files cannot be served; the text names the file and why (never its contents)."""


def _read_files(files: Sequence[Path]) -> tuple[bytes, dict[Path, bytes]]:
    """``(SHA-256 over every file's name and contents, the contents)``, or :class:`TlsFilesError`
    when one cannot be read whole."""
    digest = hashlib.sha256()
    contents: dict[Path, bytes] = {}
    for path in files:
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as error:
            raise TlsFilesError(f"{path} cannot be read: {error.strerror or error}") from None
        if len(data) > MAX_FILE_BYTES:
            raise TlsFilesError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        digest.update(str(path).encode() + b"\0" + len(data).to_bytes(8, "big") + data)
        contents[path] = data
    return digest.digest(), contents


def _check_pem(contents: dict[Path, bytes]) -> None:
    """Every file holds whole PEM blocks: what a half-written or foreign file most often lacks,
    named here rather than as OpenSSL's ``PEM lib``."""
    for path, data in contents.items():
        begins, ends = data.count(b"-----BEGIN "), data.count(b"-----END ")
        if begins == 0 or begins != ends or data.rfind(b"-----END ") < data.rfind(b"-----BEGIN "):
            raise TlsFilesError(f"{path} does not hold whole PEM blocks (half-written, or not PEM)")


Loaded = TypeVar("Loaded")


class ReloadingFiles(Generic[Loaded]):
    """The part every context that follows its files shares, server or client: read, hash, load,
    hash again, swap or keep, count, and warn once per problem (the module's docstring).

    A subclass says what it makes of the files (:meth:`_make`, called with their contents after
    their PEM was checked; it may raise ``ssl.SSLError``, ``OSError`` or :class:`TlsFilesError`),
    what it logs when it swaps (:meth:`_swapped`) and what it keeps when it does not
    (:meth:`_keeping`). What it made is :attr:`_loaded`, replaced whole and never changed.
    """

    _logger = logger  # a subclass in another module logs under that module's name

    def __init__(self, name: str, files: Sequence[Path]) -> None:
        """Make the first one from ``files`` or raise :class:`TlsFilesError`: at start, files that do
        not load are an error, not a warning. ``files``: a certificate and its key first, if any
        (an OpenSSL "key values mismatch" names those two)."""
        self.name = name  # who uses them, in log lines ("main port 8080", "upstream")
        self._files = tuple(files)
        fingerprint, contents = _read_files(self._files)
        self._loaded: Loaded = self._load(contents)
        self._seen = fingerprint
        self._problem: tuple[bytes | None, str] | None = None
        self.reloads = 0
        self.failures = 0

    def _make(self, contents: dict[Path, bytes]) -> Loaded:
        raise NotImplementedError

    def _swapped(self, previous: Loaded) -> None:
        """Log what new connections use now, after :attr:`_loaded` replaced ``previous``."""
        raise NotImplementedError

    def _keeping(self) -> str:
        """What stays in use when changed files do not load, for the warning."""
        raise NotImplementedError

    def _load(self, contents: dict[Path, bytes]) -> Loaded:
        """What the files make, or :class:`TlsFilesError` naming the file and why."""
        try:
            _check_pem(contents)
            return self._make(contents)
        except ssl.SSLError as error:
            raise TlsFilesError(_describe_ssl(error, self._files)) from None
        except OSError as error:
            raise TlsFilesError(
                f"{error.filename or 'a file'} cannot be read: {error.strerror or error}"
            ) from None

    def check(self) -> bool:
        """Read the files once; if they changed and load, new connections use them. True if swapped."""
        try:
            fingerprint, contents = _read_files(self._files)
        except TlsFilesError as error:
            self._report(None, str(error))
            return False
        if fingerprint == self._seen:
            return False
        outcome: Loaded | TlsFilesError
        try:
            outcome = self._load(contents)
        except TlsFilesError as error:
            outcome = error
        try:
            after, _ = _read_files(self._files)
        except TlsFilesError as error:
            self._report(None, str(error))
            return False
        if after != fingerprint:
            return False  # changed while it was loading: the next check reads it afresh
        self._seen = fingerprint  # loaded, or never to be tried again until it changes
        if isinstance(outcome, TlsFilesError):
            self.failures += 1
            self._report(fingerprint, str(outcome))
            return False
        previous, self._loaded = self._loaded, outcome
        self._problem = None
        self.reloads += 1
        self._swapped(previous)
        return True

    def _report(self, fingerprint: bytes | None, problem: str) -> None:
        """Warn once per problem: per content that does not load, per reason a file cannot be read."""
        if (fingerprint, problem) == self._problem:
            return
        self._problem = (fingerprint, problem)
        self._logger.warning(
            "%s: the TLS files cannot be loaded (%s); %s. Fix or replace them (the whole Secret, as "
            "the kubelet does); they are read again every check",
            self.name,
            problem,
            self._keeping(),
        )


class _Served(NamedTuple):
    context: ssl.SSLContext
    serial: str  # of the certificate it serves
    trust_bundle_version: str | None  # of the trust_file it was built with; None without one


class ReloadingServerContext(ReloadingFiles[_Served]):
    """The TLS context of one listener: :attr:`context` for the server, the newest one per handshake."""

    def __init__(
        self,
        name: str,
        build: Callable[[], ssl.SSLContext],
        files: Sequence[Path],
        cert_file: Path,
        trust_file: Path | None = None,
    ) -> None:
        """Build the first context from ``files`` (``cert_file`` and ``trust_file`` among them) or
        raise :class:`TlsFilesError`: at start a listener that cannot serve is an error, not a warning."""
        self._build = build
        self._cert_file = cert_file
        if trust_file is not None and trust_file not in files:
            raise ValueError(f"trust_file {trust_file} must be one of the files the context is built from")
        self._trust_file = trust_file
        super().__init__(name, files)
        self.context: Final = self._loaded.context
        self.context.sni_callback = self._serve_current

    @property
    def serial(self) -> str:
        """The serial of the certificate new connections are served."""
        return self._loaded.serial

    @property
    def trust_bundle_version(self) -> str | None:
        """The version of the ``trust_file`` bundle new handshakes verify clients by (None without one)."""
        return self._loaded.trust_bundle_version

    def _serve_current(self, ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        """The handshake's ``sni_callback``: the connection takes the newest complete context."""
        current = self._loaded.context
        if ssl_object.context is not current:
            ssl_object.context = current

    def _make(self, contents: dict[Path, bytes]) -> _Served:
        """A context from the files, the serial it serves and the version of the bundle it trusts."""
        try:
            serial = certificate_serial(contents[self._cert_file].decode("ascii", errors="replace"))
            trusted = None
            if self._trust_file is not None:
                trusted = bundle_version(contents[self._trust_file])
        except BundleVersionError as error:
            raise TlsFilesError(f"{self._trust_file}: {error}") from None
        except CertificateSerialError as error:
            raise TlsFilesError(
                f"{self._cert_file}: the certificate's serial cannot be read: {error}"
            ) from None
        return _Served(self._build(), serial, trusted)

    def _swapped(self, previous: _Served) -> None:
        logger.info(
            "%s: serving certificate serial %s (was %s) to new connections",
            self.name,
            self.serial,
            previous.serial,
        )
        if self.trust_bundle_version != previous.trust_bundle_version:
            logger.info(
                "%s: new connections trust CA bundle %s (was %s)",
                self.name,
                self.trust_bundle_version,
                previous.trust_bundle_version,
            )

    def _keeping(self) -> str:
        return f"still serving certificate serial {self.serial}"


def _describe_ssl(error: ssl.SSLError, files: Sequence[Path]) -> str:
    """OpenSSL's complaint as one line, in words where it is a common one."""
    # Only OpenSSL's own errors have a reason: one raised in Python (contexts.py: "holds no CA
    # certificate") has no such attribute at all, and its str() is the repr of its args.
    reason = getattr(error, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return f"the key is not the certificate's (of {', '.join(str(path) for path in files[:2])})"
    detail = reason or (str(error.args[0]) if len(error.args) == 1 else str(error))
    return f"OpenSSL refused {', '.join(str(path) for path in files)}: {detail}"
