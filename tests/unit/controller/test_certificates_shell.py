"""``certificates.ensure_certificates`` and ``client_tls.client_material`` against an in-memory Secret
store that keeps resourceVersions and answers 409 as the API server does: what is read, what is
written (nothing on an idle pass), a create that meets another replica's Secret, an update that
meets a newer version, the status patch and the events (kopf's posting replaced by a recorder)."""

from __future__ import annotations

import base64
import copy
from datetime import timedelta
from typing import Any

from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.certificates import client_material, read_client_material
from broker_operator.controller.context import ControllerContext
from broker_operator.controller.settings import ControllerSettings
from broker_operator.controller.spec import parse_spec
from broker_operator.pki import issue_client, issue_server, new_ca, verifies
from tests.unit.controller.certificate_passes import (
    NOW,
    SECRETS,
    SecretStore,
    body,
    condition,
    context_for,
    expire_cache,
    reconcile,
)


async def test_the_first_pass_writes_three_secrets_and_an_idle_pass_nothing(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    context, manifest = context_for(store), body()
    patch, held = await reconcile(context, manifest)
    assert not held
    # The CA first; the operator's client Secret last (its ca.crt names the CA stored).
    assert store.writes == [
        ("create", "orders-ca"),
        ("create", "orders-tls"),
        ("create", "orders-operator-client"),
    ]
    assert [e[1] for e in events] == ["CertificateIssued"] * 3
    assert "Secret orders-operator-client" in events[2][2]
    assert patch["tls"]["mode"] == "Operator" and len(patch["tls"]["certificates"]) == 3
    assert condition(manifest)["reason"] == "Valid"
    reads = store.reads
    again, _ = await reconcile(context, manifest)  # a pod is missing (about to be made): read again
    assert again == {} and store.reads == reads + SECRETS and len(store.writes) == 3
    reads = store.reads
    context.observations_for("shop", "orders").pods = {"orders-0": {}, "orders-1": {}}  # type: ignore[typeddict-item]
    again, _ = await reconcile(context, manifest)  # cached: nothing read, nothing written
    assert again == {} and store.reads == reads and len(store.writes) == 3
    expire_cache(context)
    again, _ = await reconcile(context, manifest)  # read again: still nothing due, nothing written
    assert again == {} and store.reads == reads + SECRETS and len(store.writes) == 3 and len(events) == 3


async def test_an_upgrade_from_the_client_pair_in_the_ca_secret_moves_it_then_drops_it(
    events: list[tuple[str, str, str]],
) -> None:
    """A cluster whose <name>-ca an operator of the previous layout wrote (the client pair beside
    the CA): the heartbeats keep reading it until <name>-operator-client exists, the pair moves
    unchanged (no reissue), and the old keys leave <name>-ca on the next pass."""
    store = SecretStore()
    context, manifest = context_for(store), body()
    await reconcile(context, manifest)
    client = store.secrets.pop("orders-operator-client")
    ca = store.secrets["orders-ca"]
    ca["data"].update({"client.crt": client["data"]["tls.crt"], "client.key": client["data"]["tls.key"]})
    spec = parse_spec("orders", manifest["spec"]).tls
    legacy = await client_material(store, "shop", "orders", spec)  # type: ignore[arg-type]
    assert legacy is not None and legacy.certificate_pem == base64.b64decode(client["data"]["tls.crt"])
    manifest = body()
    store.writes.clear()
    patch, _ = await reconcile(context_for(store), manifest)
    assert store.writes == [("create", "orders-operator-client")]  # moved; <name>-ca not yet touched
    assert store.secrets["orders-operator-client"]["data"] == client["data"]  # the same pair, not reissued
    assert {"client.crt", "client.key"} <= set(store.secrets["orders-ca"]["data"])
    assert [e[1] for e in events] == ["CertificateIssued"] * 3  # the first reconcile's, none new
    entries = {c["name"]: c["secret"] for c in patch["tls"]["certificates"]}
    assert entries["operatorClient"] == "orders-operator-client"
    # The next pass reads at once (the move asks for it) and drops the old keys.
    context = context_for(store)
    context.certificate_checks = {}
    await reconcile(context, manifest)
    assert store.writes == [("create", "orders-operator-client"), ("patch", "orders-ca")]
    assert set(store.secrets["orders-ca"]["data"]) == {"ca.crt", "ca.key"}
    moved = await client_material(store, "shop", "orders", spec)  # type: ignore[arg-type]
    assert moved is not None and moved.version == legacy.version  # the heartbeats see no change
    expire_cache(context)
    await reconcile(context, manifest)
    assert len(store.writes) == 2  # settled: nothing more to write


async def test_a_create_that_meets_another_replicas_ca_uses_it(events: list[tuple[str, str, str]]) -> None:
    store, other = SecretStore(), SecretStore()
    await reconcile(context_for(other), body())  # the other replica's CA and certificate

    async def other_replica_first() -> None:
        store.secrets["orders-ca"] = copy.deepcopy(other.secrets["orders-ca"])

    store.before_create = other_replica_first
    context, manifest = context_for(store), body()
    await reconcile(context, manifest)
    assert store.secrets["orders-ca"]["data"] == other.secrets["orders-ca"]["data"]  # theirs, kept
    ca_pem = base64.b64decode(store.secrets["orders-ca"]["data"]["ca.crt"])
    tls = {k: base64.b64decode(v) for k, v in store.secrets["orders-tls"]["data"].items()}
    assert tls["ca.crt"] == ca_pem
    assert verifies(tls["tls.crt"], ca_pem, dns_name="orders-active.shop.svc.cluster.local", now=NOW)


async def test_an_update_that_meets_a_newer_version_waits_for_the_next_pass(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    context, manifest = (
        context_for(store),
        body(tls={"certificates": {"validityDays": 2, "renewBeforeDays": 1}}),
    )
    await reconcile(context, manifest)
    later = NOW + timedelta(hours=36)
    real_patch = store.patch_secret

    async def bumped_first(namespace: str, name: str, patch: dict[str, Any]) -> bool:
        store.secrets[name] = store._stored(store.secrets[name])  # someone wrote it meanwhile
        return await real_patch(namespace, name, patch)

    store.patch_secret = bumped_first  # type: ignore[method-assign]
    expire_cache(context)
    await reconcile(context, manifest, later)
    assert not [e for e in events if e[1] == "CertificateRenewed"]  # nothing was written
    store.patch_secret = real_patch  # type: ignore[method-assign]
    await reconcile(context, manifest, later)  # due again at once: this pass renews
    renewed = [e for e in events if e[1] == "CertificateRenewed"]
    assert [e[2].split(":")[0] for e in renewed] == ["server", "client"]
    assert all("expires in 12 hours" in e[2] for e in renewed)


async def test_a_foreign_tls_secret_holds_the_pods_and_is_reported_once(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    store.secrets["orders-tls"] = {
        "metadata": {"name": "orders-tls", "namespace": "shop", "resourceVersion": "7"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "", "tls.key": ""},
    }
    context, manifest = context_for(store), body()
    _, held = await reconcile(context, manifest)
    assert held and store.writes == []
    assert (condition(manifest)["status"], condition(manifest)["reason"]) == ("False", "NotOwned")
    expire_cache(context)
    await reconcile(context, manifest)
    assert [e[:2] for e in events] == [("Warning", "CertificateNotOwned")]  # once per distinct problem
    no_tls = ControllerContext(settings=ControllerSettings(broker_tls=False), api=store)  # type: ignore[arg-type]
    assert not (await reconcile(no_tls, body()))[1]  # pods that mount no TLS are not held


async def test_disabled_reports_the_mode_and_removes_the_condition(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    stale = {"type": "CertificatesValid", "status": "True", "reason": "Valid", "message": "x"}
    old_tls = {"mode": "Operator", "certificates": [{"name": "ca", "secret": "orders-ca"}], "served": []}
    manifest = body({"conditions": [stale], "tls": old_tls}, tls={"mode": "Disabled"})
    patch, _ = await reconcile(context_for(store), manifest)
    assert patch["tls"] == {"mode": "Disabled", "certificates": None}  # served stays (a merge patch)
    assert patch["conditions"] == []
    assert store.reads == 0 and store.writes == [] and events == []


async def test_mode_secrets_reads_and_never_writes(events: list[tuple[str, str, str]]) -> None:
    ca = new_ca("customer", days=365, now=NOW, key_bits=2048)
    server = issue_server(ca, ["orders-active.shop.svc.cluster.local"], days=60, now=NOW)
    client = issue_client(ca, "sap-operator", days=60, now=NOW)

    def user(name: str, pair: Any, labelled: bool = True) -> dict[str, Any]:
        data = {"tls.crt": pair.certificate_pem, "tls.key": pair.key_pem, "ca.crt": ca.certificate_pem}
        labels = {names.LABEL_CREDENTIAL: "true"} if labelled else {}
        return {
            "metadata": {"name": name, "namespace": "shop", "labels": labels, "resourceVersion": "3"},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    store = SecretStore()
    store.secrets = {"srv": user("srv", server), "cli": user("cli", client)}
    tls = {"mode": "Secrets", "secrets": {"server": "srv", "operatorClient": "cli"}}
    manifest = body(tls=tls)
    patch, _ = await reconcile(context_for(store), manifest)
    assert store.writes == []
    assert [c["name"] for c in patch["tls"]["certificates"]] == ["ca", "server", "operatorClient"]
    assert condition(manifest)["reason"] == "Valid"
    material = await client_material(store, "shop", "orders", parse_spec("orders", manifest["spec"]).tls)  # type: ignore[arg-type]
    assert material is not None and material.certificate_pem == client.certificate_pem
    assert material.trust_bundle_pem == ca.certificate_pem and "BEGIN" not in repr(material)
    store.secrets["cli"] = user("cli", client, labelled=False)
    refused = await read_client_material(store, "shop", "orders", parse_spec("orders", manifest["spec"]).tls)  # type: ignore[arg-type]
    assert (
        refused.material is None
        and refused.reason is not None
        and "does not carry the label" in refused.reason
    )
    manifest = body(tls=tls)
    await reconcile(context_for(store), manifest)
    assert (condition(manifest)["status"], condition(manifest)["reason"]) == ("Unknown", "CredentialRefused")
    assert events == []  # CredentialsAllowed posts that one


async def test_client_material_in_mode_operator_is_the_operators_client_and_the_ca(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    manifest = body()
    spec = parse_spec("orders", manifest["spec"])
    missing = await read_client_material(store, "shop", "orders", spec.tls)  # type: ignore[arg-type]
    assert missing.material is None
    assert missing.reason == "Secret shop/orders-operator-client does not exist yet"
    await reconcile(context_for(store), manifest)
    material = await client_material(store, "shop", "orders", spec.tls)  # type: ignore[arg-type]
    assert material is not None
    data = {k: base64.b64decode(v) for k, v in store.secrets["orders-operator-client"]["data"].items()}
    assert (material.certificate_pem, material.key_pem) == (data["tls.crt"], data["tls.key"])
    assert material.trust_bundle_pem == data["ca.crt"]
    assert data["ca.crt"] == base64.b64decode(store.secrets["orders-ca"]["data"]["ca.crt"])
    server = base64.b64decode(store.secrets["orders-tls"]["data"]["tls.crt"])
    assert verifies(server, material.trust_bundle_pem, dns_name="orders-active.shop.svc", now=NOW)
    foreign = copy.deepcopy(store.secrets["orders-operator-client"])
    foreign["metadata"]["ownerReferences"] = []
    store.secrets["orders-operator-client"] = foreign
    refused = await read_client_material(store, "shop", "orders", spec.tls)  # type: ignore[arg-type]
    assert refused.material is None and refused.reason is not None
    assert "orders-operator-client is not recorded as the operator's" in refused.reason
    assert shapes.LABEL_CERTIFICATES_OWNER in foreign["metadata"]["labels"]  # the label alone is not enough


async def test_a_refused_write_is_write_failed_and_not_retried_every_pass(
    events: list[tuple[str, str, str]],
) -> None:
    from kubernetes.client.exceptions import ApiException

    store = SecretStore()

    async def forbidden(manifest: dict[str, Any]) -> bool:
        store.writes.append(("create", manifest["metadata"]["name"]))
        raise ApiException(status=403, reason="Forbidden")

    store.create = forbidden  # type: ignore[method-assign]
    context, manifest = context_for(store), body()
    context.observations_for("shop", "orders").pods = {"orders-0": {}, "orders-1": {}}  # type: ignore[typeddict-item]
    patch, _ = await reconcile(context, manifest)
    found = condition(manifest)
    assert (found["status"], found["reason"]) == ("False", "WriteFailed")
    assert "403 Forbidden" in found["message"] and "shop/orders-ca" in found["message"]
    assert [c.get("serial") for c in patch["tls"]["certificates"]] == [None, None, None]  # nothing stored
    assert [e[:2] for e in events] == [("Warning", "CertificateWriteFailed")]  # no CertificateIssued
    await reconcile(context, manifest)  # within --certificates-recheck-seconds: no new keys, no write
    assert store.writes == [("create", "orders-ca")]


async def test_served_serials_reach_the_status_when_they_change_and_idle_passes_write_nothing(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    context = context_for(store)
    brokers = [{"name": "orders-0"}, {"name": "orders-1"}]
    manifest = body({"brokers": brokers})
    await reconcile(context, manifest)
    observations = context.observations_for("shop", "orders")
    seen: dict[str, str] = {}
    observations.served_serials = lambda: dict(seen)
    assert (await reconcile(context, manifest))[0] == {}  # no handshake yet: nothing to say
    seen["orders-0"] = "1a2b"
    patch, _ = await reconcile(context, manifest)
    assert patch == {"tls": {"served": [{"broker": "orders-0", "serial": "1a2b"}]}}  # served alone
    assert manifest["status"]["tls"]["mode"] == "Operator"  # the rest of status.tls as it was
    assert (await reconcile(context, manifest))[0] == {}  # the same serials: no write
    seen["orders-1"] = "3c4d"
    patch, _ = await reconcile(context, manifest)
    assert patch["tls"]["served"] == [
        {"broker": "orders-0", "serial": "1a2b"},
        {"broker": "orders-1", "serial": "3c4d"},
    ]
    # A rotation seen by a fresh handshake with orders-1; the engine restarted since (orders-0
    # not handshaken yet by this one) keeps what was recorded for orders-0.
    seen.clear()
    seen["orders-1"] = "5e6f"
    patch, _ = await reconcile(context, manifest)
    assert patch["tls"]["served"] == [
        {"broker": "orders-0", "serial": "1a2b"},
        {"broker": "orders-1", "serial": "5e6f"},
    ]
    observations.served_serials = None  # the engine stopped: nothing known, nothing written
    assert (await reconcile(context, manifest))[0] == {}
    observations.served_serials = lambda: dict(seen)
    manifest["status"]["brokers"] = [{"name": "orders-1"}]  # orders-0 scaled away
    patch, _ = await reconcile(context, manifest)
    assert patch["tls"]["served"] == [{"broker": "orders-1", "serial": "5e6f"}]
    manifest["spec"]["tls"] = {"mode": "Disabled"}
    manifest["metadata"]["generation"] = 2
    patch, _ = await reconcile(context, manifest)
    assert patch["tls"] == {"mode": "Disabled", "certificates": None, "served": None}
    assert "served" not in manifest["status"]["tls"]


async def test_heartbeat_tls_problems_are_one_warning_per_distinct_problem_then_a_recovery(
    events: list[tuple[str, str, str]],
) -> None:
    store = SecretStore()
    context, manifest = context_for(store), body()
    await reconcile(context, manifest)
    events.clear()
    observations = context.observations_for("shop", "orders")
    problems: dict[str, str] = {}
    observations.tls_problems = lambda: dict(problems)
    pod = "orders-1.orders-brokers.shop.svc.cluster.local"
    expired = f"certificate verify failed: certificate has expired for {pod}"
    problems["orders-1"] = expired
    for _ in range(3):  # every reconcile pass sees it; a person is told once
        await reconcile(context, manifest)
    assert events == [
        (
            "Warning",
            "HeartbeatTLSFailed",
            f"heartbeats to orders-1 fail TLS: {expired}. Not counted toward a failover (a certificate "
            "error is no proof of death); fix the certificates (condition CertificatesValid)",
        )
    ]
    refused = (
        "orders-1.orders-brokers.shop.svc.cluster.local refused the TLS handshake, again on a new connection"
    )
    problems["orders-1"] = refused  # another problem: said again
    await reconcile(context, manifest)
    assert [e[1] for e in events] == ["HeartbeatTLSFailed"] * 2 and refused in events[1][2]
    problems.clear()  # it answers again
    await reconcile(context, manifest)
    await reconcile(context, manifest)
    assert events[2:] == [("Normal", "HeartbeatTLSRecovered", "heartbeats to orders-1 work over TLS again")]
    problems["orders-1"] = expired  # the same problem as before, after a recovery: said again
    await reconcile(context, manifest)
    failed, recovered = "HeartbeatTLSFailed", "HeartbeatTLSRecovered"
    assert [e[1] for e in events] == [failed, failed, recovered, failed]
    observations.tls_problems = None  # no engine: no recovery is claimed
    await reconcile(context, manifest)
    assert len(events) == 4 and all("BEGIN" not in e[2] for e in events)
