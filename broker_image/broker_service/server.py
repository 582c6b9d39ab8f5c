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
2. The role's port, before the body is read: with ``--admin-port``, the operator's credential
   opens nothing on the main port and the backend's nothing on the admin port (``WRONG_PORT``).
3. Body size and time, by role: the backend's up to the contract's largest bundle
   (``--body-limit-bytes``), the operator's up to what its calls need
   (``--operator-body-limit-bytes``), each within ``--body-timeout-seconds``; a Content-Length
   over the limit is refused unread. Over either is a ``HOSTILE_XML`` fault naming the limit.
4. Hardened parse (:func:`broker_service.soap_codec.parse_request`), told the role's
   operations and the bounds: namespace declarations, the operation against the role (the
   backend's credential opens ``SendMessages`` only, the operator's the rest; a mismatch is
   ``UNAUTHENTICATED``), and the bundle's message count are all checked before the schema
   validation. So a backend cannot switch a broker, the operator's token cannot append to a
   stream, and no single request holds the event loop that answers heartbeats for more than a
   small part of the lease margin (docs/broker.md, "Request limits").
5. Dispatch to the :class:`~broker_service.lifecycle.Broker`.

Connections are bounded by :mod:`broker_service.listener` (count, header deadline, TLS handshake).

With ``--tls-dir`` both listeners serve TLS only (``listener_tls.py``): the admin port requires the
operator's client certificate before any of the above, the credential stays the second factor;
on the main port, with ``--allowed-client-subjects``, a listed client certificate is checked
before step 1 (``client_certificates.py``). A plain-HTTP request to either port fails the
handshake and never reaches this module, so no credential is ever read from one. Every reply of the
admin port then carries ``X-Broker-Trust-Bundle``: the version of the CA bundle its live context
trusts (``listener_tls.py``), a header beside the unchanged SOAP contract, which the operator reads
while it replaces the CA's key.

With ``--admin-port`` the broker listens twice, so that a NetworkPolicy (which sees ports, never
SOAP operations) can admit the operator's calls from the operator alone and ``SendMessages`` from
the backend: the main port serves ``SendMessages``, the WSDL, ``/healthz``, ``/readyz`` and
``/metrics``; the admin port serves ``Heartbeat``, the admin operations, the WSDL, ``/metrics`` and
the operator's ``/watch`` stream (``watch.py``), and stays open until the broker has deactivated.
A credential sent to the other role's port is a ``WRONG_PORT`` fault naming the right one, checked
before the body is read (one lookup of the role, and only an empty-dict test without an admin
port, where both surfaces are one). The admin listener is a second aiohttp application on the same
:class:`~broker_service.lifecycle.Broker`, started and stopped by the main one, so that the broker
is started and drained once whichever port a call arrives on.

Not here: any broker state or rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial

from aiohttp import web

from broker_contracts import wsdl_text
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, SOAP_PATH, FaultCode
from broker_contracts.tls import TRUST_BUNDLE_HEADER
from broker_service import listener, soap_codec
from broker_service.client_certificates import ALLOWED_SUBJECTS_KEY, check_client_subject
from broker_service.credentials import AuthFailure, AuthFailureLog, BrokerCredentials, Role
from broker_service.lifecycle import Broker
from broker_service.listener import ListenerRunner
from broker_service.listener_tls import ListenerTls
from broker_service.settings import BrokerSettings
from broker_service.soap_codec import (
    MAX_NAMESPACES_IN_SCOPE,
    OPERATIONS,
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


def _fault_response(fault: SoapFaultError, *, close: bool = False) -> web.Response:
    response = web.Response(
        status=fault.http_status,
        body=soap_codec.render_fault(fault),
        content_type="text/xml",
        charset="utf-8",
    )
    if close:
        response.force_close()  # what is left of a body that did not arrive in time stays unread
    elif fault.code == FaultCode.BROKER_INACTIVE:
        # Close the connection: kube-proxy pins a keep-alive connection to the pod it first
        # chose, so a backend that kept it would hear "inactive" from this broker forever
        # instead of reconnecting through the <cluster>-active Service to the new active.
        response.force_close()
    return response


CREDENTIALS_KEY: web.AppKey[BrokerCredentials] = web.AppKey("credentials", BrokerCredentials)
# The roles whose operations this listener does not serve, each with its WRONG_PORT message; empty
# when one port serves everything.
REFUSED_KEY: web.AppKey[Mapping[Role, str]] = web.AppKey("refused_roles", Mapping)
PARSE_TURN_KEY: web.AppKey[asyncio.Lock] = web.AppKey("parse_turn", asyncio.Lock)
_SEND_MESSAGES = frozenset({"SendMessages"})
_ROLE_OPERATIONS = {Role.BACKEND: _SEND_MESSAGES, Role.OPERATOR: OPERATIONS - _SEND_MESSAGES}


def _refused_on_main(admin_port: int) -> dict[Role, str]:
    return {
        Role.OPERATOR: (
            f"Heartbeat, ListHeld, ReplayHeld and DiscardHeld are served on this broker's admin port "
            f"{admin_port} (--admin-port / BROKER_ADMIN_PORT), not on this port, which serves "
            "SendMessages; send them to the pod's 'admin' port"
        )
    }


def _refused_on_admin(main_port: int) -> dict[Role, str]:
    return {
        Role.BACKEND: (
            f"SendMessages is served on this broker's main port {main_port} (--port / BROKER_PORT, "
            "the <cluster>-active Service), not on its admin port, which serves the operator's calls only"
        )
    }


def _needed_role(refused: Mapping[Role, str]) -> str:
    """The role a listener's calls need, known before the body is read from the role it refuses:
    the admin port serves the operator, a main port beside it the backend, a single port either."""
    if len(refused) != 1:
        return "any"
    return (Role.BACKEND if Role.OPERATOR in refused else Role.OPERATOR).value


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
    needed = _needed_role(request.app[REFUSED_KEY])
    credentials.failures.record(needed, reason, request.remote, f"{request.method} {request.path}")
    raise SoapFaultError(
        FaultCode.UNAUTHENTICATED,
        f"missing or unknown credential: send 'Authorization: {AUTH_SCHEME} <token>' with the backend's "
        "token for SendMessages (verified by the broker's --backend-token-verifier-file) or the operator's "
        "for Heartbeat and the admin operations (verified by its --token-verifier-file)",
    )


def _other_roles_operation(request: web.Request) -> Callable[[str], SoapFaultError]:
    """Each role may call only its own operations; the other role's credential changes nothing,
    and its use is counted and logged as a refused credential."""

    def refused(operation: str) -> SoapFaultError:
        needed = Role.BACKEND if operation == "SendMessages" else Role.OPERATOR
        request.app[CREDENTIALS_KEY].failures.record(
            needed.value, AuthFailure.WRONG_ROLE, request.remote, f"SOAP {operation}"
        )
        if needed is Role.BACKEND:
            return SoapFaultError(
                FaultCode.UNAUTHENTICATED,
                "SendMessages needs the backend's token (verified by the broker's "
                "--backend-token-verifier-file); the operator's token is not accepted for it",
            )
        return SoapFaultError(
            FaultCode.UNAUTHENTICATED,
            f"{operation} needs 'Authorization: {AUTH_SCHEME} <token>' with the operator's token (verified "
            "by the broker's --token-verifier-file); the backend's is accepted for SendMessages only",
        )

    return refused


def _parse(body: bytes, role: Role, settings: BrokerSettings, request: web.Request) -> SoapRequest:
    return soap_codec.parse_request(
        body,
        operations=_ROLE_OPERATIONS[role],
        refused=_other_roles_operation(request),
        max_namespaces=MAX_NAMESPACES_IN_SCOPE,
        max_messages=settings.bundle_max_messages,
    )


_LONG_PARSE_SECONDS = 0.005
_AFTER_LONG_PARSE_SECONDS = 0.001


async def _parse_in_turn(
    turn: asyncio.Lock, body: bytes, role: Role, settings: BrokerSettings, request: web.Request
) -> SoapRequest:
    """Parse a backend request in its turn: one such parse per event-loop iteration.

    Bodies whose last bytes arrive together wake their handlers in one loop iteration, and those
    would parse back to back ahead of the lease watcher's tick and the operator's heartbeat: N
    bodies of the largest size could stall the loop N times as long as one. Holding the turn
    across a yield makes the next backend parse wait for a later iteration, after the timers
    that fell due and the heartbeats that arrived, so the loop goes about one parse at most
    without them, however many bundles come at once (docs/broker.md, "Request limits"). A yield
    alone was not enough after a long parse: the watcher then saw two parses between its ticks.
    """
    async with turn:
        started = time.perf_counter()
        try:
            return _parse(body, role, settings, request)
        finally:
            # After a long parse the lease watcher's timer is overdue; a timer of our own that
            # falls due after it makes this task resume (and hand the turn on) only once the
            # watcher has run. A short parse yields once, so the hot path pays no timer.
            long = time.perf_counter() - started > _LONG_PARSE_SECONDS
            await asyncio.sleep(_AFTER_LONG_PARSE_SECONDS if long else 0)


class _BodyDeadlineError(Exception):
    """The body did not arrive within --body-timeout-seconds."""


async def _read_body(request: web.Request, role: Role, settings: BrokerSettings) -> bytes:
    """The body, within the role's size limit and the body deadline, or a ``HOSTILE_XML`` fault."""
    if role is Role.BACKEND:
        limit, flag = settings.body_limit_bytes, "--body-limit-bytes"
    else:
        limit, flag = settings.operator_body_limit_bytes, "--operator-body-limit-bytes"
    too_large = SoapFaultError(
        FaultCode.HOSTILE_XML,
        f"request body exceeds the broker's limit of {limit} bytes for the {role.value}'s requests ({flag})",
    )
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large  # refused unread
    try:
        async with asyncio.timeout(settings.body_timeout_seconds):
            body = await request.read()  # aiohttp stops at client_max_size, the larger limit
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except TimeoutError:
        raise _BodyDeadlineError from None
    if len(body) > limit:
        raise too_large
    return body


async def soap_post(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    settings = broker.settings
    started = time.perf_counter()
    try:
        refused = request.app[REFUSED_KEY]
        check_client_subject(request, request.app[CREDENTIALS_KEY].failures, _needed_role(refused))
        role = _caller_role(request, request.app[CREDENTIALS_KEY])
        if refused and role in refused:
            raise SoapFaultError(FaultCode.WRONG_PORT, refused[role])
        try:
            body = await _read_body(request, role, settings)
        except _BodyDeadlineError:
            fault = SoapFaultError(
                FaultCode.HOSTILE_XML,
                f"request body not received within the broker's limit of {settings.body_timeout_seconds} "
                "seconds (--body-timeout-seconds)",
            )
            return _fault_response(fault, close=True)
        if role is Role.BACKEND:
            parsed = await _parse_in_turn(request.app[PARSE_TURN_KEY], body, role, settings, request)
        else:
            parsed = _parse(body, role, settings, request)  # 64 KiB at most: under a millisecond
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
    # Anyone who reaches the port may ask: a stable code, never the error (the broker's log has it).
    return web.Response(status=503, text=f"not ready: {broker.not_ready_code}\n")


async def metrics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    broker.metrics.journal_group_commits.set(broker.journal.fsyncs)
    return web.Response(body=broker.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


def _soap_app(broker: Broker, credentials: BrokerCredentials, refused: Mapping[Role, str]) -> web.Application:
    settings = broker.settings
    app = web.Application(client_max_size=max(settings.body_limit_bytes, settings.operator_body_limit_bytes))
    app[BROKER_KEY] = broker
    app[CREDENTIALS_KEY] = credentials
    app[REFUSED_KEY] = refused
    app[PARSE_TURN_KEY] = asyncio.Lock()
    app.router.add_post(SOAP_PATH, soap_post)
    app.router.add_get(SOAP_PATH, soap_get)
    # On both ports: a scraper admitted to either (the NetworkPolicy admits the operator's pods to
    # the admin port) can read them, and scrapers that knew only the one port keep working.
    app.router.add_get("/metrics", metrics)
    return app


def build_app(broker: Broker, tls: ListenerTls | None = None) -> web.Application:
    """The main listener's application; with an admin port, it also runs the admin listener.

    ``tls`` (with ``--tls-dir``): the admin listener serves its context, and its files are
    polled for rotations while the application runs; the main listener's site serves its
    ``main`` context (``listener.serve``).
    """
    settings = broker.settings
    credentials = BrokerCredentials.from_settings(
        settings, failures=AuthFailureLog(broker.metrics.auth_failures)
    )
    admin_port = settings.admin_port
    app = _soap_app(broker, credentials, {} if admin_port is None else _refused_on_main(admin_port))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings.tls is not None and settings.tls.allowed_client_subjects:
        app[ALLOWED_SUBJECTS_KEY] = settings.tls.allowed_client_subjects
    admin_runner: ListenerRunner | None = None
    tls_poll: asyncio.Task[None] | None = None

    async def on_startup(app: web.Application) -> None:
        nonlocal admin_runner, tls_poll
        if tls is not None:
            tls_poll = asyncio.create_task(tls.poll(broker.metrics), name="tls-files")
        await broker.start()
        if admin_port is not None:
            admin_app = build_admin_app(broker, credentials, tls)
            # No signal handling of its own: the main listener's runner owns SIGTERM and stops this
            # one first thing on shutdown (below), as it stops its own sites.
            admin_runner = ListenerRunner(
                admin_app,
                max_connections=settings.max_connections,
                keepalive_timeout=settings.header_timeout_seconds,
                access_log=None,
                shutdown_timeout=settings.drain_seconds,
            )
            await admin_runner.setup()
            await listener.site(
                admin_runner,
                settings.host,
                admin_port,
                None if tls is None else tls.admin.context,
                tls.settings.handshake_timeout_seconds if tls is not None else 0,
            ).start()
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
        if tls_poll is not None:
            tls_poll.cancel()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    return app


def build_admin_app(
    broker: Broker, credentials: BrokerCredentials, tls: ListenerTls | None = None
) -> web.Application:
    """The admin listener's application: Heartbeat, the admin operations, the WSDL, /metrics, and
    the operator's ``/watch`` stream (watch.py). With ``tls``, every reply names the CA bundle the
    listener trusts now (``TRUST_BUNDLE_HEADER``, see ``listener_tls``)."""
    app = _soap_app(broker, credentials, _refused_on_admin(broker.settings.port))
    add_watch(app, credentials, broker.settings.name)
    if tls is not None:
        app.on_response_prepare.append(partial(_name_trust_bundle, tls))
    return app


async def _name_trust_bundle(tls: ListenerTls, request: web.Request, response: web.StreamResponse) -> None:
    # Read at each reply: the context new handshakes use now (a reload swaps it between two replies).
    version = tls.trust_bundle_version
    if version is not None:
        response.headers[TRUST_BUNDLE_HEADER] = version
