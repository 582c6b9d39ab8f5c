"""Shards (``--shard i/N``): every BrokerCluster is driven by exactly one of them.

The partition itself is checked over random names; then two real operators, shard 0/2 and 1/2,
run side by side against one kmock with the real handlers, daemon and engine. Each cluster's
brokers are endpoints on a loopback server of this test that records the ``operatorId`` of every
Heartbeat it gets: a cluster heartbeated by both shards, or by neither, fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import kmock
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_operator.controller.kube import KubeApi
from broker_operator.controller.settings import parse_settings
from broker_operator.controller.sharding import Shard
from tests.unit.controller.conftest import (
    NAMESPACE,
    cluster_body,
    running_operator,
    serve_brokers,
)
from tests.unit.controller.test_metrics_forgotten import CLUSTERS_URL

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40)


@given(namespace=NAME, name=NAME, count=st.integers(1, 16))
def test_exactly_one_shard_drives_each_cluster(namespace: str, name: str, count: int) -> None:
    drivers = [index for index in range(count) if Shard(index, count).drives(namespace, name)]
    assert len(drivers) == 1


def test_shards_divide_many_clusters_about_evenly() -> None:
    counts = [sum(Shard(i, 4).drives("erp", f"cluster-{n}") for n in range(4000)) for i in range(4)]
    assert min(counts) > 850, counts


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1/0", "one/two", "1", ""])
def test_a_shard_that_is_not_index_over_count_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text)


def test_the_shard_flag_and_its_environment_variable() -> None:
    assert parse_settings(["--shard", "1/3"], {}).shard == Shard(1, 3)
    assert parse_settings([], {"OPERATOR_SHARD": " 0 / 2 "}).shard == Shard(0, 2)
    settings = parse_settings([], {})
    assert settings.shard is None and settings.drives("any", "cluster")
    with pytest.raises(SystemExit):
        parse_settings(["--shard", "3/3"], {})


OPERATOR_ID = re.compile(rb"<(?:\w+:)?operatorId>([^<]+)</")


@contextlib.asynccontextmanager
async def operator_in_a_thread(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi, **settings: Any
) -> AsyncIterator[None]:
    """``running_operator`` in an event loop of its own: a kopf operator that stops cancels every
    task its loop started while it ran, so two cannot share one loop (as two processes share none)."""
    ready, stop = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    async def run() -> None:
        async with running_operator(kmock, kube_api, **settings):
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)

    def thread_main() -> None:
        try:
            asyncio.run(run())
        except BaseException as error:  # reported in the test's own thread
            failures.append(error)
            ready.set()

    thread = threading.Thread(target=thread_main, name=f"operator {settings}", daemon=True)
    thread.start()
    started = await asyncio.get_running_loop().run_in_executor(None, ready.wait, 60)
    assert started, "the operator in its thread did not start within 60 s"
    try:
        yield
    finally:
        stop.set()
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 60)
        assert not thread.is_alive(), "the operator in its thread did not stop within 60 s"
    if failures:
        raise failures[0]


async def test_two_shards_never_both_drive_one_cluster(
    kmock: kmock.KubernetesEmulator, kube_api: KubeApi
) -> None:
    heard: dict[str, set[str]] = defaultdict(set)  # cluster -> operatorIds that heartbeated it

    async def heartbeat(request: aiohttp.web.Request) -> aiohttp.web.Response:
        found = OPERATOR_ID.search(await request.read())
        if found:
            heard[request.match_info["cluster"]].add(found.group(1).decode())
        return aiohttp.web.Response(status=503, text="not a broker")  # a failed heartbeat is enough

    runner, port = await serve_brokers(heartbeat)
    clusters = [f"shard-test-{n}" for n in range(8)]
    owners = {name: next(i for i in range(2) if Shard(i, 2).drives(NAMESPACE, name)) for name in clusters}
    assert set(owners.values()) == {0, 1}, owners  # both shards have clusters to drive
    try:
        async with (
            running_operator(kmock, kube_api, shard=Shard(0, 2), operator_id="shard-0"),
            operator_in_a_thread(kmock, kube_api, shard=Shard(1, 2), operator_id="shard-1"),
        ):
            for n, name in enumerate(clusters):
                endpoints = [
                    {"name": b, "url": f"http://127.0.0.1:{port}/{name}/{b}/soap", "priority": p}
                    for p, b in enumerate(["a", "b"])
                ]
                body = cluster_body(name, endpoints=endpoints)
                body["spec"]["company"] = str(2000 + n)  # a pair of its own: no Conflict
                response = await kmock.post(CLUSTERS_URL, json=body)
                assert response.status < 300, await response.text()
            for _ in range(600):  # bounded: 60 s
                if all(heard[name] for name in clusters):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)  # more heartbeats, from whoever would send them
            assert {name: sorted(heard[name]) for name in clusters} == {
                name: [f"shard-{owners[name]}"] for name in clusters
            }
    finally:
        await runner.cleanup()
