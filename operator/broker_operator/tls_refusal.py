"""Telling a broker that refuses the operator's TLS handshake from a broker that is gone.

A broker that refuses the operator's client certificate resets the connection during the
handshake (TLS 1.2) or closes it right after (TLS 1.3), with no alert the client could read
(DAY2_FACTS.md), which is what a killed broker's kernel does too. A TLS refusal must not count
toward a failover (both brokers share the PKI), a crash must: so the heartbeat client asks
:func:`tls_refused` after a reset or close before any reply, and words what it found with the
reason helpers here (OpenSSL's own words, never anything of a key or certificate).

What it does not do: send heartbeats, or decide anything (the engine does; a TLS error is
``HeartbeatError.tls_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import aiohttp
from yarl import URL

__all__ = ["handshake_cut", "refused_reason", "ssl_reason", "tls_refused", "verify_message"]

# Telling a refused client certificate from a dead broker (tls_refused): each
# probe is one new connection, given at most PROBE_SECONDS (and never past the call's limit,
# less a margin for the engine's own bound); one held open PROBE_HOLD_SECONDS after its
# handshake was accepted. Two probes, because a process being killed may cut the first one too.
PROBES = 2
PROBE_SECONDS = 0.5
PROBE_HOLD_SECONDS = 0.2
PROBE_GAP_SECONDS = 0.02
PROBE_MARGIN_SECONDS = 0.05


async def tls_refused(
    url: URL,
    context: ssl.SSLContext | None,
    server_name: str | None,
    started: float,
    limit: aiohttp.ClientTimeout,
) -> bool:
    """Whether the broker at ``url`` refuses the operator's TLS handshake, rather than being gone.

    A broker that refuses the client certificate resets the connection during the handshake
    (TLS 1.2) or closes it right after (TLS 1.3), with no alert the client could read
    (DAY2_FACTS.md), which is what a killed broker's kernel does too. The difference is the
    next connection: a dead process's port refuses it, while a live TLS layer takes it and cuts
    it again. So up to ``PROBES`` new connections are made (no request is sent on them);
    True only if every one is accepted by TCP and cut by TLS. A refused connect, a connection
    held open (the broker took the certificate: the cut was something else), or no time
    left in the call's limit: False, and the failure is classified as without TLS.
    """
    if context is None:
        return False
    host, port = url.raw_host, url.port
    if host is None or port is None:
        return False
    loop = asyncio.get_running_loop()
    deadline = started + (limit.total or PROBE_SECONDS)
    for attempt in range(PROBES):
        if attempt:
            await asyncio.sleep(PROBE_GAP_SECONDS)
        budget = min(PROBE_SECONDS, deadline - loop.time() - PROBE_MARGIN_SECONDS)
        if budget <= 0:
            return False
        if not await _cut_by_tls(host, port, context, server_name or host, budget):
            return False
    return True


def ssl_reason(error: ssl.SSLError) -> str:
    """OpenSSL's words for ``error`` (its reason, or the message without the source location)."""
    text = str(error.reason or error.strerror or error)
    return text.replace("_", " ").lower() if error.reason and text.isupper() else text


def verify_message(error: BaseException) -> str:
    """Why a server certificate did not verify, in OpenSSL's words ("certificate has expired",
    "Hostname mismatch, certificate is not valid for 'x'.", "self-signed certificate in
    certificate chain")."""
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return str(error.verify_message)
    return ssl_reason(error) if isinstance(error, ssl.SSLError) else type(error).__name__


def handshake_cut(error: BaseException) -> bool:
    """The connection was taken and then reset or closed during the TLS handshake (not refused)."""
    return isinstance(
        error,
        ConnectionResetError
        | ConnectionAbortedError
        | BrokenPipeError
        | ssl.SSLEOFError
        | ssl.SSLZeroReturnError,
    )


def refused_reason(server_name: str) -> str:
    return (
        f"{server_name} refused the TLS handshake, again on a new connection: its admin port does not "
        "accept the operator's client certificate (expired, or from a CA the broker does not trust)"
    )


async def _cut_by_tls(host: str, port: int, context: ssl.SSLContext, server_name: str, budget: float) -> bool:
    """One probe: True if TCP takes a new connection and TLS cuts it, during the handshake or just
    after (before any request is sent); False if nothing listens, or the connection stays open."""
    try:
        async with asyncio.timeout(budget):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_name, ssl_handshake_timeout=budget
            )
    except (ssl.SSLError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
        return True  # taken by TCP, cut (or not verified) by TLS
    except (OSError, TimeoutError):
        return False  # refused: nothing listens, the process is gone; or nothing answers at all
    try:
        return await _closed_at_once(reader, min(budget, PROBE_HOLD_SECONDS))
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(PROBE_GAP_SECONDS):
                await writer.wait_closed()


async def _closed_at_once(reader: asyncio.StreamReader, hold: float) -> bool:
    """Whether a connection whose handshake the client finished is closed within ``hold`` (under
    TLS 1.3 a server checks the client's certificate after that); held open, it was accepted."""
    try:
        async with asyncio.timeout(hold):
            return not await reader.read(1)
    except TimeoutError:
        return False
    except (ssl.SSLError, ConnectionError):
        return True
    except OSError:
        return False
