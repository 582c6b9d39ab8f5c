"""A slow epoch store (two fsyncs on a busy or networked volume) must not read as a stall.

A broker fences itself when its event loop stalls longer than the lease margin, since a
call that waited that long may be older than the operator's fence. Its own epoch fsync
must therefore not run in the loop: a 1 s write under a 0.3 s margin would make every
activation on a slow disk fence the broker it just activated.

The real ``Broker`` runs in this test's loop against real simulator processes; only
the epoch store's write is held by a gate a timer opens (a deliberately slow disk).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from broker_service.soap_codec import HeartbeatRequest, SendMessagesRequest, parse_request
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.conftest import active_in_process_broker

pytestmark = pytest.mark.integration

HELD_SECONDS = 1.0  # longer than the lease margin of max(0.25, 0.1 * 3 s)


async def test_a_slow_epoch_store_leaves_the_loop_free_and_the_broker_active(
    processes: ProcessSet, tmp_path: Path
) -> None:
    async with active_in_process_broker(processes, tmp_path, lease_seconds=3) as broker:
        real_store = broker.epochs.store
        started, gate = threading.Event(), threading.Event()

        def held_store(epoch: int) -> None:
            started.set()
            gate.wait(timeout=30)
            real_store(epoch)

        broker.epochs.store = held_store  # type: ignore[method-assign]
        bundle = parse_request(build_envelope("acme", "1000", [("orders-0000", 1, "m-1", "hello")]))
        assert isinstance(bundle, SendMessagesRequest)
        opener = threading.Timer(HELD_SECONDS, gate.set)
        opener.start()
        try:
            renewal = asyncio.create_task(
                broker.heartbeat(HeartbeatRequest(active=True, epoch=2, operator_id="test"))
            )
            await asyncio.to_thread(started.wait, 10)
            _, accepted = await asyncio.wait_for(broker.send_messages(bundle), timeout=10)
            handled_while_held = not gate.is_set()
            reply = await asyncio.wait_for(renewal, timeout=10)
        finally:
            gate.set()
            opener.cancel()

        assert handled_while_held, "the bundle waited for the epoch's fsync: the store blocked the loop"
        assert [result[2].value for result in accepted] == ["Accepted"]
        assert (reply.state, reply.epoch) == ("Active", 2)
        await asyncio.sleep(3 * broker.settings.lease_tick_seconds)  # the watcher's next ticks
        assert broker.state == "Active"
        assert broker.metrics.registry.get_sample_value("broker_event_loop_stalls_total") == 0
