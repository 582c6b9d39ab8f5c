"""``kubectl broker held list|replay|discard``, and the held counts ``status`` shows.

Which broker to ask: the active one by default, since it holds what is held now; brokers do not
share journals, and an inactive broker answers from its own journal, i.e. what it held when it was
last active (docs/broker.md, "Holds are durable"). ``--broker`` asks another one, ``--all-brokers``
(list only) asks each. ``--url`` replaces the address (a ``kubectl port-forward`` from outside the
pod network). The operator's token is read from the cluster's Secret for every command; for a
broker that serves TLS (an ``https`` URL), the operator's client certificate too, once per command
(``admin_tls``), and the broker is verified as its pod's DNS name, through ``--url`` as well.

Replay and discard name a message as ``DIRECTION STREAM SEQ``, the columns ``held list`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Final

from broker_contracts.message_log import Direction
from broker_contracts.soap import HeldMessage
from broker_operator.controller.bodies import BrokerClusterBody
from broker_operator.kubectl_plugin.admin import BrokerAdmin, BrokerAdminError, held_json
from broker_operator.kubectl_plugin.admin_tls import AdminTls
from broker_operator.kubectl_plugin.errors import PluginError, UsageError
from broker_operator.kubectl_plugin.kube import BrokerAddress, Kube, cluster_spec
from broker_operator.kubectl_plugin.status_view import (
    NONE,
    HeldCount,
    age_seconds,
    format_age,
    status_of,
    table,
)

STATUS_TIMEOUT_SECONDS: Final = 3.0  # status must stay quick when a broker does not answer
DIRECTIONS: Final = tuple(d.value for d in Direction)

AdminFactory = Callable[..., BrokerAdmin]  # BrokerAdmin(broker, url, token, timeout, *, tls=None)


def _serves_tls(url: str) -> bool:
    return url.lower().startswith("https://")


class _ClientTls:
    """The client certificate of one command, read on first need (a plain-HTTP cluster never reads
    it, so a user without ``get`` on its Secret loses nothing there) and once at most."""

    def __init__(self, kube: Kube, body: BrokerClusterBody) -> None:
        self._kube, self._body = kube, body
        self._found: tuple[Any, str] | None = None

    def for_address(self, address: BrokerAddress) -> AdminTls | None:
        """What to call ``address`` with: None for plain HTTP, or an ``https`` endpoint of a cluster
        whose ``spec.tls`` is off (verified with the system's trust, as the operator does)."""
        if address.url is None or not _serves_tls(address.url):
            return None
        if not cluster_spec(self._body).tls.enabled and address.server_name is None:
            return None
        if self._found is None:
            self._found = self._kube.client_tls(self._body)
        material, source = self._found
        return AdminTls(material, address.server_name, source)


def _connect(
    admin: AdminFactory, address: BrokerAddress, token: str, timeout: float, tls: AdminTls | None
) -> BrokerAdmin:
    assert address.url is not None
    if tls is None:  # the call without TLS is exactly as before (and as test doubles take it)
        return admin(address.name, address.url, token, timeout)
    return admin(address.name, address.url, token, timeout, tls=tls)


def held_counts(
    kube: Kube, body: BrokerClusterBody, admin: AdminFactory = BrokerAdmin
) -> dict[str, HeldCount]:
    """Each broker's number of held messages, asked in parallel; a failure is reported, not raised."""
    try:
        token = kube.operator_token(body)
        addresses = kube.broker_addresses(body)
    except PluginError as error:
        names = [b.get("name") for b in status_of(body).get("brokers") or []]
        return {str(name): HeldCount(None, str(error)) for name in names}

    client_tls = _ClientTls(kube, body)
    try:
        tls = {a.name: client_tls.for_address(a) for a in addresses}
    except PluginError as error:  # the client certificate: every TLS broker's count says why
        tls = {}
        failed = {a.name: HeldCount(None, str(error)) for a in addresses if a.url and _serves_tls(a.url)}
    else:
        failed = {}

    def count(address: BrokerAddress) -> HeldCount:
        if address.name in failed:
            return failed[address.name]
        if address.url is None:
            return HeldCount(None, f"{address.name}: no pod IP yet")
        try:
            client = _connect(admin, address, token, STATUS_TIMEOUT_SECONDS, tls.get(address.name))
            return HeldCount(len(client.list_held()))
        except BrokerAdminError as error:
            return HeldCount(None, str(error).split("; brokers are reached", 1)[0])

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(addresses)))) as pool:
        return dict(zip((a.name for a in addresses), pool.map(count, addresses), strict=True))


def chosen_brokers(
    body: BrokerClusterBody,
    addresses: Sequence[BrokerAddress],
    broker: str | None,
    all_brokers: bool = False,
    url: str | None = None,
) -> list[BrokerAddress]:
    """The brokers a held command asks, checked against the cluster's; raises naming the choices."""
    name = body["metadata"]["name"]
    known = [a.name for a in addresses]
    if broker is not None and broker not in known:
        raise UsageError(
            f"broker {broker!r} is not in BrokerCluster {name} (its brokers: {', '.join(known)})"
        )
    if all_brokers:
        chosen = list(addresses)
    else:
        target = broker or (body.get("status") or {}).get("active")
        if not target:
            raise PluginError(
                f"BrokerCluster {name} has no active broker; pass --broker NAME to ask one of "
                f"{', '.join(known)} (an inactive broker answers from its own journal)"
            )
        chosen = [a for a in addresses if a.name == target] or [BrokerAddress(str(target), None)]
    if url is not None:
        if len(chosen) != 1:
            raise UsageError("--url names one broker's address; use it with --broker, not --all-brokers")
        # Through a port-forward the broker is still the pod: its certificate carries the pod's name.
        return [BrokerAddress(chosen[0].name, url, chosen[0].server_name)]
    return chosen


def _admin_for(
    kube: Kube,
    body: BrokerClusterBody,
    address: BrokerAddress,
    admin: AdminFactory,
    timeout: float,
    *,
    client_tls: _ClientTls | None = None,
) -> BrokerAdmin:
    if address.url is None:
        raise PluginError(f"broker {address.name} has no pod IP yet (is its pod running?); try again shortly")
    tls = (client_tls or _ClientTls(kube, body)).for_address(address)
    return _connect(admin, address, kube.operator_token(body), timeout, tls)


def list_held(
    kube: Kube,
    body: BrokerClusterBody,
    *,
    broker: str | None,
    all_brokers: bool,
    url: str | None,
    stream: str | None,
    timeout: float,
    admin: AdminFactory = BrokerAdmin,
) -> list[tuple[str, HeldMessage]]:
    """(broker, message) for every held message on the chosen brokers."""
    chosen = chosen_brokers(body, kube.broker_addresses(body), broker, all_brokers, url)
    client_tls = _ClientTls(kube, body)
    found: list[tuple[str, HeldMessage]] = []
    for address in chosen:
        client = _admin_for(kube, body, address, admin, timeout, client_tls=client_tls)
        found += [(address.name, m) for m in client.list_held(stream)]
    return found


def release_held(
    kube: Kube,
    body: BrokerClusterBody,
    *,
    action: str,
    direction: str,
    stream: str,
    seq: int,
    broker: str | None,
    url: str | None,
    timeout: float,
    admin: AdminFactory = BrokerAdmin,
) -> tuple[str, str]:
    """``replay`` or ``discard`` one held message; returns (broker, the broker's message)."""
    if direction not in DIRECTIONS:
        raise UsageError(f"direction {direction!r} must be one of {', '.join(DIRECTIONS)}")
    (address,) = chosen_brokers(body, kube.broker_addresses(body), broker, False, url)
    client = _admin_for(kube, body, address, admin, timeout)
    done = client.replay if action == "replay" else client.discard
    return address.name, done(direction, stream, seq)


def held_document(cluster: str, namespace: str, found: Sequence[tuple[str, HeldMessage]]) -> dict[str, Any]:
    return {
        "schema": "kubectl-broker/held/v1",
        "cluster": cluster,
        "namespace": namespace,
        "held": [{"broker": broker, **held_json(message)} for broker, message in found],
    }


def render_held(found: Sequence[tuple[str, HeldMessage]], asked: Sequence[str], now: datetime) -> str:
    if not found:
        return f"No held messages on {', '.join(asked)}."
    header = ("BROKER", "DIRECTION", "STREAM", "SEQ", "MSG ID", "ATTEMPTS", "HELD FOR", "LAST ERROR")
    rows = [
        (
            broker,
            m.direction,
            m.stream,
            str(m.seq),
            m.msg_id,
            str(m.attempts),
            format_age(age_seconds(m.held_since, now)),
            (m.last_error or NONE)[:80],
        )
        for broker, m in found
    ]
    return "\n".join(table([header, *rows]))
