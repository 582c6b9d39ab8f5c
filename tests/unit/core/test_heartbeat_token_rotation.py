"""The heartbeat client during a token rotation (issue 13 item 5): no heartbeat fails because of the order.

A rotated Secret reaches the operator and each broker pod at different instants. These drive
the real client over HTTP against a stand-in broker that takes a chosen set of tokens and
answers a refusal with the broker's own ``UNAUTHENTICATED`` fault (``soap_codec``), so what
is tested is the client's choice of token, not the broker (the integration tests have that).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, FaultCode
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient, HeartbeatError
from broker_service import soap_codec
from broker_service.soap_codec import SoapFaultError


@dataclass
class StandInBroker:
    """Accepts the tokens in ``accepts``; records every token presented, in order."""

    accepts: set[str]
    presented: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        token = request.headers.get(AUTH_HEADER, "").removeprefix(f"{AUTH_SCHEME} ")
        self.presented.append(token)
        if token not in self.accepts:
            fault = SoapFaultError(FaultCode.UNAUTHENTICATED, "missing or unknown credential")
            return web.Response(status=500, body=soap_codec.render_fault(fault), content_type="text/xml")
        return web.Response(body=soap_codec.render_heartbeat("Active", 7), content_type="text/xml")


@pytest.fixture
async def broker() -> AsyncIterator[tuple[StandInBroker, BrokerTarget]]:
    stand_in = StandInBroker(accepts={"old"})
    app = web.Application()
    app.router.add_post("/soap", stand_in.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield stand_in, BrokerTarget("b0", str(server.make_url("/soap")), 0)
    finally:
        await server.close()


class SecretStandIn:
    """What the client reads when it refreshes: the Secret's value now, and how often it was read."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.reads = 0

    async def read(self) -> str | None:
        self.reads += 1
        return self.value


async def test_a_broker_that_has_not_seen_the_new_token_gets_the_previous_one(
    broker: tuple[StandInBroker, BrokerTarget],
) -> None:
    stand_in, target = broker
    client = HeartbeatClient("old", "unit", 1.0)
    try:
        assert (await client.heartbeat(target, True, 7)).epoch == 7
        client.update_token("new")  # the operator saw the rotation before this broker's kubelet did
        assert (await client.heartbeat(target, True, 7)).epoch == 7
        assert stand_in.presented[-2:] == ["new", "old"]
        # Remembered: the next heartbeats go straight to the token this broker takes.
        await client.heartbeat(target, True, 7)
        assert stand_in.presented[-1] == "old"
        # The broker sees the new file; once its grace ends the old token is refused, and the
        # client moves on to the new one within the same heartbeat.
        stand_in.accepts = {"new"}
        assert (await client.heartbeat(target, True, 7)).epoch == 7
        assert stand_in.presented[-2:] == ["old", "new"]
    finally:
        await client.close()


async def test_a_broker_that_dropped_the_old_token_makes_the_client_read_the_secret(
    broker: tuple[StandInBroker, BrokerTarget],
) -> None:
    stand_in, target = broker
    secret = SecretStandIn("old")
    client = HeartbeatClient("old", "unit", 1.0, refresh=secret.read)
    try:
        await client.heartbeat(target, True, 7)
        # The Secret changed, the broker saw it and its grace for "old" is over, and the
        # operator's periodic re-read has not come yet: the refusal itself triggers the read.
        secret.value = "new"
        stand_in.accepts = {"new"}
        assert (await client.heartbeat(target, True, 7)).epoch == 7
        assert (secret.reads, client.token, stand_in.presented[-2:]) == (1, "new", ["old", "new"])
    finally:
        await client.close()


async def test_a_wrong_token_still_fails_as_unauthenticated_and_reads_the_secret_once(
    broker: tuple[StandInBroker, BrokerTarget],
) -> None:
    stand_in, target = broker
    secret = SecretStandIn("wrong")
    client = HeartbeatClient("wrong", "unit", 1.0, refresh=secret.read)
    try:
        for _ in range(3):
            with pytest.raises(HeartbeatError) as refused:
                await client.heartbeat(target, True, 7)
            assert refused.value.code == FaultCode.UNAUTHENTICATED
            assert refused.value.reached
        assert secret.reads == 1  # at most once a second, however many heartbeats are refused
        assert stand_in.presented == ["wrong"] * 3
    finally:
        await client.close()


def test_update_token_ignores_an_empty_or_unchanged_value() -> None:
    client = HeartbeatClient("t1", "unit", 1.0)
    assert not client.update_token("")
    assert not client.update_token("t1")
    assert client.update_token("t2")
    assert client.token == "t2"
