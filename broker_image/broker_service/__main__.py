"""``broker-service``: run one broker process (one per pod).

Reads :class:`~broker_service.settings.BrokerSettings` from flags and
environment, builds the TLS contexts when ``--tls-dir`` is set (``listener_tls.py``), builds the
aiohttp application and serves it (``listener.py``:
connections bounded in number and time) until SIGTERM or SIGINT; aiohttp's
runner then calls the broker's shutdown, which deactivates and drains, and the
process exits 0. A settings error exits 2 with the message that names the flag.
The broker object is built inside the running loop because its tasks and locks
belong to that loop.

The loop is uvloop's when it is installed (libuv's loop and its C transports
take a large share off the per-request cost of aiohttp), else asyncio's own;
the broker's behaviour does not depend on which.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from broker_contracts.logs import configure_logging
from broker_contracts.tls import TlsFilesError
from broker_service import listener
from broker_service.lifecycle import Broker
from broker_service.listener_tls import ListenerTls
from broker_service.server import build_app
from broker_service.settings import SettingsError, parse_settings


def use_fastest_event_loop() -> str:
    """Make uvloop the event loop policy if it is installed; return the loop's name for the log."""
    try:
        import uvloop  # optional: asyncio's loop works too, only slower
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except SettingsError as error:
        print(f"broker-service: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log)
    tls = None
    if settings.tls is not None and settings.admin_port is not None:  # parse_settings checked both
        try:
            tls = ListenerTls.from_settings(settings.tls, port=settings.port, admin_port=settings.admin_port)
        except TlsFilesError as error:  # the files changed after the settings had checked them
            print(f"broker-service: --tls-dir = {str(settings.tls.directory)!r}: {error}", file=sys.stderr)
            return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("broker_service")
    log.info("event loop: %s", use_fastest_event_loop())
    if tls is not None:
        log.info("TLS on both ports, serving certificate serial %s", tls.main.serial)

    async def make_app() -> web.Application:
        return build_app(Broker(settings), tls)

    # web.run_app's work, through a runner that caps connections (listener.py).
    listener.run(
        listener.serve(
            make_app,
            host=settings.host,
            port=settings.port,
            max_connections=settings.max_connections,
            header_timeout_seconds=settings.header_timeout_seconds,
            shutdown_timeout=settings.drain_seconds + 5,
            ssl_context=None if tls is None else tls.main.context,
            handshake_timeout_seconds=tls.settings.handshake_timeout_seconds if tls else 0,
        )
    )
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
