"""The benchmarks' heartbeat stand-in honours a handover renewal as a broker does (issue 40).

The operator's own client talks to the stand-in's protocol on a loopback port: a handover renewal
of the active at its epoch is granted (capped), an activation asking one is not, a value that is
no positive finite number is refused, and a renewal after the lease in force ran out is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bench.heartbeat_standin import TOKEN, Renewals, StandinProtocol
from broker_contracts.soap import BrokerState
from broker_operator.core import BrokerTarget
from broker_operator.heartbeat_client import HeartbeatClient

MAX_LEASE = 30.0


@pytest.fixture
async def standin() -> AsyncIterator[tuple[BrokerTarget, Renewals]]:
    state: dict[str, tuple[bool, int]] = {}
    renewals = Renewals(lease_seconds=5.0)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: StandinProtocol(state, False, renewals, max_lease_seconds=MAX_LEASE), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield BrokerTarget("b0", f"http://127.0.0.1:{port}/soap", 0), renewals
    finally:
        server.close()
        await server.wait_closed()


async def test_a_handover_renewal_of_the_active_is_granted_capped_and_an_activation_gets_none(
    standin: tuple[BrokerTarget, Renewals],
) -> None:
    target, renewals = standin
    client = HeartbeatClient(TOKEN, "unit-test", 5.0)
    try:
        reply = await client.heartbeat(target, True, 1, lease_seconds=20.0)  # an activation: not honoured
        assert reply.state is BrokerState.ACTIVE
        await client.heartbeat(target, True, 1, lease_seconds=20.0)  # the active at its epoch: honoured
        await client.heartbeat(target, True, 1, lease_seconds=1e9)  # capped
        await client.heartbeat(target, True, 1, renew=False, lease_seconds=20.0)  # a check: not honoured
        await client.heartbeat(target, True, 2, lease_seconds=20.0)  # a new epoch: not honoured
    finally:
        await client.close()
    snapshot = renewals.snapshot()
    assert (snapshot["handover_leases"], snapshot["lapsed"]) == ([20.0, MAX_LEASE], 0)


@pytest.mark.parametrize("text", ["NaN", "INF", "-1", "0", "soon"])
async def test_a_lease_that_is_no_positive_finite_number_is_refused(
    standin: tuple[BrokerTarget, Renewals], text: str
) -> None:
    target, renewals = standin
    client = HeartbeatClient(TOKEN, "unit-test", 5.0)
    try:
        await client.heartbeat(target, True, 1)
        body = client._envelope(True, 1, True, 20.0).replace(b">20.0<", f">{text}<".encode())
        assert body != client._envelope(True, 1, True, 20.0)
        async with (
            aiohttp.ClientSession() as session,
            session.post(target.url, data=body, headers={"Authorization": f"Bearer {TOKEN}"}) as response,
        ):
            assert response.status == 500
    finally:
        await client.close()
    assert renewals.handover_leases == []


def test_a_renewal_after_the_lease_in_force_ran_out_is_a_lapse() -> None:
    renewals = Renewals(lease_seconds=0.0)  # every lease has run out by the next renewal
    renewals.renewed("127.1.1.1", activation=True)
    renewals.renewed("127.1.1.1")
    assert renewals.lapsed == 1
    renewals.renewed("127.1.1.1", granted=MAX_LEASE)  # a handover: the next renewal is in its lease
    renewals.renewed("127.1.1.1")
    assert renewals.lapsed == 2  # only the renewal after the normal lease ran out
    renewals.renewed("127.1.1.1", activation=True)  # a new term is no lapse
    assert renewals.lapsed == 2
