"""``KubeApi`` reads response bodies in its worker threads, never on the event loop.

The heartbeats of every cluster share the operator's event loop. A body read there blocks them all
for as long as the API server takes to send it, and a swamped API server takes long enough to time
heartbeats out (it did at 2,000 clusters, docs/benchmarks.md). Here a real HTTP server on loopback
answers a Secret read with its headers at once and holds the body back until the event loop has
run a ticker three times since the headers went out, for at most 10 s: if the body were read on
the loop, the ticker could not run, the server would give up waiting, and the test fails (it did
before the bodies moved into the worker threads).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import kubernetes
import pytest

from broker_operator.controller.kube import KubeApi
from tests.loopback_http import serving

HOLD_LIMIT_SECONDS = 10.0


class _SlowBody(BaseHTTPRequestHandler):
    headers_sent = threading.Event()  # replaced per test
    loop_ran = threading.Event()  # set by the test's ticker
    held_until_loop_ran: list[bool] = []  # noqa: RUF012 - one server per test

    def do_GET(self) -> None:  # the client's Secret read
        body = json.dumps({"data": {"token": base64.b64encode(b"the-token").decode()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        type(self).headers_sent.set()
        type(self).held_until_loop_ran.append(type(self).loop_ran.wait(HOLD_LIMIT_SECONDS))
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    _SlowBody.headers_sent = threading.Event()
    _SlowBody.loop_ran = threading.Event()
    _SlowBody.held_until_loop_ran = []
    with serving(_SlowBody) as url:
        yield url


def test_a_secret_body_is_read_while_the_event_loop_runs(slow_server: str) -> None:
    configuration = kubernetes.client.Configuration(host=slow_server)
    api = KubeApi(kubernetes.client.ApiClient(configuration))

    async def read_while_ticking() -> str | None:
        async def ticker() -> None:
            ticks = 0  # counted once the headers are out, while the body is held back
            while ticks < 3:
                await asyncio.sleep(0.01)
                ticks += _SlowBody.headers_sent.is_set()
            _SlowBody.loop_ran.set()

        running = asyncio.create_task(ticker())
        try:
            return await api.read_secret_value("default", "token", "token")
        finally:
            running.cancel()

    assert asyncio.run(read_while_ticking()) == "the-token"
    # True: the loop ticked while the server held the body back; False: it waited out its limit.
    assert _SlowBody.held_until_loop_ran == [True]
