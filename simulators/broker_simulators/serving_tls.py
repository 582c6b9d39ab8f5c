"""TLS for the simulators' own listeners: ``--tls-dir``, so a broker can be tested against ``https://``.

The backend and the cloud are the broker's upstream targets; a broker verifies their
certificates against ``--upstream-ca-file`` (or the system's store). Given ``--tls-dir`` (the same
layout as the broker's: ``tls.crt``, ``tls.key``; ``broker_contracts.tls.layout``), a simulator
serves HTTPS with a context from :func:`broker_contracts.tls.server_context`, read once at start:
a simulator's certificate does not rotate.

:class:`RelayTransports` counts the relay calls (``/relay/...``, the brokers' calls) by the
transport they came over, ``TLSv1.3`` or ``plain``, for ``/sim/status`` ``relayTransports``: the
proof, in a cluster where the brokers' upstream URLs come from a Secret, that they really call
``https://`` (a listener on ``--tls-dir`` takes nothing else, so ``plain`` stays absent there).

Not here: the backend simulator's own calls to a TLS broker (``calling_tls.py``).
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from broker_contracts.tls import TlsDirectory, server_context


def add_tls_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="serve HTTPS with tls.crt and tls.key from this directory (default: plain HTTP)",
    )


def serving_context(tls_dir: Path | None) -> ssl.SSLContext | None:
    """The listener's context for ``--tls-dir``, or None for plain HTTP."""
    if tls_dir is None:
        return None
    files = TlsDirectory(tls_dir)
    return server_context(files.cert, files.key)


RELAY_PATH_PREFIX = "/relay/"  # the brokers' calls (broker_contracts.relay); /sim/... is the harness's


class RelayTransports:
    """The relay calls taken, by transport: the TLS version negotiated, or ``plain``."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith(RELAY_PATH_PREFIX):
            transport = request.transport
            tls = transport.get_extra_info("ssl_object") if transport is not None else None
            kind = str(tls.version()) if tls is not None else "plain"
            self.counts[kind] = self.counts.get(kind, 0) + 1
        return await handler(request)
