"""The broker's HTTP surface: SOAP at ``/soap`` (WSDL at ``?wsdl``), health, readiness, metrics.

One aiohttp application per process. The SOAP endpoint is the only way in for
the backend (``SendMessages``) and the operator (``Heartbeat`` and the admin
operations on held messages). Order of checks on ``POST /soap``:

1. Credentials, before the body is read: the SHA-256 of the ``Authorization: Bearer``
   value must be one of the broker's two verifiers, the operator's token's
   (``--token-verifier-file``) or the backend's (``--backend-token-verifier-file``).
   Anything else is an ``UNAUTHENTICATED`` fault, counted and logged (rate-limited), so
   an anonymous caller costs one hash, a few constant-time compares and a ``stat`` of
   the verifier files, and never reaches the XML parser.
   The credentials follow their mounted Secret files, with a grace window for the
   value a rotation replaced (``credentials.py``).
2. Body size: aiohttp's ``client_max_size`` caps what it reads; an oversized
   body becomes a ``HOSTILE_XML`` fault before any parsing.
3. Hardened parse (:func:`broker_service.soap_codec.parse_request`).
4. The credential must be the operation's: the backend's for ``SendMessages``,
   the operator's for ``Heartbeat`` and the admin operations. Each role can do
   only its own calls: a backend cannot switch a broker, and the operator's
   token cannot append to a stream. A mismatch is ``UNAUTHENTICATED`` too and
   changes nothing.
5. Dispatch to the :class:`~broker_service.lifecycle.Broker`.

With ``--admin-port`` the broker listens twice, so that a NetworkPolicy (which sees ports, never
SOAP operations) can admit the operator's calls from the operator alone and ``SendMessages`` from
the backend: the main port serves ``SendMessages``, the WSDL, ``/healthz``, ``/readyz`` and
``/metrics``; the admin port serves ``Heartbeat``, the admin operations, the WSDL, ``/metrics`` and
the operator's ``/watch`` stream (``watch.py``), and stays open until the broker has deactivated.
An operation sent to the other port is a ``WRONG_PORT`` fault naming the right one, checked after
the parse (one lookup of the request's type, and only an empty-dict test without an admin port,
where both surfaces are one). The admin listener is a second aiohttp application on the same
:class:`~broker_service.lifecycle.Broker`, started and stopped by the main one, so that the broker
is started and drained once whichever port a call arrives on.

Not here: any broker state or rules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from aiohttp import web

from broker_contracts import wsdl_text
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, SOAP_PATH, FaultCode
from broker_service import soap_codec
from broker_service.credentials import AuthFailure, AuthFailureLog, BrokerCredentials, Role
from broker_service.lifecycle import Broker
from broker_service.soap_codec import (
    HeartbeatRequest,
    HeldRefRequest,
    ListHeldRequest,
    SendMessagesRequest,
    SoapFaultError,
    SoapRequest,
)
from broker_service.watch import add_watch

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


CREDENTIALS_KEY: web.AppKey[BrokerCredentials] = web.AppKey("credentials", BrokerCredentials)
# The operations this listener refuses, by request type, each with its WRONG_PORT message; empty
# when one port serves everything.
REFUSED_KEY: web.AppKey[Mapping[type, str]] = web.AppKey("refused_operations", Mapping)
_ADMIN_REQUESTS = (HeartbeatRequest, ListHeldRequest, HeldRefRequest)
# The role a listener's calls need, known from what it refuses (before the body is parsed):
# the admin port serves the operator, a main port beside it the backend, a single port either.
_NEEDED_ROLE = {
    frozenset(_ADMIN_REQUESTS): Role.BACKEND.value,
    frozenset({SendMessagesRequest}): Role.OPERATOR.value,
}


def _refused_on_main(admin_port: int) -> dict[type, str]:
    message = (
        "{} is served on this broker's admin port {} (--admin-port / BROKER_ADMIN_PORT), not on this "
        "port, which serves SendMessages; send it to the pod's 'admin' port"
    )
    names = {
        HeartbeatRequest: "Heartbeat",
        ListHeldRequest: "ListHeld",
        HeldRefRequest: "ReplayHeld/DiscardHeld",
    }
    return {kind: message.format(names[kind], admin_port) for kind in _ADMIN_REQUESTS}


def _refused_on_admin(main_port: int) -> dict[type, str]:
    return {
        SendMessagesRequest: (
            f"SendMessages is served on this broker's main port {main_port} (--port / BROKER_PORT, "
            "the <cluster>-active Service), not on its admin port, which serves the operator's calls only"
        )
    }


def _caller_role(request: web.Request, credentials: BrokerCredentials) -> Role:
    """The role whose credential the request carries, or an ``UNAUTHENTICATED`` fault (counted
    and logged, rate-limited, by ``credentials.failures``)."""
    scheme, _, presented = request.headers.get(AUTH_HEADER, "").partition(" ")
    reason = AuthFailure.MISSING
    if scheme == AUTH_SCHEME and presented.strip():
        # Hashed once and compared in constant time, the backend's first (the hot path); a value
        # that matches neither makes the credentials look at their files at once (a rotation may
        # be under way).
        role = credentials.role_of(presented.strip().encode())
        if role is not None:
            return role
        reason = AuthFailure.UNKNOWN
    refused: Mapping[type, str] = request.app[REFUSED_KEY]
    needed = _NEEDED_ROLE.get(frozenset(refused), "any")
    credentials.failures.record(needed, reason, request.remote, f"{request.method} {request.path}")
    raise SoapFaultError(
        FaultCode.UNAUTHENTICATED,
        f"missing or unknown credential: send 'Authorization: {AUTH_SCHEME} <token>' with the backend's "
        "token for SendMessages (verified by the broker's --backend-token-verifier-file) or the operator's "
        "for Heartbeat and the admin operations (verified by its --token-verifier-file)",
    )


def _check_role(parsed: SoapRequest, role: Role, request: web.Request) -> None:
    """Each role may call only its own operations; the other role's credential changes nothing."""
    needed = Role.BACKEND if isinstance(parsed, SendMessagesRequest) else Role.OPERATOR
    if role is not needed:
        operation = type(parsed).__name__.removesuffix("Request")
        request.app[CREDENTIALS_KEY].failures.record(
            needed.value, AuthFailure.WRONG_ROLE, request.remote, f"SOAP {operation}"
        )
    if isinstance(parsed, SendMessagesRequest):
        if role is not Role.BACKEND:
            raise SoapFaultError(
                FaultCode.UNAUTHENTICATED,
                "SendMessages needs the backend's token (verified by the broker's "
                "--backend-token-verifier-file); the operator's token is not accepted for it",
            )
    elif role is not Role.OPERATOR:
        operation = type(parsed).__name__.removesuffix("Request")
        raise SoapFaultError(
            FaultCode.UNAUTHENTICATED,
            f"{operation} needs 'Authorization: {AUTH_SCHEME} <token>' with the operator's token (verified "
            "by the broker's --token-verifier-file); the backend's is accepted for SendMessages only",
        )


async def soap_post(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    started = time.perf_counter()
    try:
        role = _caller_role(request, request.app[CREDENTIALS_KEY])
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise SoapFaultError(
                FaultCode.HOSTILE_XML,
                f"request body exceeds the broker's limit of {broker.settings.body_limit_bytes} bytes",
            ) from None
        parsed = soap_codec.parse_request(body)
        refused = request.app[REFUSED_KEY]
        if refused and type(parsed) in refused:
            raise SoapFaultError(FaultCode.WRONG_PORT, refused[type(parsed)])
        _check_role(parsed, role, request)
        if isinstance(parsed, SendMessagesRequest):
            epoch, results = await broker.send_messages(parsed)
            payload = soap_codec.render_send_messages(epoch, results)
            broker.metrics.accept_seconds.observe(time.perf_counter() - started)
        elif isinstance(parsed, HeartbeatRequest):
            reply = await broker.heartbeat(parsed)
            payload = soap_codec.render_heartbeat(
                reply.state.value, reply.epoch, reply.unavailability_code, reply.unavailability_message
            )
        elif isinstance(parsed, ListHeldRequest):
            payload = soap_codec.render_list_held([e.view() for e in await broker.list_held(parsed.stream)])
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


def _soap_app(broker: Broker, credentials: BrokerCredentials, refused: Mapping[type, str]) -> web.Application:
    app = web.Application(client_max_size=broker.settings.body_limit_bytes)
    app[BROKER_KEY] = broker
    app[CREDENTIALS_KEY] = credentials
    app[REFUSED_KEY] = refused
    app.router.add_post(SOAP_PATH, soap_post)
    app.router.add_get(SOAP_PATH, soap_get)
    # On both ports: a scraper admitted to either (the NetworkPolicy admits the operator's pods to
    # the admin port) can read them, and scrapers that knew only the one port keep working.
    app.router.add_get("/metrics", metrics)
    return app


def build_app(broker: Broker) -> web.Application:
    """The main listener's application; with an admin port, it also runs the admin listener."""
    settings = broker.settings
    credentials = BrokerCredentials.from_settings(
        settings, failures=AuthFailureLog(broker.metrics.auth_failures)
    )
    admin_port = settings.admin_port
    app = _soap_app(broker, credentials, {} if admin_port is None else _refused_on_main(admin_port))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    admin_runner: web.AppRunner | None = None

    async def on_startup(app: web.Application) -> None:
        nonlocal admin_runner
        await broker.start()
        if admin_port is not None:
            admin_app = build_admin_app(broker, credentials)
            # No signal handling of its own: the main listener's runner owns SIGTERM and stops this
            # one first thing on shutdown (below), as it stops its own sites.
            admin_runner = web.AppRunner(admin_app, access_log=None, shutdown_timeout=settings.drain_seconds)
            await admin_runner.setup()
            await web.TCPSite(admin_runner, settings.host, admin_port).start()
            logger.info(
                "admin port %d: Heartbeat and the admin operations; port %d: SendMessages",
                admin_port,
                settings.port,
            )

    async def on_shutdown(app: web.Application) -> None:
        # Deactivate and drain first, then close the admin listener (and end the watch streams):
        # the operator takes a refused admin port for a process that no longer acts (watch.py),
        # so it must not refuse while this one may. During the drain the operator's calls still
        # arrive: active=true is refused (SHUTTING_DOWN), active=false waits for the drain.
        await broker.stop()
        if admin_runner is not None:
            await admin_runner.cleanup()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


def build_admin_app(broker: Broker, credentials: BrokerCredentials) -> web.Application:
    """The admin listener's application: Heartbeat, the admin operations, the WSDL, /metrics, and
    the operator's ``/watch`` stream (watch.py)."""
    app = _soap_app(broker, credentials, _refused_on_admin(broker.settings.port))
    add_watch(app, credentials, broker.settings.name)
    return app
