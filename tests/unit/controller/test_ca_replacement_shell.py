"""The CA key replacement in the reconcile pass, against the in-memory Secret store of
``certificate_passes``: every transition (Done -> Trusting -> Reissuing -> Retiring -> Done)
with what it writes, the event and ``status.tls.caReplacement``; and that no stale or missing
observation (a broker that has not loaded the bundle, a handshake before the reissue, the
heartbeats still presenting the old client certificate, no engine at all) ever issues a leaf of the
new CA before the brokers trust it, or drops the old CA while anything still uses it."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from broker_operator.controller import ca_replacement as replacing
from broker_operator.controller.context import ControllerContext
from broker_operator.pki import bundle_certificates, bundle_version, certificate_info, verifies
from tests.unit.controller.certificate_passes import (
    NOW,
    SecretStore,
    body,
    context_for,
    reconcile,
)

BROKERS = ("orders-0", "orders-1")
Events = list[tuple[str, str, str]]


def data(store: SecretStore, name: str) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in store.secrets[name]["data"].items()}


def fingerprints(bundle: bytes) -> set[str]:
    return {certificate_info(c.public_bytes(Encoding.PEM)).fingerprint for c in bundle_certificates(bundle)}


class Heartbeats:
    """What the daemon publishes of the heartbeat client, set by the test."""

    def __init__(self, context: ControllerContext) -> None:
        self.loaded: dict[str, str] = {}
        self.served: dict[str, str] = {}
        self.presented: bytes | None = None
        observations = context.observations_for("shop", "orders")
        observations.pods = {name: {} for name in BROKERS}  # type: ignore[misc]  # no pod missing
        observations.loaded_bundles = lambda: dict(self.loaded)
        observations.served_serials = lambda: dict(self.served)
        observations.presented_certificate = lambda: self.presented

    def follow(self, store: SecretStore, *, brokers: tuple[str, ...] = BROKERS) -> None:
        """The brokers load what the Secrets hold, and the heartbeats take the new material."""
        tls = data(store, "orders-tls")
        for broker in brokers:
            self.loaded[broker] = bundle_version(tls["ca.crt"])
            self.served[broker] = certificate_info(tls["tls.crt"]).serial
        self.presented = data(store, "orders-operator-client")["tls.crt"]


def annotate(manifest: dict[str, Any], **annotations: str) -> None:
    meta = manifest["metadata"].setdefault("annotations", {})
    meta.update({f"broker.failover.dev/{key.replace('_', '-')}": value for key, value in annotations.items()})


def phase(store: SecretStore) -> str | None:
    raw = data(store, "orders-ca").get(replacing.PHASE_KEY)
    return raw.decode() if raw is not None else None


def replacement_status(manifest: Mapping[str, Any]) -> dict[str, str]:
    return dict(manifest["status"]["tls"]["caReplacement"])


async def started() -> tuple[SecretStore, ControllerContext, dict[str, Any], Heartbeats]:
    store = SecretStore()
    context, manifest = context_for(store), body()
    heartbeats = Heartbeats(context)
    await reconcile(context, manifest)
    heartbeats.follow(store)
    return store, context, manifest, heartbeats


async def test_every_phase_in_turn_with_its_writes_events_and_status(  # noqa: PLR0915  (one story, in order)
    events: Events,
) -> None:
    store, context, manifest, heartbeats = await started()
    old_ca = data(store, "orders-ca")["ca.crt"]
    old_server, old_client = (
        data(store, "orders-tls")["tls.crt"],
        data(store, "orders-operator-client")["tls.crt"],
    )
    events.clear()
    await reconcile(context, manifest)
    assert "caReplacement" not in manifest["status"].get("tls", {})  # none ever asked for

    # Done -> Trusting: the new CA joins both bundles; the leaves stay the old CA's.
    annotate(manifest, replace_ca_key="2026-q4")
    store.writes.clear()
    await reconcile(context, manifest)  # read at once: the annotation changed
    ca = data(store, "orders-ca")
    assert phase(store) == "Trusting" and ca["replacement.token"] == b"2026-q4"
    assert ca["ca.crt"] == old_ca and "incoming.crt" in ca and "incoming.key" in ca
    new_ca = ca["incoming.crt"]
    both = {certificate_info(old_ca).fingerprint, certificate_info(new_ca).fingerprint}
    for name in ("orders-tls", "orders-operator-client"):
        assert fingerprints(data(store, name)["ca.crt"]) == both
    assert data(store, "orders-tls")["tls.crt"] == old_server
    assert data(store, "orders-operator-client")["tls.crt"] == old_client
    assert store.writes == [
        ("patch", "orders-ca"),
        ("patch", "orders-tls"),
        ("patch", "orders-operator-client"),
    ]
    assert [e[:2] for e in events] == [("Normal", "CAReplacementTrusting")]
    status = replacement_status(manifest)
    assert status["token"] == "2026-q4" and status["phase"] == "Trusting"

    # Trusting waits for every broker to load the bundle and for a person's confirmation.
    store.writes.clear()
    await reconcile(context, manifest)
    message = replacement_status(manifest)["message"]
    assert "orders-0, orders-1 to load trust bundle" in message
    assert (
        "kubectl annotate --overwrite -n shop brokercluster/orders "
        "broker.failover.dev/replace-ca-key-trusted=2026-q4" in message
    )
    assert "kubectl broker ca orders -n shop" in message
    heartbeats.follow(store)
    await reconcile(context, manifest)
    assert phase(store) == "Trusting" and "to load" not in replacement_status(manifest)["message"]
    annotate(manifest, replace_ca_key_trusted="an-earlier-one")  # confirms another replacement: nothing
    await reconcile(context, manifest)
    assert phase(store) == "Trusting" and store.writes == []

    # Trusting -> Reissuing: both leaves from the new CA, the bundles unchanged.
    annotate(manifest, replace_ca_key_trusted="2026-q4")
    await reconcile(context, manifest)
    assert phase(store) == "Reissuing"
    tls, client = data(store, "orders-tls"), data(store, "orders-operator-client")
    assert verifies(tls["tls.crt"], new_ca, dns_name="orders-active.shop.svc.cluster.local", now=NOW)
    assert not verifies(tls["tls.crt"], old_ca, dns_name="orders-active.shop.svc.cluster.local", now=NOW)
    assert verifies(client["tls.crt"], new_ca, now=NOW)
    assert fingerprints(tls["ca.crt"]) == fingerprints(client["ca.crt"]) == both
    assert [e[1] for e in events][-3:] == [
        "CAReplacementReissuing",
        "CertificateRenewed",
        "CertificateRenewed",
    ]
    assert "server to be issued" not in replacement_status(manifest)["message"]

    # Reissuing waits for every broker to serve the new serial and the heartbeats to present the new
    # client certificate; then Retiring drops the old CA from both bundles and the CA Secret.
    await reconcile(context, manifest)
    assert phase(store) == "Reissuing"
    assert "to serve the new CA's server certificate" in replacement_status(manifest)["message"]
    heartbeats.follow(store)
    store.writes.clear()
    await reconcile(context, manifest)
    assert phase(store) == "Retiring"
    ca = data(store, "orders-ca")
    assert ca["ca.crt"] == new_ca and not set(ca) & {"incoming.crt", "incoming.key"}
    for name in ("orders-tls", "orders-operator-client"):
        assert fingerprints(data(store, name)["ca.crt"]) == {certificate_info(new_ca).fingerprint}
    assert data(store, "orders-tls")["tls.crt"] == tls["tls.crt"]  # no leaf reissued
    assert events[-1][1] == "CAReplacementRetiring"

    # Retiring -> Done once every broker loaded the new CA alone.
    await reconcile(context, manifest)
    assert phase(store) == "Retiring" and "to load trust bundle" in replacement_status(manifest)["message"]
    heartbeats.follow(store)
    await reconcile(context, manifest)
    assert phase(store) == "Done"
    assert events[-1][1] == "CAReplacementDone"
    assert replacement_status(manifest)["phase"] == "Done"
    # Settled: a pass after reads once more (the transition asked for it), then nothing is read.
    await reconcile(context, manifest)
    reads, writes = store.reads, len(store.writes)
    await reconcile(context, manifest)
    assert (store.reads, len(store.writes)) == (reads, writes)
    assert [e[1] for e in events].count("CAReplacementDone") == 1
    assert "is done" in replacement_status(manifest)["message"]


async def _to_trusting(events: Events) -> tuple[SecretStore, ControllerContext, dict[str, Any], Heartbeats]:
    store, context, manifest, heartbeats = await started()
    annotate(manifest, replace_ca_key="t1", replace_ca_key_trusted="t1")
    await reconcile(context, manifest)
    assert phase(store) == "Trusting"
    return store, context, manifest, heartbeats


@pytest.mark.parametrize("stale", ["one broker on the old bundle", "one broker never answered", "no engine"])
async def test_no_leaf_of_the_new_ca_before_every_broker_trusts_it(events: Events, stale: str) -> None:
    store, context, manifest, heartbeats = await _to_trusting(events)
    old_ca = data(store, "orders-ca")["ca.crt"]
    heartbeats.follow(store)
    if stale == "one broker on the old bundle":
        heartbeats.loaded["orders-1"] = bundle_version(old_ca)
    elif stale == "one broker never answered":
        del heartbeats.loaded["orders-1"]
    else:
        observations = context.observations_for("shop", "orders")
        observations.loaded_bundles = observations.served_serials = observations.presented_certificate = None
    for _ in range(3):
        await reconcile(context, manifest)
    assert phase(store) == "Trusting"
    said = replacement_status(manifest)["message"]
    assert ("no broker has reported a trust bundle" in said) == (stale == "no engine"), said
    assert verifies(data(store, "orders-tls")["tls.crt"], old_ca, dns_name="orders-active.shop.svc", now=NOW)
    assert verifies(data(store, "orders-operator-client")["tls.crt"], old_ca, now=NOW)


@pytest.mark.parametrize(
    "stale",
    ["a broker serves the old serial", "heartbeats present the old client", "a broker not seen", "no engine"],
)
async def test_the_old_ca_stays_in_trust_while_anything_uses_it(events: Events, stale: str) -> None:
    store, context, manifest, heartbeats = await _to_trusting(events)
    old_ca = data(store, "orders-ca")["ca.crt"]
    old_serial = certificate_info(data(store, "orders-tls")["tls.crt"]).serial
    heartbeats.follow(store)
    await reconcile(context, manifest)
    assert phase(store) == "Reissuing"
    old_client = heartbeats.presented
    heartbeats.follow(store)  # everything caught up ...
    if stale == "a broker serves the old serial":  # ... but one
        heartbeats.served["orders-0"] = old_serial
    elif stale == "heartbeats present the old client":  # the Secret is new, the engine not yet
        heartbeats.presented = old_client
    elif stale == "a broker not seen":
        del heartbeats.served["orders-1"]
    else:
        observations = context.observations_for("shop", "orders")
        observations.loaded_bundles = observations.served_serials = observations.presented_certificate = None
    for _ in range(3):
        await reconcile(context, manifest)
    assert phase(store) == "Reissuing"
    old = certificate_info(old_ca).fingerprint
    for name in ("orders-tls", "orders-operator-client"):
        assert old in fingerprints(data(store, name)["ca.crt"])
    assert data(store, "orders-ca")["ca.crt"] == old_ca


async def test_a_served_serial_with_a_leading_zero_octet_is_the_same_serial() -> None:
    seen = replacing.Seen(served_serials={"orders-0": "0A1B", "orders-1": "a1b", "orders-2": "not hex"})
    assert seen.served() == {"orders-0": "0a1b", "orders-1": "0a1b"}  # as CertificateInfo.serial


async def test_a_new_token_during_a_replacement_waits_for_it_to_finish(events: Events) -> None:
    store, context, manifest, _ = await _to_trusting(events)
    incoming = data(store, "orders-ca")["incoming.crt"]
    annotate(manifest, replace_ca_key="t2")
    await reconcile(context, manifest)
    assert phase(store) == "Trusting" and data(store, "orders-ca")["incoming.crt"] == incoming
    assert data(store, "orders-ca")["replacement.token"] == b"t1"


async def test_a_ca_made_while_the_annotation_is_set_starts_nothing(events: Events) -> None:
    store = SecretStore()
    context, manifest = context_for(store), body()
    annotate(manifest, replace_ca_key="from-the-start")
    Heartbeats(context)
    await reconcile(context, manifest)
    await reconcile(context, manifest)
    assert phase(store) == "Done" and "incoming.crt" not in data(store, "orders-ca")
    assert not [e for e in events if e[1].startswith("CAReplacement")]


async def test_an_unknown_phase_in_the_ca_secret_is_invalid_not_guessed(events: Events) -> None:
    store, context, manifest, _ = await started()
    store.secrets["orders-ca"]["data"][replacing.PHASE_KEY] = base64.b64encode(b"Sideways").decode()
    store.secrets["orders-ca"]["data"][replacing.TOKEN_KEY] = base64.b64encode(b"x").decode()
    store.writes.clear()
    context.certificate_checks.clear()
    await reconcile(context, manifest)
    condition = next(c for c in manifest["status"]["conditions"] if c["type"] == "CertificatesValid")
    assert condition["status"] == "False" and "replacement.phase is 'Sideways'" in condition["message"]
    assert store.writes == []
