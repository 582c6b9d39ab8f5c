"""The operator's watch connection to each broker: a crash is known when the process dies.

One task per broker holds ``GET /watch`` open on the broker's admin port (served by
``broker_service.watch``). When the broker's process dies its kernel closes the connection, so
the operator hears of a crash at once rather than at the next heartbeat or from the kubelet's
next relist (about a second). What it then tells the engine:

- the stream **ended with a FIN** and a fresh connection to the same address and port is
  **refused**: :class:`ProcessGone`, a proof that the process is not active (the broker never
  closes its admin listener while it may act; docs/failover-engine.md, "Proofs of death");
- anything else (a reset, a read timeout, the port still accepting, the connect timing out):
  :class:`ConnectionLost`, proof of nothing; the engine counts a failed heartbeat and checks the
  broker at once.

The request is HTTP/1.0, so the response body ends with the connection, and it is read from
asyncio's own streams, where a FIN is an end of stream and a reset raises. Not through aiohttp:
it ends a close-delimited body the same way for both (it feeds the end of stream first), and the
proof needs the difference. The request is one fixed line and two headers. A broker
without ``/watch`` (an image from before it) is not watched; the heartbeats and the kubelet's
reports cover it as before. Reconnects back off from 0.1 s to 1 s, and start over once a stream
has lasted a while. Only pods mode watches: there a target's address is the pod's own, with no
proxy in between whose refusal could be taken for the pod's.

A broker serving TLS (an ``https`` target) is watched over TLS with the heartbeat client's context
and the target's server name (``HeartbeatClient.tls``; docs/operator.md): a plain request to its
TLS port gets no HTTP answer, and the broker would go unwatched, its crash proven no faster than
by the kubelet. Under TLS a killed
process still ends the stream with a FIN (no ``close_notify``), which asyncio's TLS stream reads
as its end, and the probes after it are plain TCP connects, which need no TLS
(tests/integration/broker/test_tls_watch.py). A connection that TLS refuses (the operator's
certificate not accepted) never held a stream: it is retried quietly, and the heartbeats report
the TLS problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from broker_contracts.redact import redact_url
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME
from broker_operator.core import BrokerTarget, ConnectionLost, Observation, ProcessGone
from broker_operator.heartbeat_client import HeartbeatClient

logger = logging.getLogger(__name__)

WATCH_PATH = "/watch"
# The broker writes a newline every 5 s; three missed ones and the stream is taken for lost.
READ_TIMEOUT_SECONDS = 15.0
CONNECT_TIMEOUT_SECONDS = 1.0
BACKOFF_FIRST_SECONDS = 0.1
BACKOFF_MAX_SECONDS = 1.0  # a restarted broker is watched again within a second (a SYN a second is cheap)
STEADY_SECONDS = 10.0  # a stream that lasted this long resets the backoff
PROBES = 3  # connects to the admin port after a stream ended, before it counts as still listening
PROBE_GAP_SECONDS = 0.02

Signal = Callable[[Observation], None]


class _Quiet(enum.Enum):
    """A stream's end that tells the engine nothing."""

    RETRY = "retry"  # never held a stream from this process, or a token rotation: try again
    UNSUPPORTED = "unsupported"  # the broker serves no /watch: stop


def _status_code(line: bytes) -> int | None:
    """The code of an HTTP status line (``HTTP/1.0 200 OK``); None if it is not one."""
    fields = line.split()
    return (
        int(fields[1])
        if len(fields) >= 2 and fields[0].startswith(b"HTTP/") and fields[1].isdigit()
        else None
    )


def watch_url(heartbeat_url: str) -> str:
    """``http://<pod IP>:<admin port>/watch`` for the broker's Heartbeat URL."""
    parts = urlsplit(heartbeat_url)
    return urlunsplit((parts.scheme, parts.netloc, WATCH_PATH, "", ""))


class BrokerWatches:
    """The watch tasks of one cluster's brokers, kept in line with its targets by :meth:`follow`."""

    def __init__(
        self, client: HeartbeatClient, signal: Signal, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._signal = signal
        self._clock = clock
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}  # (broker, url) -> its task
        self._server_names: dict[tuple[str, str], str | None] = {}  # (broker, url) -> its TLS name
        self._held: set[str] = set()  # brokers whose stream is open now (for status and tests)

    def holding(self, name: str) -> bool:
        """Whether a stream from ``name``'s process is open now."""
        return name in self._held

    def follow(self, targets: Sequence[BrokerTarget]) -> None:
        """Watch exactly ``targets``: new ones (or new addresses) start, removed ones stop."""
        wanted = {(t.name, t.url) for t in targets}
        self._server_names = {(t.name, t.url): t.tls_server_name for t in targets}
        for key in set(self._tasks) - wanted:
            self._tasks.pop(key).cancel()
        for name, url in wanted - set(self._tasks):
            self._tasks[(name, url)] = asyncio.create_task(self._watch(name, url), name=f"watch {name}")

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, name: str, url: str) -> None:
        backoff = BACKOFF_FIRST_SECONDS
        while True:
            opened = self._clock()
            outcome = await self._hold(name, url)
            if outcome is _Quiet.UNSUPPORTED:
                return
            if not isinstance(outcome, _Quiet):
                logger.info("%s: %s", name, outcome.reason)
                self._signal(outcome)
            if self._clock() - opened >= STEADY_SECONDS:
                backoff = BACKOFF_FIRST_SECONDS
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    async def _open(self, name: str, url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the broker's admin port (over TLS for an ``https`` target); None if none
        could be made: it never held a stream from this process, so a refusal proves nothing (nor
        does a TLS failure, an ``ssl.SSLError``, which the heartbeats report)."""
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        assert host is not None and port is not None, url
        context: ssl.SSLContext | None = None
        server_name: str | None = None
        if parts.scheme == "https":
            if self._client.tls is None:
                return None  # no client certificate yet: nothing to watch with
            context = self._client.tls.context()
            server_name = self._server_names.get((name, url)) or host
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                return await asyncio.open_connection(host, port, ssl=context, server_hostname=server_name)
        except (OSError, TimeoutError):
            return None

    async def _hold(self, name: str, url: str) -> ConnectionLost | ProcessGone | _Quiet:
        """One stream, held to its end: what to tell the engine, if anything."""
        opened = await self._open(name, url)
        if opened is None:
            return _Quiet.RETRY
        reader, writer = opened
        tls = urlsplit(url).scheme == "https"
        try:
            token = self._client.watch_token(url)
            lines = [
                f"GET {WATCH_PATH} HTTP/1.0",
                f"Host: {urlsplit(url).netloc.rpartition('@')[2]}",  # never the userinfo of an endpoint URL
                f"{AUTH_HEADER}: {AUTH_SCHEME} {token}",
            ]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            try:
                async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                    status = _status_code(await reader.readline())
                    while (await reader.readline()).strip():
                        pass  # the headers: nothing in them matters here
            except OSError:
                if not tls:
                    raise
                status = None  # cut before a status line: see below
            if status == 401:  # a token rotation under way: the next try may fit
                return _Quiet.RETRY
            if status is None and tls:
                # Closed or reset before a status line: under TLS 1.3, how the broker refuses the
                # operator's certificate (after the client's side of the handshake). No stream was
                # held, and it is not a broker without /watch: try again, as after a TLS failure.
                return _Quiet.RETRY
            if status != 200:
                logger.info("%s serves no %s (HTTP %s): not watched", name, WATCH_PATH, status)
                return _Quiet.UNSUPPORTED
            self._held.add(name)
            logger.info("%s: watching its process at %s", name, redact_url(url))
            try:
                while True:
                    async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                        if not await reader.read(4096):
                            break  # a FIN: the peer's kernel closed the connection
            finally:
                self._held.discard(name)
        except (OSError, TimeoutError) as error:  # a reset, or the broker silent for too long
            return ConnectionLost(name, url, f"watch connection lost: {error!r}")
        finally:
            writer.close()
        return await self._after_end(name, url)

    async def _after_end(self, name: str, url: str) -> ConnectionLost | ProcessGone:
        """The stream ended with a FIN: is anything still listening at that address and port?

        Asked up to ``PROBES`` times, ``PROBE_GAP_SECONDS`` apart: a process being killed closes
        its sockets one by one, so the first probe may still reach its listener a moment before
        it closes too, or be reset as the listener closes under it. Each refusal is a proof in
        itself (nothing listens then), dated before it.
        """
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        assert host is not None and port is not None, url
        last = ""
        for probe in range(PROBES):
            if probe:
                await asyncio.sleep(PROBE_GAP_SECONDS)
            at = self._clock()  # before the attempt: any later answer or call voids the proof
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    _, writer = await asyncio.open_connection(host, port)
            except ConnectionRefusedError:
                reason = f"its watch stream ended and {host}:{port} refuses connections: the process is gone"
                return ProcessGone(name, url, at, reason)
            except ConnectionResetError as error:
                # The listener closing under a half-made connection (the kernel resets what its
                # queue held): the process is going, so ask again; only a refusal is proof.
                last = f"watch ended; connecting to {host}:{port} was reset: {error!r}"
                continue
            except (OSError, TimeoutError) as error:
                failed = f"watch ended; reconnecting to {host}:{port} failed: {error!r}"
                return ConnectionLost(name, url, failed)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            last = f"watch ended; {host}:{port} still accepts connections"
        return ConnectionLost(name, url, last)
