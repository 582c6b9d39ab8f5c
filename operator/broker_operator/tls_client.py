"""The operator's client ``ssl.SSLContext`` for calling brokers over mutual TLS, and when to renew it.

Built from a :class:`~broker_operator.tls_material.ClientTlsMaterial` (the certificates controller
hands one over, and a new one on every rotation) with the conventions of
``broker_contracts.tls.client_context``: TLS 1.2 at least, Python's default ciphers, the server's
chain and name always verified, here against the material's trust bundle only (``cadata``; never
the system's store: a public CA has no say over which broker the operator trusts), and the
operator's client certificate presented.

Why a context is built, never changed: a context in use must not be reloaded in place
(DAY2_FACTS.md, "Reloading a certificate in place is unsafe"), and ``load_verify_locations`` can
only add CAs, never drop one, so trust that shrinks (the last phase of a CA key replacement) needs
a new context anyway. :meth:`TlsClient.update` builds one when the material's ``version`` changes
and keeps the current one otherwise.

Why a context is also rebuilt every ``fresh_handshake_seconds`` (``DEFAULT_FRESH_HANDSHAKE_SECONDS``,
5 minutes) with the same material: heartbeats ride on keep-alive connections (a full mutual-TLS
handshake costs ~4 ms of CPU, a request on an open connection ~0.2 ms; DAY2_FACTS.md), and a
connection that never closes never shows that a broker's listener now serves an expired or
untrusted certificate, or refuses ours. aiohttp keys its connection pool by the request's
``ssl`` object (``ConnectionKey.ssl``, with ``server_hostname``, in ``aiohttp/client_reqrep.py``
of the 3.14 we pin; ``ClientRequest.connection_key`` builds it, and an ``SSLContext`` hashes by
identity), so a request made with a new context never reuses a connection opened with the old
one: it opens a new connection, with a full handshake, and the idle old ones close when the
connector's keep-alive timeout passes. One handshake per broker per period is the price: at 5
minutes and 1 Hz heartbeats, 1 in 300 requests.

Why sooner while a broker serves an old certificate: the controller tells the client which serial
the brokers' Secret holds now (:meth:`TlsClient.expect_serving`). A broker picks a new leaf up for
new connections only, so over a kept-alive connection the operator would see it (``served``) only
at the next fresh handshake, up to 5 minutes later, and a CA key replacement waits on exactly that
before it drops the old CA (an e2e run waited 308 s in phase Reissuing). While a broker handshaken
within the last two periods served another serial, a context is rebuilt every
``CATCH_UP_SECONDS`` (10 s) instead: one handshake per broker per 10 s for as long as the kubelet
and the broker take to serve the new Secret, then back to every 5 minutes. A broker that is gone
ages out of the comparison after two periods.

How the key reaches OpenSSL: ``load_cert_chain`` takes paths only. The certificate and key are
written to an anonymous in-memory file (``memfd_create``, read through ``/proc/self/fd``) where
the platform has one, so the key never touches a disk; elsewhere to a private directory
(``mkdtemp``: mode 0700, files 0600), removed as soon as they are loaded. Nothing of the
material is ever logged or put into an error: errors name the part that failed and OpenSSL's
reason, and ``ClientTlsMaterial``'s repr shows the version only.

Which certificate each broker serves: every handshake made with a context of this module reports
the server's certificate serial (lower-case hex, as ``status.tls.served[]`` holds it) under the
server name it was verified as, through the context's ``sslobject_class`` (a public hook of
``ssl``: asyncio's TLS transport makes its ``SSLObject`` with ``wrap_bio``, so a subclass sees
each handshake complete). That costs nothing per request, and it is exact: aiohttp releases a
small response's connection before the caller can ask which connection it was, so a per-request
look at the connection would see none.

What it does not do: read Secrets (the certificates controller does) or open connections (the
heartbeat client does, with :meth:`TlsClient.context`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from broker_contracts.tls import MINIMUM_VERSION, CertificateSerialError
from broker_contracts.tls.serial import der_serial
from broker_operator.tls_material import ClientTlsMaterial

__all__ = [
    "CATCH_UP_SECONDS",
    "DEFAULT_FRESH_HANDSHAKE_SECONDS",
    "TlsClient",
    "TlsMaterialError",
    "client_ssl_context",
]

logger = logging.getLogger(__name__)

# How often a fresh context (and so a fresh handshake with every broker) is made with unchanged
# material: often enough that a broker's broken listener or expired certificate shows within
# minutes, rarely enough that handshakes stay a rounding error (module docstring).
DEFAULT_FRESH_HANDSHAKE_SECONDS: Final = 300.0
_SERVED_NAMES_MAX: Final = 4096  # a bound on the served-serial record (one entry per broker)
CATCH_UP_SECONDS: Final = 10.0  # how often a context is rebuilt while a broker serves an old serial
MIN_FRESH_HANDSHAKE_SECONDS: Final = 1.0  # a bound against a setting that would handshake every call


class TlsMaterialError(ValueError):
    """The material does not make a client context; the text says which part and why, never its content."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def _private_files(certificate_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths of the certificate and key, readable by this process only, gone when the block ends."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and Path("/proc/self/fd").is_dir():
        descriptors: list[int] = []
        try:
            for name, data in (("operator-client-cert", certificate_pem), ("operator-client-key", key_pem)):
                fd = memfd_create(name, os.MFD_CLOEXEC)
                descriptors.append(fd)
                _write_all(fd, data)
            yield f"/proc/self/fd/{descriptors[0]}", f"/proc/self/fd/{descriptors[1]}"
        finally:
            for fd in descriptors:
                os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="broker-operator-tls-")  # mode 0700
    try:
        paths = []
        for name, data in (("client.crt", certificate_pem), ("client.key", key_pem)):
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            paths.append(path)
        yield paths[0], paths[1]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _ssl_reason(error: ssl.SSLError) -> str:
    return str(error.reason or error.strerror or type(error).__name__)


def client_ssl_context(material: ClientTlsMaterial) -> ssl.SSLContext:
    """A new client context from ``material`` (the rules of ``broker_contracts.tls.client_context``:
    TLS 1.2 floor, chain and host name verified; trust: the bundle alone). Raises
    :class:`TlsMaterialError`."""
    if not material.trust_bundle_pem.strip():
        raise TlsMaterialError("the trust bundle is empty: no broker's certificate could be verified")
    try:
        # As client_context does, with the bundle as cadata: given one, create_default_context
        # loads no system CA.
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cadata=material.trust_bundle_pem.decode("ascii")
        )
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        reason = _ssl_reason(error) if isinstance(error, ssl.SSLError) else type(error).__name__
        raise TlsMaterialError(f"the trust bundle is not PEM certificates ({reason})") from None
    context.minimum_version = MINIMUM_VERSION
    if not context.get_ca_certs():
        raise TlsMaterialError("the trust bundle holds no CA certificate")
    try:
        with _private_files(material.certificate_pem, material.key_pem) as (cert_file, key_file):
            context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        # OpenSSL's reason only (KEY_VALUES_MISMATCH, PEM_LIB, ...): its text may quote a path, never content.
        raise TlsMaterialError(f"the client certificate and key do not load ({_ssl_reason(error)})") from None
    except OSError as error:
        raise TlsMaterialError(
            f"the client certificate and key could not be staged ({error.strerror})"
        ) from None
    return context


HandshakeListener = Callable[[str, str | None], None]
"""Told ``(server name, served serial or None)`` after each completed handshake."""


class _ReportingSSLObject(ssl.SSLObject):
    """An ``SSLObject`` that tells its context's listener the serial each completed handshake was
    served. Made per context by :func:`_reporting_class` (the listener is a class attribute)."""

    _listener: HandshakeListener | None = None

    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until the handshake is done
        listener = type(self)._listener
        if listener is None:
            return
        try:
            der = self.getpeercert(binary_form=True)
            serial = der_serial(der).lower() if der else None
        except (CertificateSerialError, ValueError):
            serial = None
        try:
            listener(self.server_hostname or "", serial)
        except Exception:  # a report must never break a handshake
            logger.exception("recording a served certificate failed")


def _reporting_class(listener: HandshakeListener) -> type[ssl.SSLObject]:
    return type("ReportingSSLObject", (_ReportingSSLObject,), {"_listener": staticmethod(listener)})


class TlsClient:
    """The operator's current client context for one cluster's brokers.

    ``TlsClient(material)`` builds the first one (or raises :class:`TlsMaterialError`);
    :meth:`update` takes each new material from the certificates controller; :meth:`context` is
    what each heartbeat passes to aiohttp, rebuilt every ``fresh_handshake_seconds``.
    """

    def __init__(
        self,
        material: ClientTlsMaterial,
        *,
        fresh_handshake_seconds: float = DEFAULT_FRESH_HANDSHAKE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not fresh_handshake_seconds >= MIN_FRESH_HANDSHAKE_SECONDS:
            raise ValueError(
                f"fresh_handshake_seconds ({fresh_handshake_seconds!r}) must be at least "
                f"{MIN_FRESH_HANDSHAKE_SECONDS:g}: every new context means a full handshake with every broker"
            )
        self._fresh_handshake_seconds = fresh_handshake_seconds
        self._clock = clock
        self._material = material
        self._context = client_ssl_context(material)
        self._built_at = clock()
        self._failed_version: str | None = None  # the last version that did not load (warned once)
        self._sslobject_class = _reporting_class(self._handshake_done)
        self._context.sslobject_class = self._sslobject_class
        self._served: dict[str, str] = {}  # server name -> the serial its last handshake served
        self._served_at: dict[str, float] = {}  # server name -> when (clock) that handshake was
        self._expected: int | None = None  # the serial the brokers' Secret holds (expect_serving)
        self.contexts_built = 1  # for tests and metrics: each one starts new connections
        self.handshakes = 0  # completed handshakes with any broker, for tests and metrics

    @property
    def version(self) -> str:
        """The version of the material the current context was built from."""
        return self._material.version

    def update(self, material: ClientTlsMaterial) -> bool:
        """Use ``material`` from now on; True if a new context was built (its version changed).

        A material that does not load raises :class:`TlsMaterialError` (the controller reports it)
        and leaves the current context in use: a broken Secret must not stop the heartbeats that
        still work.
        """
        if material.version == self._material.version:
            return False
        try:
            context = client_ssl_context(material)
        except TlsMaterialError as error:
            if material.version != self._failed_version:
                self._failed_version = material.version
                logger.warning(
                    "the operator's new client TLS material (version %s) does not load: %s; heartbeats "
                    "go on with version %s",
                    material.version,
                    error,
                    self._material.version,
                )
            raise
        self._install(material, context)
        logger.info(
            "the operator's client TLS material is now version %s: new connections use it", material.version
        )
        return True

    @property
    def certificate_pem(self) -> bytes:
        """The client certificate (PEM, leaf first) the current context presents."""
        return self._material.certificate_pem

    def served_serial(self, server_name: str) -> str | None:
        """The serial (lower-case hex) that the broker verified as ``server_name`` served in the
        latest handshake with it; None before any."""
        return self._served.get(server_name)

    def expect_serving(self, serial: str | None) -> None:
        """The serial (hex) of the serving certificate the brokers' Secret holds now, as the
        certificates controller last read it; None: not known. See the module docstring."""
        try:
            self._expected = None if serial is None else int(serial, 16)
        except ValueError:
            self._expected = None

    def _behind(self, now: float) -> bool:
        """A broker handshaken within the last two periods served another serial than expected."""
        if self._expected is None:
            return False
        recent = now - 2 * self._fresh_handshake_seconds
        return any(
            int(serial, 16) != self._expected
            for name, serial in self._served.items()
            if self._served_at.get(name, recent) > recent
        )

    def _handshake_done(self, server_name: str, serial: str | None) -> None:
        self.handshakes += 1
        if serial is None:
            return
        if server_name not in self._served and len(self._served) >= _SERVED_NAMES_MAX:
            self._served.clear()  # names come and go with clusters; the next handshakes refill it
            self._served_at.clear()
        self._served[server_name] = serial
        self._served_at[server_name] = self._clock()

    def context(self) -> ssl.SSLContext:
        """The context for the next request: the current one, or a fresh one from the same material
        once ``fresh_handshake_seconds`` have passed since it was built, or ``CATCH_UP_SECONDS`` while
        a broker serves an old certificate (see the module docstring)."""
        now = self._clock()
        age = now - self._built_at
        if age >= self._fresh_handshake_seconds or (age >= CATCH_UP_SECONDS and self._behind(now)):
            try:
                self._install(self._material, client_ssl_context(self._material))
            except TlsMaterialError as error:  # it loaded before; nothing changed but the machine
                logger.warning(
                    "rebuilding the client TLS context failed (%s); keeping the current one", error
                )
                self._built_at = self._clock()
        return self._context

    def _install(self, material: ClientTlsMaterial, context: ssl.SSLContext) -> None:
        context.sslobject_class = self._sslobject_class
        self._material, self._context, self._built_at = material, context, self._clock()
        self._failed_version = None
        self.contexts_built += 1
