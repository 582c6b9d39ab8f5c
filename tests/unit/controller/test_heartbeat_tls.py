"""``heartbeat_tls.HeartbeatTls``: the engine's client material follows the certificates controller.

The controller's real passes (``ensure_certificates``) write real certificates into the in-memory
Secret store of ``certificate_passes``; the heartbeat client is the real one (no connection is
opened: only its TLS source is looked at)."""

from __future__ import annotations

import base64
import time
from typing import Any

from broker_operator.controller import names
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.heartbeat_tls import HeartbeatTls, material_required, serving_serial
from broker_operator.controller.settings import ControllerSettings
from broker_operator.controller.spec import parse_spec
from broker_operator.heartbeat_client import HeartbeatClient
from broker_operator.pki import certificate_info
from tests.unit.controller.certificate_passes import SecretStore, body, expire_cache, reconcile

SPEC = parse_spec("orders", body()["spec"])


def _context(store: SecretStore, *, broker_tls: bool = True) -> ControllerContext:
    settings = ControllerSettings(broker_tls=broker_tls)
    return ControllerContext(settings=settings, api=store)  # type: ignore[arg-type]


def _client() -> HeartbeatClient:
    return HeartbeatClient("t" * 32, "operator-test", 1.0)


async def test_no_material_before_the_controller_wrote_it_and_the_reason_says_which_secret(
    events: list[Any],
) -> None:
    context = _context(SecretStore())
    tls = HeartbeatTls(context, "shop", "orders")
    assert await tls.read(SPEC) is None and tls.client() is None
    assert tls.problem is not None and "does not exist" in tls.problem
    assert "shop/orders-operator-client" in tls.problem
    assert material_required(context, SPEC)


async def test_material_is_read_again_only_after_the_controller_looked_and_a_renewal_reaches_the_client(
    events: list[Any],
) -> None:
    store = SecretStore()
    context, manifest = _context(store), body()
    await reconcile(context, manifest)
    tls = HeartbeatTls(context, "shop", "orders")
    first = await tls.read(SPEC)
    assert first is not None
    heartbeats = _client()
    heartbeats.use_tls(tls.client())
    assert heartbeats.tls is not None and heartbeats.tls.version == first.version
    reads = store.reads
    await tls.follow(lambda: SPEC, heartbeats)  # the controller has not looked since: nothing read
    assert store.reads == reads and not tls.due()

    # The client certificate is lost from its Secret: the controller's next look reissues it.
    client = store.secrets[names.operator_client_secret_name("orders")]
    del client["data"]["tls.crt"]
    expire_cache(context)
    await reconcile(context, manifest)
    assert tls.due()
    await tls.follow(lambda: SPEC, heartbeats)
    assert heartbeats.tls.version != first.version and not tls.due()


async def test_a_client_started_without_tls_takes_the_first_material_and_keeps_its_source(
    events: list[Any],
) -> None:
    store = SecretStore()
    context, manifest = _context(store), body()
    tls = HeartbeatTls(context, "shop", "orders")
    await tls.read(SPEC)
    heartbeats = _client()
    heartbeats.use_tls(tls.client())
    assert heartbeats.tls is None  # nothing yet
    await reconcile(context, manifest)
    await tls.follow(lambda: SPEC, heartbeats)
    source = heartbeats.tls
    assert source is not None
    heartbeats.use_tls(None)  # a later call does not replace (or drop) the source in use
    assert heartbeats.tls is source


def test_material_is_required_only_where_the_pods_serve_tls() -> None:
    store = SecretStore()
    disabled = parse_spec("orders", body(tls={"mode": "Disabled"})["spec"])
    endpoints = parse_spec(
        "orders",
        {
            "account": "acme",
            "company": "1000",
            "endpoints": [{"name": "a", "url": "https://a:8080/soap", "priority": 0}],
        },
    )
    assert material_required(_context(store), SPEC)
    assert not material_required(_context(store, broker_tls=False), SPEC)
    assert not material_required(_context(store), disabled)
    assert not material_required(_context(store), endpoints)


async def test_the_client_is_told_which_serial_the_brokers_secret_holds(events: list[Any]) -> None:
    """``follow`` hands the serving serial of the controller's last look to the TLS client, which
    then hurries a fresh handshake with a broker still serving another (tls_client's catch-up)."""
    store = SecretStore()
    context, manifest = _context(store), body()
    await reconcile(context, manifest)
    check = context.certificate_checks[("shop", "orders")]
    tls = HeartbeatTls(context, "shop", "orders")
    await tls.read(SPEC)
    heartbeats = _client()
    heartbeats.use_tls(tls.client())
    assert heartbeats.tls is not None
    serial = serving_serial(check.report)
    secret = store.secrets[names.tls_secret_name("orders")]
    assert serial == certificate_info(base64.b64decode(secret["data"]["tls.crt"])).serial
    await tls.follow(lambda: SPEC, heartbeats)
    heartbeats.tls._handshake_done("orders-0.orders.shop.svc.cluster.local", serial)
    assert not heartbeats.tls._behind(time.monotonic())
    heartbeats.tls._handshake_done("orders-1.orders.shop.svc.cluster.local", "01")  # an older leaf
    assert heartbeats.tls._behind(time.monotonic())
