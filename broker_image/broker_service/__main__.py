"""``broker-service``: run one broker process (one per pod).

Reads :class:`~broker_service.settings.BrokerSettings` from flags and
environment, builds the aiohttp application and serves it (``listener.py``:
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

from broker_service import listener
from broker_service.lifecycle import Broker
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = parse_settings(argv)
    except SettingsError as error:
        print(f"broker-service: {error}", file=sys.stderr)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("broker_service").info("event loop: %s", use_fastest_event_loop())

    async def make_app() -> web.Application:
        return build_app(Broker(settings))

    # web.run_app's work, through a runner that caps connections (listener.py).
    listener.run(
        listener.serve(
            make_app,
            host=settings.host,
            port=settings.port,
            max_connections=settings.max_connections,
            header_timeout_seconds=settings.header_timeout_seconds,
            shutdown_timeout=settings.drain_seconds + 5,
        )
    )
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
