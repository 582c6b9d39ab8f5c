"""The broker's listeners: aiohttp runners whose connections are bounded in number and in time.

A connection costs the broker a task and up to a body's worth of memory, and until its request's
headers are complete it is invisible to the application (no middleware or handler runs), so
slow clients have to be stopped here, at the connection:

* **Header deadline**: aiohttp's keep-alive timer. It starts when a connection opens and again
  after each response, is not reset by incoming bytes, and closes the connection if no complete
  request has arrived by then. So ``keepalive_timeout`` is the deadline for a request's headers
  as well as for an idle connection (``--header-timeout-seconds``, 40 s on both ports: above
  the operator client's 30 s keep-alive and the backend simulator's 15 s, so that the client
  closes an idle connection first and never sends on one the broker is closing). aiohttp's own
  default is 3,630 s, ``run_app``'s 75 s.
* **Body deadline**: in the handler (``server.py``), ``asyncio.timeout`` around the read.
* **Connection cap**: aiohttp has no option for it (``backlog`` bounds only the kernel's queue
  of connections not yet accepted), so :class:`ListenerRunner` counts the connections of its
  ``web.Server`` and closes, as it opens, each one over ``--max-connections``, before it has cost
  more than its accept. Per listener: a full main port does not lock the operator out of the
  admin port.
* **Under TLS** (``--tls-dir``) aiohttp's handler sees a connection only once its handshake is
  done, so the cap and the header deadline start there. The handshake itself is bounded by
  ``ssl_handshake_timeout`` of the event loop's ``create_server`` (asyncio's and uvloop's
  default is 60 s), which aiohttp's ``TCPSite`` does not pass on: :class:`TlsSite` does, with
  ``--tls-handshake-timeout-seconds``. A connection that sends no ClientHello, or stops half
  way, is closed then: it holds no handler task meanwhile, only its socket and TLS state, and
  is not counted by the cap.

:func:`serve` replaces ``web.run_app`` for the main listener so that it can use this runner; it
does what ``run_app`` did for the broker: signal handling (SIGTERM and SIGINT end it, and the
runner's cleanup deactivates and drains the broker while its tasks still run), one TCP site,
cleanup on the way out.

Not here: what a request may contain (``server.py``, ``soap_codec.py``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)


class ListenerRunner(web.AppRunner):
    """An ``AppRunner`` whose server closes every connection over ``max_connections`` as it opens."""

    def __init__(self, app: web.Application, *, max_connections: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        cap = self._max_connections
        accept = server.connection_made
        refused = 0

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            nonlocal refused
            accept(handler, transport)
            if len(server.connections) > cap:
                # Closed before it is read from: the handler's task sees the forced close and ends.
                handler.force_close()
                transport.close()
                refused += 1
                if refused == 1 or refused % 1000 == 0:
                    logger.warning(
                        "closed a connection over the limit of %d (--max-connections); %d so far",
                        cap,
                        refused,
                    )

        server.connection_made = connection_made  # type: ignore[method-assign]
        return server


class TlsSite(web.TCPSite):
    """A ``TCPSite`` that serves TLS with a bounded handshake (``ssl_handshake_timeout``).

    ``TCPSite.start`` calls ``loop.create_server`` without that argument, so this ``start`` makes
    the same call with it (aiohttp 3.11 to 3.14 keep the attributes used here; a test of the
    timeout fails if they move).
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext,
        handshake_timeout_seconds: float,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._handshake_timeout = handshake_timeout_seconds

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner, as TCPSite's does
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._handshake_timeout,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )


def site(
    runner: web.BaseRunner,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    handshake_timeout_seconds: float,
) -> web.TCPSite:
    """A plain ``TCPSite``, or a :class:`TlsSite` when there is a context to serve."""
    if ssl_context is None:
        return web.TCPSite(runner, host, port)
    return TlsSite(
        runner, host, port, ssl_context=ssl_context, handshake_timeout_seconds=handshake_timeout_seconds
    )


async def serve(
    make_app: Callable[[], Awaitable[web.Application]],
    *,
    host: str,
    port: int,
    max_connections: int,
    header_timeout_seconds: float,
    shutdown_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    handshake_timeout_seconds: float = 10.0,
) -> None:
    """Serve the main listener until SIGTERM or SIGINT, then clean up (deactivate, drain) and return.

    The signal sets an event rather than raising (as ``run_app``'s ``GracefulExit`` does), so the
    cleanup runs while the broker's own tasks are still alive to finish the drain.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = ListenerRunner(
        await make_app(),
        max_connections=max_connections,
        keepalive_timeout=header_timeout_seconds,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    try:
        await site(runner, host, port, ssl_context, handshake_timeout_seconds).start()
        await stop.wait()
    finally:
        await runner.cleanup()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run :func:`serve` to its end."""
    asyncio.run(main)
