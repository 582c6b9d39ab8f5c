"""A ``Duplicate`` acknowledges a message: it must not be answered before the message is durable.

Two identical bundles reach an Active broker at once (a backend retrying a bundle
that timed out, while the first copy is still being journaled). The second copy's
messages are all ``Duplicate``; they may be answered only once the first copy's
journal write is on disk, and must fail with the journal's fault if that write
fails, or a crash could lose messages the backend was told were taken.

The broker runs in this test's event loop (the real ``Broker``: lifecycle,
stream table and journal on real files), activated through its real heartbeat
against real backend and cloud simulator processes. Only the journal's disk
write is replaced, by a gate the test opens or fails (``GatedDisk``): a
deliberately slow journal. Nothing measures time: the proof is that the retry's
task is still unanswered while the write is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker_contracts.soap import AcceptStatus, FaultCode
from broker_service.lifecycle import Broker
from broker_service.soap_codec import (
    AcceptResult,
    SendMessagesRequest,
    SoapFaultError,
    parse_request,
)
from broker_simulators.backend import build_envelope
from broker_simulators.local_processes import ProcessSet
from tests.integration.broker.conftest import active_in_process_broker
from tests.unit.broker.gated_disk import GatedDisk

pytestmark = pytest.mark.integration

BUNDLE = build_envelope(
    "acme", "1000", [("orders-0000", seq, f"m-{seq}", f"payload {seq}") for seq in range(1, 6)]
)


def bundle() -> SendMessagesRequest:
    request = parse_request(BUNDLE)
    assert isinstance(request, SendMessagesRequest)
    return request


@pytest.fixture
async def active_broker(processes: ProcessSet, tmp_path: Path) -> AsyncIterator[Broker]:
    async with active_in_process_broker(processes, tmp_path, lease_seconds=60) as broker:
        yield broker


Sent = asyncio.Task[tuple[int, list[AcceptResult]]]


async def first_copy_held_in_the_journal(broker: Broker) -> tuple[GatedDisk, Sent, Sent]:
    disk = GatedDisk.install(broker.journal)
    first = asyncio.create_task(broker.send_messages(bundle()))
    await asyncio.to_thread(disk.started.wait, 10)  # its journal write is under way, and held
    retry = asyncio.create_task(broker.send_messages(bundle()))
    for _ in range(50):  # let the retry run as far as it can without the disk
        await asyncio.sleep(0)
    return disk, first, retry


async def test_a_retried_bundle_answers_duplicate_only_once_the_first_copy_is_durable(
    active_broker: Broker,
) -> None:
    disk, first, retry = await first_copy_held_in_the_journal(active_broker)
    assert not first.done()
    assert not retry.done(), f"Duplicates were acknowledged before they were journaled: {retry.result()}"

    disk.gate.set()
    _, retried = await asyncio.wait_for(retry, timeout=10)
    _, accepted = await asyncio.wait_for(first, timeout=10)
    assert [result[2] for result in accepted] == [AcceptStatus.ACCEPTED] * 5
    assert [result[2] for result in retried] == [AcceptStatus.DUPLICATE] * 5
    assert disk.writes == 1  # the retry wrote nothing of its own


async def test_a_retried_bundle_fails_with_the_journal_when_the_first_copy_cannot_be_written(
    active_broker: Broker,
) -> None:
    disk, first, retry = await first_copy_held_in_the_journal(active_broker)
    assert not retry.done()

    disk.fail = True
    disk.gate.set()
    for copy in (first, retry):
        with pytest.raises(SoapFaultError) as raised:
            await asyncio.wait_for(copy, timeout=10)
        assert raised.value.code is FaultCode.JOURNAL_ERROR
    assert active_broker.state == "Inactive"  # a broken journal fences the broker


async def test_duplicates_of_durable_messages_are_answered_without_waiting_for_the_journal(
    active_broker: Broker,
) -> None:
    _, accepted = await active_broker.send_messages(bundle())
    assert [result[2] for result in accepted] == [AcceptStatus.ACCEPTED] * 5
    disk = GatedDisk.install(active_broker.journal)  # any write from now on would hang

    _, again = await asyncio.wait_for(active_broker.send_messages(bundle()), timeout=10)

    assert [result[2] for result in again] == [AcceptStatus.DUPLICATE] * 5
    disk.gate.set()
