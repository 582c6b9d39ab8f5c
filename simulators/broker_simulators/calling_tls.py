"""TLS for the backend simulator's own calls to brokers: ``https://`` broker URLs, as SAP calls them.

The backend is the main port's one caller. Given an ``https://`` ``--broker-url`` it verifies the
broker's chain and host name against ``--broker-ca-file`` (the CA that signs the brokers'
serving certificates; without it, the system's trust store, as SAP trusts the CAs imported into
its SSL client PSE and nothing else) and, with ``--client-cert-file`` and ``--client-key-file``,
presents a client certificate: what a broker with ``--allowed-client-subjects`` requires before it
reads the bearer token, which the simulator still sends (the token stays a second factor). The
context comes from :func:`broker_contracts.tls.client_context` (the TLS 1.2 floor every channel
shares) through a :class:`~broker_contracts.tls.ReloadingClientContext`, and every lane passes its
:attr:`~broker_contracts.tls.ReloadingClientContext.current` with each bundle (aiohttp's ``ssl=``
per request). The same context object until the files change, so a lane's one kept-alive
connection does its handshake once, not once per bundle. ``http://`` URLs ignore it.

The files are followed, not read once: :func:`follow_broker_trust` checks them every
``--tls-reload-seconds`` (5 s) and new connections use what changed, as SAP's ICM does after
the admin imports a CA into STRUST. During a CA key replacement the operator writes both CAs into
the brokers' ``ca.crt`` before it reissues their certificates; a simulator that read its
``--broker-ca-file`` once would refuse every reissued broker until restarted. A file that does not
load at start stops the start with its name; later it is a warning, once per problem, and the
trust loaded before stays (``broker_contracts.tls.reloading``). Connections already open keep
the context they were made with; aiohttp pools connections by their ``ssl`` context, so the old
idle ones are never reused and close after aiohttp's keep-alive of 15 s (``relay_client.py`` in
the broker says where in aiohttp's connector). ``/sim/status`` counts the swaps and the changed
files that did not load (``brokerTrustReloads``, ``brokerTrustReloadFailures``).

A certificate that is wrong does not stop the simulator: brokers come and go (a failover, a
rotation), so a send that failed is retried with the lane's capped backoff as any other fast
failure is, and counted in ``/sim/status`` ``faults``. :class:`FailureLog` says what went wrong
once per broker URL and kind, in words that name the file to check (OpenSSL's reason for a
refused chain or name, and for a connection the broker closed at the first read, the
client-certificate refusal it usually is under TLS 1.3), instead of once per retry.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from broker_contracts.tls import ReloadingClientContext

DEFAULT_RELOAD_SECONDS = 5.0


@dataclass(frozen=True)
class BrokerClientTls:
    """The files for ``https://`` broker URLs; all ``None``: the system's trust store, no certificate."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    reload_seconds: float = DEFAULT_RELOAD_SECONDS  # how often the files are read again

    @property
    def trust(self) -> str:
        return f"--broker-ca-file {self.ca_file}" if self.ca_file else "the system's trust store"

    @property
    def has_files(self) -> bool:
        return any(path is not None for path in (self.ca_file, self.cert_file, self.key_file))


def _reload_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds above 0")
    return value


def add_broker_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker-ca-file",
        type=Path,
        default=None,
        help="verify https:// broker URLs against the CA(s) in this PEM file (default: the system's store)",
    )
    parser.add_argument(
        "--client-cert-file",
        type=Path,
        default=None,
        help="present this client certificate (PEM, leaf first) to https:// brokers; needs --client-key-file",
    )
    parser.add_argument(
        "--client-key-file", type=Path, default=None, help="the private key of --client-cert-file (PEM)"
    )
    parser.add_argument(
        "--tls-reload-seconds",
        type=_reload_seconds,
        default=DEFAULT_RELOAD_SECONDS,
        help="read --broker-ca-file, --client-cert-file and --client-key-file again this often; new "
        "connections use what changed (the --tls-dir certificate is read once)",
    )


def broker_client_tls(args: argparse.Namespace, parser: argparse.ArgumentParser) -> BrokerClientTls:
    """The parsed flags, each file loaded now so that a wrong one stops the start with its name."""
    tls = BrokerClientTls(
        args.broker_ca_file, args.client_cert_file, args.client_key_file, args.tls_reload_seconds
    )
    if (tls.cert_file is None) != (tls.key_file is None):
        parser.error("--client-cert-file and --client-key-file go together: give both or neither")
    try:
        calling_context(tls)
    except ValueError as error:  # TlsFilesError among them: it names the file and why
        named = ", ".join(
            f"{flag} {path}"
            for flag, path in (
                ("--broker-ca-file", tls.ca_file),
                ("--client-cert-file", tls.cert_file),
                ("--client-key-file", tls.key_file),
            )
            if path is not None
        )
        parser.error(f"cannot load {named}: {error} (PEM files, the key being the certificate's)")
    return tls


def calling_context(tls: BrokerClientTls) -> ReloadingClientContext:
    """The client context for ``https://`` broker URLs (chain and host name verified), following the
    files; raises ``TlsFilesError`` (a ``ValueError``) naming a file that does not load."""
    return ReloadingClientContext(
        "calls to brokers", ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file
    )


async def follow_broker_trust(context: ReloadingClientContext, reload_seconds: float) -> None:
    """Check the files every ``reload_seconds`` until cancelled; ``context`` counts and logs."""
    while True:
        await asyncio.sleep(reload_seconds)
        context.check()


def describe_send_failure(error: BaseException, url: str, tls: BrokerClientTls) -> str:
    """What went wrong with a send to ``url``, and what to check; no credential is in it."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        verify_message = getattr(error.certificate_error, "verify_message", "")
        reason = (
            f"certificate verify failed: {verify_message}" if verify_message else str(error.certificate_error)
        )
        return (
            f"{url}: the broker's certificate was refused ({reason}): it must chain to a CA in "
            f"{tls.trust} and name the URL's host"
        )
    if isinstance(error, aiohttp.ClientSSLError):
        return f"{url}: the TLS handshake failed: {error}"
    # A closed connection, not a refused one (ClientConnectorError is a ClientOSError too).
    closed = isinstance(error, aiohttp.ServerDisconnectedError) or (
        isinstance(error, aiohttp.ClientOSError) and not isinstance(error, aiohttp.ClientConnectorError)
    )
    if closed and url.startswith("https://") and tls.cert_file is not None:
        return (
            f"{url}: the broker closed the connection ({type(error).__name__}); under TLS 1.3 that is "
            f"how a refused client certificate reads: check that {tls.cert_file} chains to the broker's "
            "--client-ca-file"
        )
    if closed and url.startswith("http://"):
        return (
            f"{url}: the broker closed the connection ({type(error).__name__}); a broker serving TLS "
            "closes plain HTTP like this: use an https:// URL"
        )
    return f"{url}: {type(error).__name__}: {error}"


class FailureLog:
    """Log each kind of failure once per broker URL; the counts are in ``/sim/status``."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[tuple[str, str]] = set()

    def once(self, url: str, kind: str, message: str) -> None:
        if (url, kind) in self._seen:
            return
        self._seen.add((url, kind))
        self._logger.warning(
            "%s; retrying with backoff (logged once, counted in /sim/status faults)", message
        )
