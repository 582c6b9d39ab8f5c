"""``cloud-simulator``: a stand-in for the cloud service, as a real HTTP server.

Outbound (backend to cloud): ``POST /relay/outbound`` takes bundles through
the shared :class:`~broker_simulators.target_rules.Receiver` (each stream in order,
duplicates dropped by ``(stream, seq)``, poison refused, everything taken
recorded to ``<record-dir>/outbound-received.log`` and in memory for
``GET /sim/received``).

Inbound (cloud to backend): it holds ``--inbound-streams`` streams of
``--inbound-messages-per-stream`` messages and answers ``GET /relay/poll`` with
the unconfirmed ones, in ``seq`` order per stream, again and again until the
broker confirms them (``POST /relay/confirm``). A poll takes at most
``per_stream`` messages from each stream and rotates the stream it starts
with, so one stream stuck behind a held message cannot starve the others.

Both relay sides are behind the epoch fence: a broker epoch lower than one
already seen gets HTTP 409.

Not a model of any real cloud API; only the delivery semantics the broker
depends on.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from broker_contracts import relay
from broker_contracts.logs import (
    DEFAULT_LOG_SETTINGS,
    LogSettings,
    add_log_arguments,
    configure_logging,
    log_settings_from,
)
from broker_simulators.backend import parse_poison
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

logger = logging.getLogger("cloud-simulator")


@dataclass
class CloudSettings:
    host: str = "127.0.0.1"
    port: int = 8082
    inbound_streams: int = 0
    inbound_prefix: str = "invoices-"
    inbound_messages_per_stream: int = 0
    payload_bytes: int = 200
    record_dir: Path | None = None
    poison: list[tuple[str, int, int | None]] = field(default_factory=list)
    tls_dir: Path | None = None  # serve HTTPS (serving_tls.py)
    log: LogSettings = DEFAULT_LOG_SETTINGS  # --log-format / --log-level (broker_contracts.logs)


@dataclass(slots=True)
class InboundSource:
    name: str
    total: int
    low: int = 1  # every seq below is confirmed
    confirmed: set[int] = field(default_factory=set)  # confirmed seqs at or above ``low``

    def confirm(self, seq: int) -> None:
        if seq < self.low:
            return
        self.confirmed.add(seq)
        while self.low in self.confirmed:
            self.confirmed.discard(self.low)
            self.low += 1

    def unconfirmed(self, limit: int) -> list[int]:
        found: list[int] = []
        seq = self.low
        while seq <= self.total and len(found) < limit:
            if seq not in self.confirmed:
                found.append(seq)
            seq += 1
        return found


class CloudSimulator:
    def __init__(self, settings: CloudSettings) -> None:
        self.settings = settings
        self.fence = EpochFence()
        self.transports = RelayTransports()
        record = settings.record_dir / "outbound-received.log" if settings.record_dir else None
        self.outbound = Receiver(record)
        self.sources = [
            InboundSource(f"{settings.inbound_prefix}{i:04d}", settings.inbound_messages_per_stream)
            for i in range(settings.inbound_streams)
        ]
        self.by_name = {s.name: s for s in self.sources}
        self._poison = {(s, q): n for s, q, n in settings.poison}
        self._filler = "y" * max(0, settings.payload_bytes - 40)
        self._rotation = 0
        self.polls = 0
        self.resent = 0  # inbound messages handed out more than once

    def payload(self, stream: str, seq: int) -> str:
        refusals = self._poison.get((stream, seq), 0)
        if refusals != 0:
            return poison_payload(refusals, f"{stream}:{seq}")
        return f"{stream}:{seq}:{self._filler}"

    async def take_outbound(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        try:
            messages = parse_messages(await read_json(request))
        except BadRequestError as error:
            return bad_request(error)
        return json_reply(self.outbound.receive(messages))

    async def poll(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        try:
            limit = max(1, int(request.query.get("max", "500")))
            per_stream = max(1, int(request.query.get("per_stream", "50")))
        except ValueError as error:
            return bad_request(error)
        self.polls += 1
        messages: list[relay.WireMessage] = []
        count = len(self.sources)
        for offset in range(count):
            if len(messages) >= limit:
                break
            source = self.sources[(self._rotation + offset) % count]
            for seq in source.unconfirmed(min(per_stream, limit - len(messages))):
                messages.append([source.name, seq, f"{source.name}-{seq}", self.payload(source.name, seq)])
        self._rotation += 1
        reply: relay.PollReply = {"messages": messages}
        return json_reply(reply)

    async def confirm(self, request: web.Request) -> web.Response:
        if (refusal := self.fence.check(request)) is not None:
            return refusal
        try:
            body = await read_json(request)
            pairs = body["confirmed"]
            for stream, seq in pairs:
                source = self.by_name.get(stream)
                if source is not None and isinstance(seq, int):
                    source.confirm(seq)
        except (BadRequestError, KeyError, TypeError, ValueError) as error:
            return bad_request(
                BadRequestError(f"confirm body must be {{'confirmed': [[stream, seq], ...]}}: {error}")
            )
        return json_reply({"ok": True})

    async def sim_produce(self, request: web.Request) -> web.Response:
        """Add ``count`` more inbound messages to every stream."""
        body = await read_json(request)
        count = int(body.get("count", 0))
        for source in self.sources:
            source.total += count
        return json_reply({"ok": True})

    def status(self) -> dict[str, object]:
        return {
            "outboundTaken": self.outbound.taken,
            "outboundDuplicates": self.outbound.duplicates,
            "outboundRejected": self.outbound.rejected,
            "inboundTotal": sum(s.total for s in self.sources),
            "inboundConfirmed": sum(s.low - 1 + len(s.confirmed) for s in self.sources),
            "inboundAllConfirmed": all(s.low > s.total for s in self.sources),
            "polls": self.polls,
            "seenEpoch": self.fence.seen,
            "staleEpochRefusals": self.fence.refused,
            "relayTransports": dict(self.transports.counts),
        }

    async def sim_status(self, request: web.Request) -> web.Response:
        return json_reply(self.status())

    async def sim_received(self, request: web.Request) -> web.Response:
        return json_reply(self.outbound.order)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self.transports.middleware])
        app.router.add_post(relay.CLOUD_OUTBOUND_PATH, self.take_outbound)
        app.router.add_get(relay.CLOUD_POLL_PATH, self.poll)
        app.router.add_post(relay.CLOUD_CONFIRM_PATH, self.confirm)
        app.router.add_get(relay.HEALTH_PATH, self.healthz)
        app.router.add_post("/sim/produce", self.sim_produce)
        app.router.add_get("/sim/status", self.sim_status)
        app.router.add_get("/sim/received", self.sim_received)

        async def on_cleanup(app: web.Application) -> None:
            self.outbound.close()

        app.on_cleanup.append(on_cleanup)
        return app


def parse_args(argv: Sequence[str] | None) -> CloudSettings:
    parser = argparse.ArgumentParser(prog="cloud-simulator", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8082)
    parser.add_argument("--inbound-streams", type=int, default=0)
    parser.add_argument("--inbound-prefix", default="invoices-")
    parser.add_argument("--inbound-messages-per-stream", type=int, default=0)
    parser.add_argument("--payload-bytes", type=int, default=200)
    parser.add_argument("--record-dir", type=Path, default=None)
    parser.add_argument("--poison", type=parse_poison, action="append", default=[], help="stream:seq:times")
    add_tls_dir_argument(parser)
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    log = log_settings_from(parser, args, os.environ)
    if args.record_dir:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    return CloudSettings(
        host=args.host,
        port=args.port,
        inbound_streams=args.inbound_streams,
        inbound_prefix=args.inbound_prefix,
        inbound_messages_per_stream=args.inbound_messages_per_stream,
        payload_bytes=args.payload_bytes,
        record_dir=args.record_dir,
        poison=args.poison,
        tls_dir=args.tls_dir,
        log=log,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    configure_logging(settings.log)
    use_fastest_event_loop()
    web.run_app(
        CloudSimulator(settings).app(),
        host=settings.host,
        port=settings.port,
        ssl_context=serving_context(settings.tls_dir),
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
