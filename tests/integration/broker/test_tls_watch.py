"""The watch stream under TLS (real process): kill -9 of the broker still reads as a broken connection.

The operator proves a crash from its ``GET /watch`` connection on the admin port: the stream ends
(the dead process's kernel closes the socket) and a fresh connection is refused
(docs/failover-engine.md, "Proofs of death"). Under TLS a killed process sends no
``close_notify``; these tests check that the client still reads an end of stream from asyncio's
streams (as the operator's watch does) and a refused connection from aiohttp (DAY2_FACTS.md).
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.tls_helpers import (
    OPERATOR_TOKEN,
    SERVER_NAME,
    Pki,
    client_ssl,
    make_pki,
    start_tls_broker,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
    yield make_pki(tmp_path_factory.mktemp("pki"))


async def _open_watch(
    host: str, port: int, context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """``GET /watch`` as the operator asks it (HTTP/1.0, one line and two headers) over TLS."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=SERVER_NAME), 10
    )
    writer.write(
        f"GET /watch HTTP/1.0\r\nHost: {SERVER_NAME}\r\n"
        f"Authorization: Bearer {OPERATOR_TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return reader, writer, head


async def test_kill_9_of_a_tls_broker_ends_the_watch_stream_and_refuses_the_next_connection(
    processes: ProcessSet, tmp_path: Path, pki: Pki
) -> None:
    broker = start_tls_broker(processes, tmp_path, pki)
    host, port = broker.host, broker.admin_port
    operator = client_ssl(pki.operator_ca.cert, pki.operator)

    # Without the operator's certificate there is no stream to hold.
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await _open_watch(host, port, client_ssl(pki.operator_ca.cert))

    reader, writer, head = await _open_watch(host, port, operator)
    assert head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"), head
    first = await asyncio.wait_for(reader.readline(), 10)
    assert first.startswith(b"watching broker broker-0 pid "), first

    await asyncio.to_thread(broker.main.kill, signal.SIGKILL)
    # The end of the stream, within a bound: the killed process's kernel sends a FIN, no TLS
    # close_notify, and the stream reads its end (after any keep-alive newlines), not a reset.
    rest = await asyncio.wait_for(reader.read(), 10)
    assert rest.strip(b"\n") == b"", rest
    assert reader.at_eof()
    assert not broker.main.alive
    writer.close()

    # A fresh connection is refused, as the operator's proof needs; aiohttp says so too.
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=operator, server_hostname=SERVER_NAME), 10
        )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(f"https://{host}:{port}/watch", ssl=operator, server_hostname=SERVER_NAME)
