"""``GET /watch`` on the admin port: a connection the operator holds open for the process's life.

The operator learns of a crash from this connection: when the process dies, its kernel closes the
socket (a FIN), at once, and the operator then tries the admin port afresh. A refused connection
there is its proof that this process is gone (docs/failover-engine.md, "Proofs of death"). That
proof rests on one promise this module and ``server.build_app`` keep together:

    **the admin listener is open for as long as the broker may act.**

It opens before the broker can be activated (activation arrives through it), and on SIGTERM it
closes only after the broker has deactivated and drained. The watch streams end at that point
too, never before, so a stream that ends while the listener refuses means the process is gone.

The response is plain text: one line naming the broker and its process, then a newline every
``KEEPALIVE_SECONDS`` so that an idle connection is neither dropped by a middlebox nor taken for
dead by the operator's read timeout. The operator asks with HTTP/1.0, so the body ends with the
connection: a FIN ends it cleanly, a reset is an error, and the operator tells the two apart.
Only the operator's credential opens it; the backend's does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from aiohttp import web

from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME
from broker_service.credentials import AuthFailure, BrokerCredentials, Role

WATCH_PATH = "/watch"
KEEPALIVE_SECONDS = 5.0

# Set when the admin listener shuts down, which is after the broker deactivated: the streams end.
STOPPING_KEY: web.AppKey[asyncio.Event] = web.AppKey("watch_stopping", asyncio.Event)


def add_watch(app: web.Application, credentials: BrokerCredentials, broker_name: str) -> None:
    """Serve ``GET /watch`` on ``app`` (the admin listener's application)."""
    app[STOPPING_KEY] = asyncio.Event()

    async def stop_streams(app: web.Application) -> None:
        app[STOPPING_KEY].set()

    async def watch(request: web.Request) -> web.StreamResponse:
        scheme, _, presented = request.headers.get(AUTH_HEADER, "").partition(" ")
        given = presented.strip().encode() if scheme == AUTH_SCHEME else b""
        role = credentials.role_of(given) if given else None
        if role is not Role.OPERATOR:
            reason = (
                AuthFailure.MISSING
                if not given
                else AuthFailure.UNKNOWN
                if role is None
                else AuthFailure.WRONG_ROLE
            )
            credentials.failures.record(Role.OPERATOR.value, reason, request.remote, f"GET {WATCH_PATH}")
            raise web.HTTPUnauthorized(
                text=f"/watch needs 'Authorization: {AUTH_SCHEME} <token>' with the operator's credential\n"
            )
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        response.force_close()  # one stream per connection, ended by closing it
        await response.prepare(request)
        stopping = request.app[STOPPING_KEY]
        with contextlib.suppress(ConnectionError):  # the operator went away: nothing to tell it
            await response.write(f"watching broker {broker_name} pid {os.getpid()}\n".encode())
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_SECONDS):
                        await stopping.wait()
                if not stopping.is_set():
                    await response.write(b"\n")
            await response.write_eof()
        return response

    app.on_shutdown.append(stop_streams)
    app.router.add_get(WATCH_PATH, watch)
