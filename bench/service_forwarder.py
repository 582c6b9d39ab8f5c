"""The ``<cluster>-active`` Service as kube-proxy implements it, at layer 4, for
``bench_failover``: a TCP forwarder on one loopback address to the broker labelled active
(what it emulates and what not: ``bench_failover``'s docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading

CONNECT_TIMEOUT = 1.0  # the Service's connect to a pod; on loopback it is refused or done at once
CLOSE_TIMEOUT = 1.0  # flushing the last bytes to a side that stopped reading
PIPE_CHUNK = 64 * 1024


class ActiveService:
    """The ``<cluster>-active`` Service at layer 4: a TCP forwarder to the broker labelled active.

    Each accepted connection is connected to the (host, port) labelled active at that moment and
    stays pinned to it, as kube-proxy's conntrack entry pins it to one pod; bytes go both ways
    unchanged (so the backend's ``Authorization`` and every other header reach the broker as
    sent). When either side closes, the other is closed once what was sent is flushed; when
    either side resets, both are reset. With no broker labelled yet, or a refused connect, the
    client's connection is reset at once, as a Service with no ready endpoint refuses it.

    Runs its own event loop in a thread so that forwarding 1,000 msg/s does not share the
    engine's loop (in Kubernetes it is kube-proxy, not the operator).
    """

    def __init__(self, host: str, port: int) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the Service emulation listens on loopback only, not {host}")
        self.url = f"http://{host}:{port}"
        self.host, self.port = host, port
        # (host, port) of the broker labelled active; swapping a reference is atomic across threads.
        self.upstream: tuple[str, int] | None = None
        self.started = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.thread = threading.Thread(target=self._serve, name="active-service", daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.started.wait(10) or self.server is None:
            raise RuntimeError(f"the active-Service emulation did not start on {self.url}")

    def point_to(self, address: tuple[str, int] | None) -> None:
        """The ``role=active`` label moved: new connections go to ``address``; open ones stay."""
        if address is not None and not ipaddress.ip_address(address[0]).is_loopback:
            raise ValueError(f"the Service emulation forwards to loopback only, not {address[0]}")
        self.upstream = address

    def stop(self) -> None:
        if self.loop is None:
            return
        with contextlib.suppress(Exception):  # the loop already gone: nothing left to close
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    async def _shutdown(self) -> None:
        if self.server is not None:
            self.server.close()  # no new connections
        for task in list(self.connections):  # a connection hung on a frozen broker ends here too
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.server = self.loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, self.port, backlog=512)
            )
        finally:
            self.started.set()  # start() reports a failed bind instead of waiting 10 s
        if self.server is not None:
            self.loop.run_forever()
        self.loop.close()

    async def _connection(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        upstream: asyncio.StreamWriter | None = None
        reset = True
        try:
            address = self.upstream  # read once: this connection is pinned to it
            if address is None:
                return  # no pod labelled role=active yet: refused
            try:
                upstream_reader, connected = await asyncio.wait_for(
                    asyncio.open_connection(*address), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                return  # the pod is gone (its port refuses): refused, the backend retries
            upstream = connected
            reset = await self._pipe_both_ways(client_reader, client, upstream_reader, connected)
        except asyncio.CancelledError:
            # Only stop() cancels: end normally, since Python 3.11's start_server logs a traceback
            # for a handler task that ends cancelled.
            pass
        finally:
            for writer in (client, upstream):
                if writer is not None:
                    await _close(writer, reset)
            self.connections.discard(task)

    async def _pipe_both_ways(
        self,
        client_reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
    ) -> bool:
        """Copy bytes both ways until one side closes or resets; True when it was a reset."""
        pipes = {
            asyncio.create_task(_pipe(client_reader, upstream)),
            asyncio.create_task(_pipe(upstream_reader, client)),
        }
        try:
            done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        return any(pipe.result() for pipe in done)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> bool:
    """Copy ``source`` to ``sink`` until ``source`` ends; True when a side reset instead."""
    try:
        while chunk := await source.read(PIPE_CHUNK):
            sink.write(chunk)
            await sink.drain()  # a slow reader holds back the sender, as TCP would
    except OSError:  # ConnectionResetError, BrokenPipeError, or drain() on a connection already lost
        return True
    return False


async def _close(writer: asyncio.StreamWriter, reset: bool) -> None:
    """Close one side: flush what was sent and FIN, or RST (SO_LINGER 0) to pass on a reset."""
    if reset:
        with contextlib.suppress(OSError):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
    except (OSError, TimeoutError):
        writer.transport.abort()  # a frozen peer never reads what is left: drop it
