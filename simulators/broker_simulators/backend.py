"""``backend-simulator``: a stand-in for the SAP backend, as a real HTTP server.

Outbound (backend to cloud): it produces ``--streams`` streams of
``--messages-per-stream`` messages each, with ``seq`` 1, 2, 3, ... and
deterministic payloads of about ``--payload-bytes`` bytes, and sends them to
the broker as SOAP ``SendMessages`` bundles (an lxml-free string template that
is valid against the WSDL; the test suite checks it with zeep). Streams are
split over ``--lanes`` senders; a stream belongs to one lane and a lane has one
bundle in flight, so the backend itself never reorders. It keeps every message
until the broker confirms it (``POST /relay/confirm``), answers the broker's
resend request (``POST /relay/resend``) by rewinding every stream to its first
unconfirmed ``seq`` and replying with those cursors, follows ``Gap`` answers to
the expected ``seq``, and on ``BROKER_INACTIVE`` or a connection failure moves
on to the next ``--broker-url`` (the way the ``<cluster>-active`` Service would
route it to the new active). Every bundle carries the backend's credential,
``Authorization: Bearer <token>`` (``--backend-token-file``, or the
``BROKER_BACKEND_TOKEN`` env var: the same Secret the brokers read), which is
required when ``--broker-url`` is given: a broker refuses SendMessages without it.
``https://`` broker URLs are verified against ``--broker-ca-file``, and
``--client-cert-file`` / ``--client-key-file`` present a client certificate, for a broker with
``--allowed-client-subjects`` (``calling_tls.py``); the token is sent as well. Those files are
read again every ``--tls-reload-seconds`` while the simulator sends, and new connections use what
changed (a CA imported beside the old one during a CA key replacement), with no restart.

Retries: a request that timed out is retried at once, on a new connection:
the timeout has already waited, and the old connection may be pinned (by
kube-proxy) to a frozen pod. A connect has a timeout of its own
(``--connect-timeout-seconds``, 0.1 s): while a Service has no ready
endpoint (the old active gone, the new one not yet labelled), kube-proxy
rejects a pod's SYN with an ICMP error that the kernel sends at most once a
second per destination, so a later SYN is dropped silently and TCP would
resend it only after its 1 s initial retransmission timeout. So each lane has a client session of its own
(one connection, as it has one bundle in flight) and replaces it after a
timeout, without touching the other lanes' connections. Fast failures (a
refused connection, a 5xx, ``BROKER_INACTIVE``) are retried after an
exponential backoff from 20 ms, capped at 250 ms (``--backoff-max-seconds``), so that a
broker in trouble is not hammered; what the lanes waited shows in ``/sim/status``.
Each kind of failure (a refused certificate, a fault code) is logged once per broker URL, with
what to check; the retries are counted, not logged.

Inbound (cloud to backend): ``POST /relay/inbound`` takes deliveries through
the shared :class:`~broker_simulators.target_rules.Receiver` (in order, dedup,
poison, recorded to ``<record-dir>/inbound-received.log``).

Control and evidence for tests: ``POST /sim/start`` starts sending (unless
``--autostart``), ``GET /sim/status`` reports counts and per-bundle accept
latencies, ``GET /sim/received`` the inbound messages taken per stream.

Not a model of SAP: no IDoc formats, no qRFC; only the ordering and
confirmation behaviour the broker depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from lxml import etree

from broker_contracts import environment, relay, soap
from broker_contracts.logs import (
    DEFAULT_LOG_SETTINGS,
    LogSettings,
    add_log_arguments,
    configure_logging,
    log_settings_from,
)
from broker_contracts.soap import AcceptStatus, FaultCode
from broker_simulators.calling_tls import (
    BrokerClientTls,
    FailureLog,
    add_broker_tls_arguments,
    broker_client_tls,
    calling_context,
    describe_send_failure,
    follow_broker_trust,
)
from broker_simulators.serving_tls import RelayTransports, add_tls_dir_argument, serving_context
from broker_simulators.target_rules import (
    BadRequestError,
    EpochFence,
    Receiver,
    bad_request,
    json_reply,
    parse_messages,
    poison_payload,
    read_json,
    use_fastest_event_loop,
)

logger = logging.getLogger("backend-simulator")

_BACKOFF_FIRST_SECONDS = 0.02

_NS = {"t": soap.NAMESPACE, "s": soap.SOAP_ENV_NAMESPACE}
_RESULTS = "/s:Envelope/s:Body/t:SendMessagesResponse/t:result"
_X_RESULTS = etree.XPath(_RESULTS, namespaces=_NS)
_X_RESULT_STREAMS = etree.XPath(f"{_RESULTS}/t:stream/text()", namespaces=_NS, smart_strings=False)
_X_RESULT_SEQS = etree.XPath(f"{_RESULTS}/t:seq/text()", namespaces=_NS, smart_strings=False)
_X_RESULT_STATUSES = etree.XPath(f"{_RESULTS}/t:status/text()", namespaces=_NS, smart_strings=False)
_X_FAULT_CODE = etree.XPath("string(//t:BrokerFault/t:code)", namespaces=_NS)
_X_FAULT_MESSAGE = etree.XPath("string(//t:BrokerFault/t:message)", namespaces=_NS)
_ENVELOPE_HEAD = (
    f'<?xml version="1.0" encoding="UTF-8"?><soap:Envelope xmlns:soap="{soap.SOAP_ENV_NAMESPACE}" '
    f'xmlns:t="{soap.NAMESPACE}"><soap:Body><t:SendMessages>'
)
_ENVELOPE_TAIL = "</t:SendMessages></soap:Body></soap:Envelope>"


@dataclass
class BackendSettings:
    host: str = "127.0.0.1"
    port: int = 8081
    broker_urls: list[str] = field(default_factory=list)
    account: str = "acme"
    company: str = "1000"
    streams: int = 4
    stream_prefix: str = "orders-"
    messages_per_stream: int = 100
    bundle_size: int = 100
    per_stream_in_bundle: int = 10
    payload_bytes: int = 500
    lanes: int = 4
    request_timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 0.1
    backoff_max_seconds: float = 0.25  # the cap of the doubling wait after a fast failure
    record_dir: Path | None = None
    autostart: bool = False
    poison: list[tuple[str, int, int | None]] = field(default_factory=list)  # (stream, seq, refusals)
    token: str = ""  # the backend's credential towards the brokers (SendMessages)
    tls_dir: Path | None = None  # serve HTTPS (serving_tls.py)
    broker_tls: BrokerClientTls = field(default_factory=BrokerClientTls)  # https:// brokers (calling_tls.py)
    log: LogSettings = DEFAULT_LOG_SETTINGS  # --log-format / --log-level (broker_contracts.logs)


@dataclass(slots=True)
class StreamSource:
    name: str
    total: int
    next_to_send: int = 1
    first_unconfirmed: int = 1
    generation: int = 0


# The broker renders a gap-free reply in exactly this form (soap_codec.render_send_messages); one
# regex over the bytes reads it for a fraction of an lxml parse, which was the backend's largest cost.
# Anything else (a gap, a fault, escaped names, another rendering) takes the lxml path.
_PLAIN_RESULT = re.compile(
    rb"<tns:result><tns:stream>([^<&]*)</tns:stream><tns:seq>([0-9]+)</tns:seq>"
    rb"<tns:status>(Accepted|Duplicate)</tns:status></tns:result>"
)


def _plain_results(reply: bytes) -> tuple[list[str], list[bytes], int] | None:
    """``(streams, seqs, accepted count)`` of a gap-free SendMessagesResponse, or ``None`` to parse it."""
    if b"<tns:SendMessagesResponse>" not in reply or b"<soap:Fault>" in reply:
        return None
    found = _PLAIN_RESULT.findall(reply)
    if not found or len(found) != reply.count(b"<tns:result>"):
        return None
    streams = [stream.decode() for stream, _, _ in found]
    accepted = sum(1 for _, _, status in found if status == b"Accepted")
    return streams, [seq for _, seq, _ in found], accepted


def build_envelope(account: str, company: str, messages: Sequence[tuple[str, int, str, str]]) -> bytes:
    """A SendMessages request; names and payloads are generated XML-safe, so no escaping pass."""
    parts = [_ENVELOPE_HEAD, f"<t:account>{account}</t:account><t:company>{company}</t:company>"]
    for stream, seq, msg_id, payload in messages:
        parts.append(
            f"<t:message><t:stream>{stream}</t:stream><t:seq>{seq}</t:seq><t:msgId>{msg_id}</t:msgId>"
            f"<t:payload>{payload}</t:payload></t:message>"
        )
    parts.append(_ENVELOPE_TAIL)
    return "".join(parts).encode()


# The XML around one message's payload in a bundle (tags, stream name, seq, msgId), generously.
_MESSAGE_OVERHEAD_BYTES = 256


class BackendSimulator:
    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.fence = EpochFence()
        self.transports = RelayTransports()
        self.sources = [
            StreamSource(f"{settings.stream_prefix}{i:04d}", settings.messages_per_stream)
            for i in range(settings.streams)
        ]
        self.by_name = {s.name: s for s in self.sources}
        record = settings.record_dir / "inbound-received.log" if settings.record_dir else None
        self.inbound = Receiver(record)
        self._filler = ("x" * settings.payload_bytes)[: max(0, settings.payload_bytes - 40)]
        # As many messages as the broker takes in one bundle (the contract's count and byte bounds):
        # a large --payload-bytes makes smaller bundles rather than bundles the broker refuses.
        per_message = settings.payload_bytes + _MESSAGE_OVERHEAD_BYTES
        self._bundle_room = max(
            1,
            min(
                settings.bundle_size, soap.BUNDLE_MAX_MESSAGES, (soap.BUNDLE_MAX_BYTES - 4096) // per_message
            ),
        )
        self._poison = {(s, q): n for s, q, n in settings.poison}
        self._broker_index = 0
        self._lanes: list[asyncio.Task[None]] = []
        self._trust_follower: asyncio.Task[None] | None = None
        self._started_at: float | None = None
        self._all_confirmed_at: float | None = None
        self.latencies: list[float] = []
        self.sent_messages = 0
        self.accepted = 0
        self.duplicates = 0
        self.gaps = 0
        self.rewinds_below_confirmed = 0
        self.faults: dict[str, int] = {}
        self.resends = 0
        self.timeout_retries = 0  # requests retried at once after a timeout
        self.backoffs = 0  # waits before retrying a fast failure, their total and longest
        self.backoff_seconds = 0.0
        self.backoff_max_seconds = 0.0
        self._wake = asyncio.Event()
        # One context for every lane, its newest taken per bundle (calling_tls.py); http:// URLs
        # ignore it. Built now: files that no longer load stop the start (TlsFilesError).
        self._broker_tls = calling_context(settings.broker_tls)
        self._failures = FailureLog(logger)
        self._send_headers = {
            "Content-Type": "text/xml; charset=utf-8",
            "SOAPAction": f"{soap.NAMESPACE}/SendMessages",
            soap.AUTH_HEADER: f"{soap.AUTH_SCHEME} {settings.token}",
        }

    # ---- outbound sending --------------------------------------------------------------------

    def payload(self, stream: str, seq: int) -> str:
        refusals = self._poison.get((stream, seq), 0)
        if refusals != 0:
            return poison_payload(refusals, f"{stream}:{seq}:{self._filler}")
        return f"{stream}:{seq}:{self._filler}"

    def _bundle_body(self, picked: list[tuple[StreamSource, int, int]]) -> tuple[bytes, int]:
        """The SendMessages request for ``picked`` and its message count.

        Without poison marks each message is one f-string (no tuple, no separate msgId and payload
        strings): the simulator shares the benchmark's cores with the broker, so its cost counts.
        The text is exactly what :func:`build_envelope` writes for the same messages.
        """
        if self._poison:
            messages = [
                (source.name, seq, f"{source.name}-{seq}", self.payload(source.name, seq))
                for source, first, take in picked
                for seq in range(first, first + take)
            ]
            return build_envelope(self.settings.account, self.settings.company, messages), len(messages)
        filler = self._filler
        parts = [
            _ENVELOPE_HEAD,
            f"<t:account>{self.settings.account}</t:account><t:company>{self.settings.company}</t:company>",
        ]
        parts += [
            f"<t:message><t:stream>{name}</t:stream><t:seq>{seq}</t:seq><t:msgId>{name}-{seq}</t:msgId>"
            f"<t:payload>{name}:{seq}:{filler}</t:payload></t:message>"
            for name, first, take in ((source.name, first, take) for source, first, take in picked)
            for seq in range(first, first + take)
        ]
        parts.append(_ENVELOPE_TAIL)
        return "".join(parts).encode(), len(parts) - 3

    def _bundle_for(
        self, lane_sources: list[StreamSource], start: int
    ) -> list[tuple[StreamSource, int, int]]:
        """Pick ``(source, first seq, count)`` slices, rotating the starting stream for fairness."""
        picked = []
        room = self._bundle_room
        count = len(lane_sources)
        for offset in range(count):
            source = lane_sources[(start + offset) % count]
            remaining = source.total - source.next_to_send + 1
            if remaining <= 0:
                continue
            take = min(remaining, self.settings.per_stream_in_bundle, room)
            picked.append((source, source.next_to_send, take))
            room -= take
            if room == 0:
                break
        return picked

    def _broker_url(self) -> str:
        urls = self.settings.broker_urls
        url = urls[self._broker_index % len(urls)].rstrip("/")
        # Accept a broker's base URL or its SOAP endpoint (what the WSDL's address names).
        return url if url.endswith(soap.SOAP_PATH) else url + soap.SOAP_PATH

    def _next_broker(self, failed_url: str) -> None:
        if self._broker_url() == failed_url:
            self._broker_index += 1

    def _lane_session(self) -> aiohttp.ClientSession:
        """A lane's own session: one connection, since a lane has one bundle in flight."""
        return aiohttp.ClientSession(
            # No ssl= here: each request passes the newest context (see _lane).
            connector=aiohttp.TCPConnector(limit=1),
            timeout=aiohttp.ClientTimeout(
                total=self.settings.request_timeout_seconds,
                sock_connect=self.settings.connect_timeout_seconds,
            ),
        )

    async def _back_off(self, delay: float) -> float:
        """Wait ``delay`` before retrying a fast failure; return the next delay (doubled, capped)."""
        self.backoffs += 1
        self.backoff_seconds += delay
        self.backoff_max_seconds = max(self.backoff_max_seconds, delay)
        await asyncio.sleep(delay)
        return min(self.settings.backoff_max_seconds, delay * 2)

    def _count_fault(self, name: str) -> None:
        self.faults[name] = self.faults.get(name, 0) + 1

    async def _lane(self, lane_sources: list[StreamSource]) -> None:
        session = self._lane_session()
        start = 0
        backoff = min(_BACKOFF_FIRST_SECONDS, self.settings.backoff_max_seconds)
        try:
            while True:
                picked = self._bundle_for(lane_sources, start)
                start += 1
                if not picked:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                generations = {source.name: source.generation for source, _, _ in picked}
                body, count = self._bundle_body(picked)
                url = self._broker_url()
                sent = time.perf_counter()
                try:
                    # Per request: after a swap the next connection uses the new trust (calling_tls.py).
                    tls = self._broker_tls.current
                    async with session.post(url, data=body, headers=self._send_headers, ssl=tls) as response:
                        reply = await response.read()
                except TimeoutError as error:
                    # The timeout already waited: retry at once, and on a new connection, since
                    # the old one may be pinned to a frozen pod (aiohttp's timeout errors are
                    # TimeoutErrors, so this comes before ClientError).
                    self._count_fault(type(error).__name__)
                    self.timeout_retries += 1
                    self._next_broker(url)
                    await session.close()
                    session = self._lane_session()
                    continue
                except (aiohttp.ClientError, OSError) as error:
                    self._count_fault(type(error).__name__)
                    self._failures.once(
                        url, type(error).__name__, describe_send_failure(error, url, self.settings.broker_tls)
                    )
                    self._next_broker(url)
                    backoff = await self._back_off(backoff)
                    continue
                elapsed = time.perf_counter() - sent
                if not self._take_reply(
                    reply,
                    status=response.status,
                    sent=count,
                    elapsed=elapsed,
                    generations=generations,
                    url=url,
                ):
                    backoff = await self._back_off(backoff)
                    continue
                backoff = min(_BACKOFF_FIRST_SECONDS, self.settings.backoff_max_seconds)
        finally:
            await session.close()

    def _take_reply(
        self,
        reply: bytes,
        *,
        status: int,
        sent: int,
        elapsed: float,
        generations: dict[str, int],
        url: str,
    ) -> bool:
        """Apply a SendMessages reply to the stream cursors; ``False`` for a fault (the lane backs off)."""
        if status == 200 and (fast := _plain_results(reply)) is not None:
            streams, seqs, accepted = fast
        else:
            try:
                root = etree.fromstring(reply)
            except etree.XMLSyntaxError:
                self._count_fault("unparseable-reply")
                return False
            streams = _X_RESULT_STREAMS(root)
            if status != 200 or not streams:
                code = str(_X_FAULT_CODE(root)) or f"HTTP {status}"
                self._count_fault(code)
                self._failures.once(url, code, f"{url}: {code}: {_X_FAULT_MESSAGE(root)}")
                if code in (FaultCode.BROKER_INACTIVE, FaultCode.JOURNAL_ERROR) or status >= 500:
                    self._next_broker(url)
                return False
            statuses = _X_RESULT_STATUSES(root)
            seqs = _X_RESULT_SEQS(root)
            if AcceptStatus.GAP in statuses or not len(streams) == len(statuses) == len(seqs):
                self.latencies.append(elapsed)
                self.sent_messages += sent
                self._apply_results(_X_RESULTS(root), generations)
                return True
            accepted = statuses.count(AcceptStatus.ACCEPTED)
        self.latencies.append(elapsed)
        self.sent_messages += sent
        # Without gaps every stream advances to its last seq in the bundle, which is its highest.
        self.accepted += accepted
        self.duplicates += len(streams) - accepted
        self._advance(dict(zip(streams, map(int, seqs), strict=True)), {}, generations)
        return True

    def _apply_results(self, results: list[etree._Element], generations: dict[str, int]) -> None:
        advanced: dict[str, int] = {}
        gap_at: dict[str, int] = {}
        for element in results:
            stream = element[0].text or ""
            seq = int(element[1].text or 0)
            status = element[2].text
            if status == AcceptStatus.GAP:
                self.gaps += 1
                if stream not in gap_at:
                    gap_at[stream] = int(element[3].text or 1)
                continue
            if stream in gap_at:
                continue
            if status == AcceptStatus.ACCEPTED:
                self.accepted += 1
            else:
                self.duplicates += 1
            advanced[stream] = seq
        self._advance(advanced, gap_at, generations)

    def _advance(self, advanced: dict[str, int], gap_at: dict[str, int], generations: dict[str, int]) -> None:
        for name, generation in generations.items():
            source = self.by_name[name]
            if source.generation != generation:
                continue  # a resend rewound this stream meanwhile; its cursor wins
            if name in gap_at:
                expected = gap_at[name]
                if expected < source.first_unconfirmed:
                    self.rewinds_below_confirmed += 1
                source.next_to_send = expected
            elif name in advanced:
                source.next_to_send = advanced[name] + 1

    def start_sending(self) -> None:
        if self._lanes or not self.settings.broker_urls:
            return
        self._started_at = time.monotonic()
        lanes = max(1, min(self.settings.lanes, len(self.sources)))
        loop = asyncio.get_running_loop()
        self._lanes = [
            loop.create_task(self._lane(self.sources[i::lanes]), name=f"backend-lane-{i}")
            for i in range(lanes)
        ]
        broker_tls = self.settings.broker_tls
        if broker_tls.has_files:
            follow = follow_broker_trust(self._broker_tls, broker_tls.reload_seconds)
            self._trust_follower = loop.create_task(follow, name="backend-broker-trust")

    async def stop_sending(self) -> None:
        """Cancel the lanes and the trust follower, and wait for them to end."""
        tasks = [*self._lanes, *([self._trust_follower] if self._trust_follower else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- HTTP --------------------------------------------------------------------------------

    async def resend(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        self.resends += 1
        cursors = {}
        for source in self.sources:
            source.generation += 1
            source.next_to_send = source.first_unconfirmed
            cursors[source.name] = source.first_unconfirmed
        self._wake.set()
        reply: relay.ResendReply = {"streams": cursors}
        return json_reply(reply)

    async def confirm(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        try:
            body = await read_json(request)
            marks = body["streams"]
            if not isinstance(marks, dict):
                raise BadRequestError("'streams' must map stream names to seqs")
        except (BadRequestError, KeyError, TypeError) as error:
            return bad_request(BadRequestError(f"confirm body must be {{'streams': {{name: seq}}}}: {error}"))
        for name, upto in marks.items():
            source = self.by_name.get(name)
            if source is not None and isinstance(upto, int) and upto + 1 > source.first_unconfirmed:
                source.first_unconfirmed = upto + 1
        if self._all_confirmed_at is None and all(s.first_unconfirmed > s.total for s in self.sources):
            self._all_confirmed_at = time.monotonic()
        return json_reply({"ok": True})

    async def deliver_inbound(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        try:
            messages = parse_messages(await read_json(request))
        except BadRequestError as error:
            return bad_request(error)
        return json_reply(self.inbound.receive(messages))

    async def sim_start(self, request: web.Request) -> web.Response:
        self.start_sending()
        return json_reply({"started": True})

    async def sim_produce(self, request: web.Request) -> web.Response:
        """Add ``count`` more messages to every stream (or to ``stream``) and wake the senders."""
        body = await read_json(request)
        count = int(body.get("count", 0))
        for source in self.sources:
            if body.get("stream") in (None, source.name):
                source.total += count
        self._all_confirmed_at = None
        self._wake.set()
        return json_reply({"ok": True})

    def status(self) -> dict[str, object]:
        latencies = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else None

        confirmed = sum(s.first_unconfirmed - 1 for s in self.sources)
        return {
            "streams": len(self.sources),
            "total": sum(s.total for s in self.sources),
            "sent": self.sent_messages,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "confirmed": confirmed,
            "allConfirmed": all(s.first_unconfirmed > s.total for s in self.sources),
            "rewindsBelowConfirmed": self.rewinds_below_confirmed,
            "resends": self.resends,
            "faults": self.faults,
            "timeoutRetries": self.timeout_retries,
            "backoffs": self.backoffs,
            "backoffSeconds": round(self.backoff_seconds, 6),
            "backoffMaxSeconds": self.backoff_max_seconds,
            "seenEpoch": self.fence.seen,
            "staleEpochRefusals": self.fence.refused,
            "bundles": len(latencies),
            "acceptP50": pct(0.50),
            "acceptP99": pct(0.99),
            "sendingSeconds": (
                (self._all_confirmed_at or time.monotonic()) - self._started_at if self._started_at else None
            ),
            "inboundTaken": self.inbound.taken,
            "inboundDuplicates": self.inbound.duplicates,
            "inboundRejected": self.inbound.rejected,
            "cursors": {s.name: s.first_unconfirmed for s in self.sources},
            "relayTransports": dict(self.transports.counts),
            # Changed --broker-ca-file / --client-*-file taken up, and changed ones that did not load.
            "brokerTrustReloads": self._broker_tls.reloads,
            "brokerTrustReloadFailures": self._broker_tls.failures,
        }

    async def sim_status(self, request: web.Request) -> web.Response:
        return json_reply(self.status())

    async def sim_received(self, request: web.Request) -> web.Response:
        return json_reply(self.inbound.order)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self.transports.middleware])
        app.router.add_post(relay.BACKEND_RESEND_PATH, self.resend)
        app.router.add_post(relay.BACKEND_CONFIRM_PATH, self.confirm)
        app.router.add_post(relay.BACKEND_INBOUND_PATH, self.deliver_inbound)
        app.router.add_get(relay.HEALTH_PATH, self.healthz)
        app.router.add_post("/sim/start", self.sim_start)
        app.router.add_post("/sim/produce", self.sim_produce)
        app.router.add_get("/sim/status", self.sim_status)
        app.router.add_get("/sim/received", self.sim_received)

        async def on_startup(app: web.Application) -> None:
            if self.settings.autostart:
                self.start_sending()

        async def on_cleanup(app: web.Application) -> None:
            await self.stop_sending()
            self.inbound.close()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app


def parse_poison(spec: str) -> tuple[str, int, int | None]:
    """``stream:seq:times`` (times = a number or ``always``)."""
    try:
        stream, seq, times = spec.rsplit(":", 2)
        return stream, int(seq), None if times == "always" else int(times)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"poison {spec!r} must be stream:seq:times (times a number or 'always')"
        ) from None


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> BackendSettings:
    parser = argparse.ArgumentParser(prog="backend-simulator", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--broker-url", action="append", default=[], help="repeatable; tried in order")
    parser.add_argument("--account", default="acme")
    parser.add_argument("--company", default="1000")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--stream-prefix", default="orders-")
    parser.add_argument("--messages-per-stream", type=int, default=100)
    parser.add_argument("--bundle-size", type=int, default=100)
    parser.add_argument("--per-stream-in-bundle", type=int, default=10)
    parser.add_argument("--payload-bytes", type=int, default=500)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--request-timeout-seconds", type=float, default=10.0)
    parser.add_argument(
        "--connect-timeout-seconds",
        type=float,
        default=0.1,
        help="give up a TCP connect after this long and retry at once (a lost SYN is resent only after 1 s)",
    )
    parser.add_argument(
        "--backoff-max-seconds",
        type=float,
        default=0.25,
        help="a fast failure (refused, 5xx, BROKER_INACTIVE) is retried after 20 ms, doubling up to this",
    )
    parser.add_argument("--record-dir", type=Path, default=None)
    parser.add_argument("--autostart", action="store_true")
    parser.add_argument("--poison", type=parse_poison, action="append", default=[], help="stream:seq:times")
    parser.add_argument(
        "--backend-token-file",
        default=None,
        help="file with the backend's credential for SendMessages "
        "(env BROKER_BACKEND_TOKEN_FILE, or the value in BROKER_BACKEND_TOKEN)",
    )
    add_tls_dir_argument(parser)
    add_broker_tls_arguments(parser)
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    broker_tls = broker_client_tls(args, parser)
    if args.record_dir:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    environ = os.environ if environ is None else environ
    log = log_settings_from(parser, args, environ)
    token = read_backend_token(
        args.backend_token_file or environ.get(environment.BROKER_BACKEND_TOKEN_FILE), environ
    )
    if args.broker_url and not token:
        parser.error(
            "--broker-url needs the backend's credential: --backend-token-file FILE, "
            "BROKER_BACKEND_TOKEN_FILE or BROKER_BACKEND_TOKEN (brokers refuse SendMessages without it)"
        )
    return BackendSettings(
        host=args.host,
        port=args.port,
        broker_urls=args.broker_url,
        account=args.account,
        company=args.company,
        streams=args.streams,
        stream_prefix=args.stream_prefix,
        messages_per_stream=args.messages_per_stream,
        bundle_size=args.bundle_size,
        per_stream_in_bundle=args.per_stream_in_bundle,
        payload_bytes=args.payload_bytes,
        lanes=args.lanes,
        request_timeout_seconds=args.request_timeout_seconds,
        connect_timeout_seconds=args.connect_timeout_seconds,
        backoff_max_seconds=args.backoff_max_seconds,
        record_dir=args.record_dir,
        autostart=args.autostart,
        poison=args.poison,
        token=token,
        tls_dir=args.tls_dir,
        broker_tls=broker_tls,
        log=log,
    )


def read_backend_token(path: str | None, environ: Mapping[str, str]) -> str:
    """The credential from ``path`` (a mounted Secret) if given, else ``BROKER_BACKEND_TOKEN``."""
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise SystemExit(
                f"backend-simulator: --backend-token-file {path!r} cannot be read: {error}"
            ) from None
    return environ.get(environment.BROKER_BACKEND_TOKEN, "").strip()


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    configure_logging(settings.log)
    use_fastest_event_loop()
    simulator = BackendSimulator(settings)
    web.run_app(
        simulator.app(),
        host=settings.host,
        port=settings.port,
        ssl_context=serving_context(settings.tls_dir),
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
