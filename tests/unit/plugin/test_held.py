"""Held messages: which broker is asked, the counts status shows, and the table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from broker_contracts.soap import HeldMessage
from broker_operator.kubectl_plugin.admin import BrokerAdminError
from broker_operator.kubectl_plugin.errors import EXIT_FAILED, EXIT_USAGE, PluginError
from broker_operator.kubectl_plugin.held import (
    chosen_brokers,
    held_counts,
    held_document,
    release_held,
    render_held,
)
from broker_operator.kubectl_plugin.kube import BrokerAddress
from tests.unit.plugin.support import FakeKube, cluster_body

ADDRESSES = [
    BrokerAddress("orders-0", "http://10.0.0.1:8080/soap"),
    BrokerAddress("orders-1", "http://10.0.0.2:8080/soap"),
]
MESSAGE = HeldMessage(
    "inbound", "invoices-0000", 3, "invoices-0000-3", 2, "rejected: poison", "2026-11-23T11:59:00+00:00"
)


class FakeAdmin:
    """Stands in for :class:`BrokerAdmin`; records every call, per broker."""

    calls: ClassVar[list[tuple[str, ...]]] = []
    held: ClassVar[dict[str, list[HeldMessage]]] = {}

    def __init__(self, broker: str, url: str, token: str, timeout: float) -> None:
        self.broker, self.url = broker, url
        FakeAdmin.calls.append(("connect", broker, url, token))

    def list_held(self, stream: str | None = None) -> list[HeldMessage]:
        if self.broker not in FakeAdmin.held:
            raise BrokerAdminError(
                f"broker {self.broker} unreachable at {self.url} (Connection refused); brokers are reached "
                "at their pod IPs"
            )
        return FakeAdmin.held[self.broker]

    def replay(self, direction: str, stream: str, seq: int) -> str:
        FakeAdmin.calls.append(("replay", self.broker, direction, stream, str(seq)))
        return "replayed"

    def discard(self, direction: str, stream: str, seq: int) -> str:
        FakeAdmin.calls.append(("discard", self.broker, direction, stream, str(seq)))
        return "discarded"


@pytest.fixture(autouse=True)
def fresh_admin() -> None:
    FakeAdmin.calls = []
    FakeAdmin.held = {}


def test_the_active_broker_is_asked_by_default() -> None:
    assert chosen_brokers(cluster_body(), ADDRESSES, None) == [ADDRESSES[0]]
    assert chosen_brokers(cluster_body(), ADDRESSES, "orders-1") == [ADDRESSES[1]]
    assert chosen_brokers(cluster_body(), ADDRESSES, None, all_brokers=True) == ADDRESSES
    assert chosen_brokers(cluster_body(), ADDRESSES, "orders-1", url="http://127.0.0.1:18080/soap") == [
        BrokerAddress("orders-1", "http://127.0.0.1:18080/soap")
    ]


def test_an_unknown_broker_or_no_active_is_said_plainly() -> None:
    with pytest.raises(PluginError) as unknown:
        chosen_brokers(cluster_body(), ADDRESSES, "orders-9")
    assert unknown.value.exit_code == EXIT_USAGE
    assert "broker 'orders-9' is not in BrokerCluster orders (its brokers: orders-0, orders-1)" in str(
        unknown.value
    )
    with pytest.raises(PluginError, match="has no active broker; pass --broker NAME") as none:
        chosen_brokers(cluster_body(active=None), ADDRESSES, None)
    assert none.value.exit_code == EXIT_FAILED


def test_status_counts_come_from_each_broker_and_failures_are_kept_as_reasons() -> None:
    FakeAdmin.held = {"orders-0": [MESSAGE]}
    counts = held_counts(FakeKube(cluster_body()), cluster_body(), admin=FakeAdmin)  # type: ignore[arg-type]
    assert counts["orders-0"].count == 1
    assert (counts["orders-1"].count, counts["orders-1"].error) == (None, "orders-1: no pod IP yet")
    assert ("connect", "orders-0", "http://127.0.0.10:8080/soap", "operator-token") in FakeAdmin.calls


def test_status_counts_without_the_token_say_why_for_every_broker() -> None:
    kube = FakeKube(cluster_body())

    def forbidden(body: dict[str, Any]) -> str:
        raise PluginError("forbidden: you may not get secrets in namespace shop")

    kube.operator_token = forbidden  # type: ignore[method-assign]
    counts = held_counts(kube, cluster_body(), admin=FakeAdmin)  # type: ignore[arg-type]
    assert {c.error for c in counts.values()} == {"forbidden: you may not get secrets in namespace shop"}
    assert FakeAdmin.calls == []


def test_replay_and_discard_go_to_the_chosen_broker_with_the_token() -> None:
    kube = FakeKube(cluster_body())
    broker, message = release_held(
        kube, cluster_body(), action="discard", direction="inbound", stream="invoices-0000", seq=3,  # type: ignore[arg-type]
        broker=None, url=None, timeout=5, admin=FakeAdmin,  # type: ignore[arg-type]
    )  # fmt: skip
    assert (broker, message) == ("orders-0", "discarded")
    assert FakeAdmin.calls[-1] == ("discard", "orders-0", "inbound", "invoices-0000", "3")
    with pytest.raises(PluginError, match="no pod IP yet"):
        release_held(
            kube, cluster_body(), action="replay", direction="inbound", stream="s", seq=1,  # type: ignore[arg-type]
            broker="orders-1", url=None, timeout=5, admin=FakeAdmin,  # type: ignore[arg-type]
        )  # fmt: skip


def test_the_held_table_and_document() -> None:
    now = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
    lines = render_held([("orders-0", MESSAGE)], ["orders-0"], now).splitlines()
    assert lines[0].split() == [
        "BROKER",
        "DIRECTION",
        "STREAM",
        "SEQ",
        "MSG",
        "ID",
        "ATTEMPTS",
        "HELD",
        "FOR",
        "LAST",
        "ERROR",
    ]
    assert lines[1].split() == [
        "orders-0",
        "inbound",
        "invoices-0000",
        "3",
        "invoices-0000-3",
        "2",
        "1m0s",
        "rejected:",
        "poison",
    ]
    assert render_held([], ["orders-0", "orders-1"], now) == "No held messages on orders-0, orders-1."
    document = held_document("orders", "shop", [("orders-0", MESSAGE)])
    assert document["held"] == [
        {"broker": "orders-0", "direction": "inbound", "stream": "invoices-0000", "seq": 3,
         "msgId": "invoices-0000-3", "attempts": 2, "lastError": "rejected: poison",
         "heldSince": "2026-11-23T11:59:00+00:00"}
    ]  # fmt: skip
