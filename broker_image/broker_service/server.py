"""The broker's HTTP surface: SOAP at ``/soap`` (WSDL at ``?wsdl``), health, readiness, metrics.

One aiohttp application per process. The SOAP endpoint is the only way in for
the backend (``SendMessages``) and the operator (``Heartbeat`` and the admin
operations on held messages). Order of checks on ``POST /soap``:

1. Body size: aiohttp's ``client_max_size`` caps what it reads; an oversized
   body becomes a ``HOSTILE_XML`` fault before any parsing.
2. Hardened parse (:func:`broker_service.soap_codec.parse_request`).
3. Credentials: ``Heartbeat`` and the admin operations need ``Authorization:
   Bearer <token>``; a missing or wrong token is an ``UNAUTHENTICATED`` fault
   and nothing changes. ``SendMessages`` comes from the backend, which does not
   hold the operator's credential; it is fenced by the Active state instead
   (see docs/broker.md for this reading of the contract).
4. Dispatch to the :class:`~broker_service.lifecycle.Broker`.

Not here: any broker state or rules.
"""

from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web

from broker_contracts import wsdl_text
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, SOAP_PATH, FaultCode
from broker_service import soap_codec
from broker_service.lifecycle import Broker
from broker_service.soap_codec import (
    HeartbeatRequest,
    HeldRefRequest,
    ListHeldRequest,
    SendMessagesRequest,
    SoapFaultError,
)

logger = logging.getLogger(__name__)

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker", Broker)
_XML = "text/xml; charset=utf-8"


def _fault_response(fault: SoapFaultError) -> web.Response:
    response = web.Response(
        status=fault.http_status,
        body=soap_codec.render_fault(fault),
        content_type="text/xml",
        charset="utf-8",
    )
    if fault.code == FaultCode.BROKER_INACTIVE:
        # Close the connection: kube-proxy pins a keep-alive connection to the pod it first
        # chose, so a backend that kept it would hear "inactive" from this broker forever
        # instead of reconnecting through the <cluster>-active Service to the new active.
        response.force_close()
    return response


def _authorized(request: web.Request, token: str) -> bool:
    header = request.headers.get(AUTH_HEADER, "")
    scheme, _, presented = header.partition(" ")
    if scheme != AUTH_SCHEME or not presented:
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


async def soap_post(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    started = time.perf_counter()
    try:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise SoapFaultError(
                FaultCode.HOSTILE_XML,
                f"request body exceeds the broker's limit of {broker.settings.body_limit_bytes} bytes",
            ) from None
        parsed = soap_codec.parse_request(body)
        if not isinstance(parsed, SendMessagesRequest) and not _authorized(request, broker.settings.token):
            raise SoapFaultError(
                FaultCode.UNAUTHENTICATED,
                f"{type(parsed).__name__.removesuffix('Request')} needs 'Authorization: Bearer <token>' "
                "with the operator's credential (the broker's --token-file Secret)",
            )
        if isinstance(parsed, SendMessagesRequest):
            epoch, results = await broker.send_messages(parsed)
            payload = soap_codec.render_send_messages(epoch, results)
            broker.metrics.accept_seconds.observe(time.perf_counter() - started)
        elif isinstance(parsed, HeartbeatRequest):
            reply = await broker.heartbeat(parsed)
            payload = soap_codec.render_heartbeat(reply.state.value, reply.epoch, reply.code, reply.message)
        elif isinstance(parsed, ListHeldRequest):
            payload = soap_codec.render_list_held([e.view() for e in broker.list_held(parsed.stream)])
        elif isinstance(parsed, HeldRefRequest):
            if parsed.operation == "ReplayHeld":
                await broker.replay_held(parsed.direction, parsed.stream, parsed.seq)
                text = f"{parsed.direction} stream {parsed.stream!r} seq {parsed.seq} released for delivery"
            else:
                await broker.discard_held(parsed.direction, parsed.stream, parsed.seq)
                text = f"{parsed.direction} stream {parsed.stream!r} seq {parsed.seq} discarded"
            payload = soap_codec.render_held_action(True, text)
        else:  # pragma: no cover - parse_request returns one of the above
            raise SoapFaultError(FaultCode.UNKNOWN_OPERATION, "unsupported operation")
    except SoapFaultError as fault:
        return _fault_response(fault)
    return web.Response(body=payload, content_type="text/xml", charset="utf-8")


async def soap_get(request: web.Request) -> web.Response:
    if "wsdl" not in request.query and request.query_string.lower() != "wsdl":
        raise web.HTTPBadRequest(text="GET /soap?wsdl serves the WSDL; operations are POSTed as SOAP 1.1")
    text = wsdl_text().replace("http://localhost:8080/soap", f"{request.scheme}://{request.host}{SOAP_PATH}")
    return web.Response(text=text, content_type="text/xml", charset="utf-8")


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    if broker.ready:
        return web.Response(text="ready\n")
    reason = broker.journal_error or "journal not open"
    return web.Response(status=503, text=f"not ready: {reason}\n")


async def metrics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    broker.metrics.journal_group_commits.set(broker.journal.fsyncs)
    return web.Response(body=broker.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


def build_app(broker: Broker) -> web.Application:
    app = web.Application(client_max_size=broker.settings.body_limit_bytes)
    app[BROKER_KEY] = broker
    app.router.add_post(SOAP_PATH, soap_post)
    app.router.add_get(SOAP_PATH, soap_get)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)

    async def on_startup(app: web.Application) -> None:
        await broker.start()

    async def on_shutdown(app: web.Application) -> None:
        await broker.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app
