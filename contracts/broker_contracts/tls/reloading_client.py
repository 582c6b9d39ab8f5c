"""A client's TLS context that follows its mounted files: new trust with no restart.

Two clients verify servers against a mounted bundle: the broker calls the backend and the cloud
over ``https://`` against ``--upstream-ca-file``, and the backend simulator (SAP's stand-in)
calls brokers against ``--broker-ca-file``, presenting ``--client-cert-file``. While a CA's key
is replaced the bundle gains the new CA before any server presents a certificate of it, then the
servers' certificates are reissued; a client that read its bundle once, at start, refuses the
reissued certificates until it is restarted, and a restarted broker is a failover.

How it follows them is :class:`~broker_contracts.tls.reloading.ReloadingFiles`, shared with the
listeners' :class:`~broker_contracts.tls.reloading.ReloadingServerContext`: every :meth:`check`
reads and hashes the files, builds a fresh context (:func:`broker_contracts.tls.client_context`:
the TLS 1.2 floor every channel shares), hashes them again, and swaps only a context that loaded
whole from files that did not change meanwhile; files that do not load keep the current context
and are a warning, once per problem. A context is never changed once built.

A client has no handshake callback to swap contexts in (the server's ``sni_callback``): the
context is picked when a connection is opened. So a caller takes :attr:`current` for every request
(aiohttp: ``ssl=`` per request), new connections use the newest trust, and connections already
open (kept alive, or in use) go on with the one they were made with.

:attr:`trust_bundle_version` (of ``ca_file``, :mod:`broker_contracts.tls.bundle`) and
:attr:`certificate_serial` (of ``cert_file``) say what new connections use, for logs; without any
file the context trusts the system's store, and :meth:`check` never replaces it.

Not here: how often to check (the caller's loop), metrics.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import NamedTuple

from broker_contracts.tls.bundle import BundleVersionError, bundle_version
from broker_contracts.tls.contexts import client_context
from broker_contracts.tls.reloading import ReloadingFiles, TlsFilesError
from broker_contracts.tls.serial import CertificateSerialError, certificate_serial

logger = logging.getLogger(__name__)


class _Calling(NamedTuple):
    context: ssl.SSLContext
    trust_bundle_version: str | None  # of ca_file; None: the system's store
    certificate_serial: str | None  # of cert_file; None: no client certificate


class ReloadingClientContext(ReloadingFiles[_Calling]):
    """A client's context, :attr:`current` per request: the newest that loaded from the files."""

    _logger = logger

    def __init__(
        self,
        name: str,
        *,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
    ) -> None:
        """Build the first context or raise :class:`TlsFilesError` naming the file: a client that
        could verify nothing is an error at start, not a warning."""
        if (cert_file is None) != (key_file is None):
            raise ValueError("a client certificate needs both its certificate file and its key file")
        self._ca_file = ca_file
        self._cert_file = cert_file
        self._key_file = key_file
        # The certificate and its key first: a "key values mismatch" names those two.
        super().__init__(name, [path for path in (cert_file, key_file, ca_file) if path is not None])

    @property
    def current(self) -> ssl.SSLContext:
        """The context for a new connection; read it per request, never keep it."""
        return self._loaded.context

    @property
    def trust_bundle_version(self) -> str | None:
        return self._loaded.trust_bundle_version

    @property
    def certificate_serial(self) -> str | None:
        return self._loaded.certificate_serial

    def _make(self, contents: dict[Path, bytes]) -> _Calling:
        trusted: str | None = None
        serial: str | None = None
        try:
            if self._ca_file is not None:
                trusted = bundle_version(contents[self._ca_file])
            if self._cert_file is not None:
                serial = certificate_serial(contents[self._cert_file].decode("ascii", errors="replace"))
        except BundleVersionError as error:
            raise TlsFilesError(f"{self._ca_file}: {error}") from None
        except CertificateSerialError as error:
            raise TlsFilesError(
                f"{self._cert_file}: the certificate's serial cannot be read: {error}"
            ) from None
        context = client_context(ca_file=self._ca_file, cert_file=self._cert_file, key_file=self._key_file)
        return _Calling(context, trusted, serial)

    @staticmethod
    def _describe(loaded: _Calling) -> str:
        trust = (
            "the system's trust store"
            if loaded.trust_bundle_version is None
            else f"CA bundle {loaded.trust_bundle_version}"
        )
        if loaded.certificate_serial is None:
            return trust
        return f"{trust}, client certificate serial {loaded.certificate_serial}"

    def _swapped(self, previous: _Calling) -> None:
        self._logger.info(
            "%s: new connections verify with %s (was %s)",
            self.name,
            self._describe(self._loaded),
            self._describe(previous),
        )

    def _keeping(self) -> str:
        return f"new connections still verify with {self._describe(self._loaded)}"
