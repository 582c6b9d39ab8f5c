"""The certificate decisions of the controller, without a cluster: what to write given what the Secrets
hold (``operator_certificates.plan_and_issue``), the ownership refusal, no write when nothing is due,
``status.tls`` and ``CertificatesValid`` (``certificate_report``), with the clock passed in.

The Secrets are the manifests the module builds, stored the way the API server returns them
(``stored``: data base64, resourceVersion), so what is issued, stored and read back is the same bytes.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker_operator.controller import names
from broker_operator.controller import tls_secrets as shapes
from broker_operator.controller.certificate_report import (
    CA,
    CREDENTIAL_REFUSED,
    EXPIRED,
    EXPIRING_SOON,
    INVALID,
    MISSING,
    NOT_OWNED,
    OPERATOR_CLIENT,
    SERVER,
    VALID,
    CertificateReport,
    Entry,
    Problem,
    check_bundle,
    check_user_pair,
)
from broker_operator.controller.operator_certificates import (
    OperatorSecrets,
    Outcome,
    next_check,
    plan_and_issue,
)
from broker_operator.controller.tls_spec import CertificateLifetimes
from broker_operator.pki import (
    KeyPair,
    RenewalPolicy,
    Target,
    Verb,
    certificate_info,
    issue_client,
    issue_server,
    new_ca,
    server_dns_names,
    verifies,
)

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
UID = "0b5d4c7e-1111-4222-8333-444455556666"
OWNER = {
    "apiVersion": f"{names.GROUP}/{names.VERSION}",
    "kind": names.KIND,
    "metadata": {"name": "orders", "namespace": "shop", "uid": UID},
}
NAMES = server_dns_names("orders", "shop", range(2))
ACTIVE = "orders-active.shop.svc.cluster.local"
POLICY = RenewalPolicy()
SHORT = CertificateLifetimes(validity_days=2, renew_before_days=1).renewal_policy()


def stored(manifest: dict[str, Any], version: str = "1") -> dict[str, Any]:
    """``manifest`` as the API server returns it once created."""
    body = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": version}}
    return body


def applied(secret: dict[str, Any], data: dict[str, bytes] | None, version: str) -> dict[str, Any]:
    """``secret`` after a merge patch of ``data``."""
    if data is None:
        return secret
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {
        **secret,
        "data": {**secret["data"], **encoded},
        "metadata": {**secret["metadata"], "resourceVersion": version},
    }


def first_pass(policy: RenewalPolicy = POLICY, now: datetime = NOW) -> tuple[Outcome, OperatorSecrets]:
    outcome = plan_and_issue(
        OperatorSecrets(None, None), owner=OWNER, dns_names=NAMES, policy=policy, now=now
    )
    assert outcome.ca_data is not None and outcome.tls_data is not None and outcome.client_data is not None
    held = OperatorSecrets(
        stored(shapes.build_ca_secret(OWNER, outcome.ca_data)),
        stored(shapes.build_tls_secret(OWNER, outcome.tls_data)),
        stored(shapes.build_operator_client_secret(OWNER, outcome.client_data)),
    )
    return outcome, held


@pytest.fixture(scope="module")
def issued() -> tuple[Outcome, OperatorSecrets]:
    return first_pass()


@pytest.fixture(scope="module")
def issued_short() -> tuple[Outcome, OperatorSecrets]:
    return first_pass(SHORT)


# ---- mode Operator: what to issue and write -------------------------------------------------


def test_a_new_cluster_gets_a_ca_then_both_leaves_in_three_secrets(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    outcome, held = issued
    assert [(r.target, r.verb) for r in outcome.renewals] == [
        (Target.CA, Verb.ISSUE),
        (Target.SERVER, Verb.ISSUE),
        (Target.CLIENT, Verb.ISSUE),
    ]
    assert outcome.problems == () and not outcome.foreign_tls
    assert held.ca is not None and held.tls is not None and held.client is not None
    assert held.ca["type"] == "Opaque" and held.tls["type"] == "kubernetes.io/tls"
    assert held.client["type"] == "kubernetes.io/tls"
    # The CA's key alone in <name>-ca: the operator's client pair has a Secret of its own, which
    # RBAC can grant to kubectl broker's users without the power to issue certificates.
    assert set(held.ca["data"]) == {"ca.crt", "ca.key"}
    assert set(held.tls["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert set(held.client["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert held.client["metadata"]["name"] == "orders-operator-client"
    for secret in (held.ca, held.tls, held.client):
        meta = secret["metadata"]
        assert meta["labels"][shapes.LABEL_CERTIFICATES_OWNER] == UID
        assert meta["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY  # the writes guard's label
        (reference,) = meta["ownerReferences"]
        assert (reference["kind"], reference["uid"], reference["controller"]) == (names.KIND, UID, True)
    data = {k: base64.b64decode(v) for k, v in held.tls["data"].items()}
    ca_pem = base64.b64decode(held.ca["data"]["ca.crt"])
    assert data["ca.crt"] == ca_pem  # the trust bundle: the CA, which SAP imports
    assert verifies(data["tls.crt"], data["ca.crt"], dns_name=ACTIVE, now=NOW)
    client = base64.b64decode(held.client["data"]["tls.crt"])
    assert base64.b64decode(held.client["data"]["ca.crt"]) == ca_pem  # what the brokers chain to
    assert verifies(client, data["ca.crt"], now=NOW)
    assert certificate_info(client).dns_names == (shapes.OPERATOR_CLIENT_NAME,)
    assert ACTIVE in certificate_info(data["tls.crt"]).dns_names


def test_nothing_due_issues_nothing_and_writes_nothing(issued: tuple[Outcome, OperatorSecrets]) -> None:
    _, held = issued
    for now in (NOW, NOW + timedelta(days=59)):  # 90-day leaves, renewed 30 days ahead
        again = plan_and_issue(held, owner=OWNER, dns_names=NAMES, policy=POLICY, now=now)
        assert again.renewals == () and again.problems == ()
        assert again.ca_data is None and again.tls_data is None and again.client_data is None
        assert again.ca_removed == ()


def test_a_leaf_within_renew_before_days_is_reissued_and_the_ca_kept(
    issued_short: tuple[Outcome, OperatorSecrets],
) -> None:
    first, held = issued_short
    later = NOW + timedelta(hours=36)  # validityDays 2, renewBeforeDays 1: due after one day
    outcome = plan_and_issue(held, owner=OWNER, dns_names=NAMES, policy=SHORT, now=later)
    assert [(r.target, r.verb) for r in outcome.renewals] == [
        (Target.SERVER, Verb.REISSUE),
        (Target.CLIENT, Verb.REISSUE),
    ]
    assert all("expires in 12 hours" in r.reasons for r in outcome.renewals)
    assert outcome.ca_data is None  # the CA kept: <name>-ca is not written
    assert outcome.tls_data is not None and outcome.client_data is not None
    assert outcome.tls_data["ca.crt"] == first.ca_data["ca.crt"]  # type: ignore[index]
    assert outcome.client_data["ca.crt"] == first.ca_data["ca.crt"]  # type: ignore[index]
    server = {e.name: e for e in outcome.entries}[SERVER].info
    assert server is not None and server.not_after > later + timedelta(days=1)


def test_a_changed_name_reissues_the_server_certificate_only(issued: tuple[Outcome, OperatorSecrets]) -> None:
    _, held = issued
    more = (*NAMES, "erp-broker.example.com")
    outcome = plan_and_issue(held, owner=OWNER, dns_names=more, policy=POLICY, now=NOW)
    assert [(r.target, r.verb) for r in outcome.renewals] == [(Target.SERVER, Verb.REISSUE)]
    assert "+erp-broker.example.com" in outcome.renewals[0].reasons[0]
    assert outcome.ca_data is None and outcome.tls_data is not None


def test_a_ca_renewed_with_its_key_rewrites_the_bundle_of_the_tls_secret() -> None:
    policy = RenewalPolicy(certificate_days=90, renew_before_days=30, ca_days=400, ca_renew_before_days=365)
    first, held = first_pass(policy)
    later = NOW + timedelta(days=40)  # 360 days of the CA left: renewed, same key
    outcome = plan_and_issue(held, owner=OWNER, dns_names=NAMES, policy=policy, now=later)
    assert [(r.target, r.verb) for r in outcome.renewals] == [(Target.CA, Verb.RENEW_SAME_KEY)]
    assert outcome.ca_data is not None and outcome.tls_data is not None
    assert outcome.ca_data["ca.key"] == first.ca_data["ca.key"]  # type: ignore[index]
    assert outcome.ca_data["ca.crt"] != first.ca_data["ca.crt"]  # type: ignore[index]
    assert outcome.tls_data["ca.crt"] == outcome.ca_data["ca.crt"]
    assert outcome.tls_data["tls.crt"] == first.tls_data["tls.crt"]  # type: ignore[index]
    # The operator's client Secret's bundle follows too: what it verifies the brokers by.
    assert outcome.client_data is not None and outcome.client_data["ca.crt"] == outcome.ca_data["ca.crt"]
    assert outcome.client_data["tls.crt"] == first.client_data["tls.crt"]  # type: ignore[index]


def test_a_foreign_tls_secret_is_never_overwritten_and_holds_the_pods(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    _, held = issued
    assert held.tls is not None
    users = {**held.tls, "metadata": {"name": "orders-tls", "namespace": "shop", "labels": {"team": "sap"}}}
    outcome = plan_and_issue(
        OperatorSecrets(None, users, held.client), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    assert outcome.ca_data is None and outcome.tls_data is None and outcome.renewals == ()
    assert outcome.foreign_tls
    (problem,) = outcome.problems
    assert problem.reason == NOT_OWNED
    assert "shop/orders-tls" in problem.message and "does not overwrite" in problem.message
    assert "spec.tls.mode: Secrets" in problem.message


def test_a_secret_of_another_uid_is_not_ours_even_with_our_name_and_labels(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    _, held = issued
    other = {**OWNER, "metadata": {**OWNER["metadata"], "uid": "another-uid"}}
    outcome = plan_and_issue(held, owner=other, dns_names=NAMES, policy=POLICY, now=NOW)
    assert {p.reason for p in outcome.problems} == {NOT_OWNED}
    assert len(outcome.problems) == 3 and f"uid {UID}" in outcome.problems[0].message
    assert "orders-operator-client (the operator's client certificate)" in outcome.problems[2].message
    assert outcome.ca_data is None and outcome.tls_data is None and outcome.client_data is None


def test_an_unreadable_ca_is_reported_and_no_new_key_is_made(issued: tuple[Outcome, OperatorSecrets]) -> None:
    _, held = issued
    assert held.ca is not None
    broken = applied(
        held.ca, {"ca.crt": b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, "2"
    )
    outcome = plan_and_issue(
        OperatorSecrets(broken, held.tls, held.client), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    (problem,) = outcome.problems
    assert problem.reason == INVALID and "no new CA key" in problem.message
    assert outcome.ca_data is None and outcome.tls_data is None


def test_a_deleted_tls_secret_gets_a_new_server_certificate_from_the_same_ca(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    first, held = issued
    outcome = plan_and_issue(
        OperatorSecrets(held.ca, None, held.client), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    assert [(r.target, r.verb) for r in outcome.renewals] == [(Target.SERVER, Verb.ISSUE)]
    assert outcome.ca_data is None and outcome.tls_data is not None
    assert outcome.tls_data["ca.crt"] == first.ca_data["ca.crt"]  # type: ignore[index]


def legacy_ca(held: OperatorSecrets) -> dict[str, Any]:
    """``<name>-ca`` as an operator of the previous layout wrote it: the client pair beside the CA."""
    assert held.ca is not None and held.client is not None
    pair = {key: base64.b64decode(held.client["data"][key]) for key in ("tls.crt", "tls.key")}
    return applied(held.ca, {"client.crt": pair["tls.crt"], "client.key": pair["tls.key"]}, "7")


def test_an_upgrade_moves_the_client_pair_unchanged_then_drops_it_from_the_ca_secret(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    first, held = issued
    old_ca = legacy_ca(held)
    # Pass 1: the previous layout's pair is read from <name>-ca and written, as it is, into
    # <name>-operator-client; nothing is reissued, and <name>-ca keeps its keys for now.
    moved = plan_and_issue(
        OperatorSecrets(old_ca, held.tls, None), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    assert moved.renewals == () and moved.problems == ()
    assert moved.client_data == first.client_data
    assert moved.ca_data is None and moved.tls_data is None and moved.ca_removed == ()
    assert {e.name: e.secret for e in moved.entries}[OPERATOR_CLIENT] == "orders-operator-client"
    # Pass 2: the new Secret is stored and holds that pair: the old keys go, in a patch whose
    # nulls delete them, and the CA's own keys are written unchanged.
    created = stored(shapes.build_operator_client_secret(OWNER, moved.client_data))  # type: ignore[arg-type]
    dropped = plan_and_issue(
        OperatorSecrets(old_ca, held.tls, created), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    assert dropped.renewals == () and dropped.client_data is None and dropped.tls_data is None
    assert dropped.ca_removed == ("client.crt", "client.key")
    assert dropped.ca_data == first.ca_data
    patch = shapes.update_patch(OWNER, "7", dropped.ca_data, dropped.ca_removed)  # type: ignore[arg-type]
    assert patch["data"]["client.crt"] is None and patch["data"]["client.key"] is None
    assert patch["metadata"]["resourceVersion"] == "7"
    # Pass 3: nothing left to do.
    done = OperatorSecrets(held.ca, held.tls, created)
    idle = plan_and_issue(done, owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW)
    assert (idle.ca_data, idle.tls_data, idle.client_data, idle.ca_removed) == (None, None, None, ())


def test_the_old_keys_stay_while_the_new_secret_does_not_hold_the_pair_to_write(
    issued_short: tuple[Outcome, OperatorSecrets],
) -> None:
    _, held = issued_short
    old_ca = legacy_ca(held)
    later = NOW + timedelta(hours=36)  # the client certificate is due: the new Secret is rewritten
    outcome = plan_and_issue(
        OperatorSecrets(old_ca, held.tls, held.client), owner=OWNER, dns_names=NAMES, policy=SHORT, now=later
    )
    assert outcome.client_data is not None and outcome.ca_removed == () and outcome.ca_data is None


def test_a_foreign_operator_client_secret_is_never_overwritten(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    _, held = issued
    assert held.client is not None
    users = {**held.client, "metadata": {**held.client["metadata"], "labels": {"team": "sap"}}}
    outcome = plan_and_issue(
        OperatorSecrets(held.ca, held.tls, users), owner=OWNER, dns_names=NAMES, policy=POLICY, now=NOW
    )
    assert outcome.client_data is None and outcome.ca_data is None and not outcome.foreign_tls
    (problem,) = outcome.problems
    assert problem.reason == NOT_OWNED and "shop/orders-operator-client" in problem.message


def test_no_key_or_certificate_reaches_the_outcome_repr(issued: tuple[Outcome, OperatorSecrets]) -> None:
    outcome, _ = issued
    assert "PRIVATE KEY" not in repr(outcome) and "BEGIN" not in repr(outcome)
    assert all("BEGIN" not in str(r) for r in outcome.renewals)


# ---- status.tls and CertificatesValid -----------------------------------------------------------


def test_status_tls_lists_each_certificate_with_serial_and_not_after(
    issued: tuple[Outcome, OperatorSecrets],
) -> None:
    outcome, _ = issued
    report = CertificateReport("Operator", outcome.entries, renews=True)
    tls = report.status_tls()
    assert tls["mode"] == "Operator" and set(tls) == {
        "mode",
        "certificates",
    }  # served, caReplacement: not ours
    assert [(c["name"], c["secret"]) for c in tls["certificates"]] == [
        (CA, "orders-ca"),
        (SERVER, "orders-tls"),
        (OPERATOR_CLIENT, "orders-operator-client"),
    ]
    for entry in tls["certificates"]:
        assert re.fullmatch(r"[0-9a-f]+", entry["serial"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["notAfter"])
    assert tls["certificates"][1]["notAfter"] == "2027-02-26T12:00:00Z"  # NOW + 90 days
    condition = report.condition(NOW)
    assert condition is not None and (condition.status, condition.reason) == (True, VALID)
    assert "server, at 2027-02-26T12:00:00Z" in condition.message


def test_disabled_has_no_certificates_and_no_condition() -> None:
    report = CertificateReport("Disabled")
    assert report.status_tls() == {"mode": "Disabled", "certificates": None}
    assert report.condition(NOW) is None


def test_expiring_soon_is_true_and_names_the_date_not_a_countdown(
    issued_short: tuple[Outcome, OperatorSecrets],
) -> None:
    outcome, _ = issued_short
    report = CertificateReport("Operator", outcome.entries, warn_within=timedelta(days=1), renews=True)
    early = report.condition(NOW + timedelta(hours=1))
    assert early is not None and early.reason == VALID
    late = [report.condition(NOW + timedelta(hours=h)) for h in (25, 30)]
    assert all(c is not None and (c.status, c.reason) == (True, EXPIRING_SOON) for c in late)
    assert late[0] == late[1]  # the same message an hour later: no status write, no second event
    assert (
        late[0] is not None
        and "server (Secret orders-tls) expires at 2026-11-30T12:00:00Z" in late[0].message
    )
    expired = report.condition(NOW + timedelta(days=3))
    assert expired is not None and (expired.status, expired.reason) == (False, EXPIRED)


def test_the_most_severe_problem_names_the_reason_and_every_problem_is_said() -> None:
    report = CertificateReport(
        "Secrets",
        (Entry(SERVER, "x"),),
        (
            Problem(MISSING, "a key is missing"),
            Problem(INVALID, "does not parse"),
            Problem(CREDENTIAL_REFUSED, "c"),
        ),
    )
    condition = report.condition(NOW)
    assert condition is not None and (condition.status, condition.reason) == (False, INVALID)
    assert condition.message.startswith("does not parse; a key is missing")
    only_refused = CertificateReport("Secrets", (), (Problem(CREDENTIAL_REFUSED, "not read"),)).condition(NOW)
    assert only_refused is not None and (only_refused.status, only_refused.reason) == (
        None,
        CREDENTIAL_REFUSED,
    )


def test_next_check_is_the_first_renewal_warning_or_expiry_ahead(
    issued_short: tuple[Outcome, OperatorSecrets],
) -> None:
    outcome, _ = issued_short
    ahead = next_check(outcome.entries, policy=SHORT, warn_within=timedelta(0), now=NOW)
    assert ahead == timedelta(days=1)  # the leaves' renewal: 2 days less renewBeforeDays 1
    assert next_check((), policy=SHORT, warn_within=timedelta(0), now=NOW) is None


# ---- mode Secrets: the user's Secrets, only read ------------------------------------------------


def user_secret(pair: KeyPair | None, ca: bytes | None, *, drop: str | None = None) -> dict[str, Any]:
    data: dict[str, bytes] = {}
    if pair is not None:
        data.update({"tls.crt": pair.certificate_pem, "tls.key": pair.key_pem})
    if ca is not None:
        data["ca.crt"] = ca
    data.pop(drop or "", None)
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {
        "metadata": {"name": "erp-broker-tls", "namespace": "shop"},
        "type": "kubernetes.io/tls",
        "data": encoded,
    }


@pytest.fixture(scope="module")
def user_ca() -> KeyPair:
    return new_ca("customer CA", days=3650, now=NOW, key_bits=2048)


def check(secret: dict[str, Any] | None, *, server: bool = True, now: datetime = NOW) -> Any:
    return check_user_pair(
        SERVER if server else OPERATOR_CLIENT, secret, namespace="shop", secret_name="erp-broker-tls",
        field="spec.tls.secrets.server", dns_names=NAMES if server else None, now=now,
    )  # fmt: skip


def test_a_good_user_secret_is_reported_with_its_ca(user_ca: KeyPair) -> None:
    server = issue_server(user_ca, [ACTIVE], days=5, now=NOW)
    found = check(user_secret(server, user_ca.certificate_pem))
    assert found.problems == ()
    assert found.entry.info is not None and found.entry.info.serial == server.info().serial
    assert found.ca is not None and found.ca.secret == "erp-broker-tls:ca.crt"
    report = CertificateReport("Secrets", (found.ca, found.entry), found.problems)
    condition = report.condition(NOW)
    assert condition is not None and (condition.status, condition.reason) == (True, EXPIRING_SOON)
    assert "renew it" in condition.message


def test_a_missing_secret_or_key_is_missing_naming_both(user_ca: KeyPair) -> None:
    (absent,) = check(None).problems
    assert (
        absent.reason == MISSING
        and "Secret shop/erp-broker-tls (spec.tls.secrets.server) does not exist" in absent.message
    )
    server = issue_server(user_ca, [ACTIVE], days=30, now=NOW)
    (keyless,) = check(user_secret(server, user_ca.certificate_pem, drop="tls.key")).problems
    assert keyless.reason == MISSING and "has no key tls.key" in keyless.message


def test_a_wrong_key_a_wrong_name_and_a_wrong_ca_are_invalid(user_ca: KeyPair) -> None:
    server = issue_server(user_ca, [ACTIVE], days=30, now=NOW)
    other = issue_server(user_ca, [ACTIVE], days=30, now=NOW)
    (wrong_key,) = check(
        user_secret(KeyPair(server.certificate_pem, other.key_pem), user_ca.certificate_pem)
    ).problems
    assert wrong_key.reason == INVALID and "not the key of tls.crt" in wrong_key.message
    elsewhere = issue_server(user_ca, ["erp.example.com"], days=30, now=NOW)
    (name,) = check(user_secret(elsewhere, user_ca.certificate_pem)).problems
    assert name.reason == INVALID and "none of the names the brokers are dialled by" in name.message
    stranger = new_ca("stranger", days=30, now=NOW, key_bits=2048)
    (chain,) = check(user_secret(server, stranger.certificate_pem)).problems
    assert chain.reason == INVALID and "does not verify against its ca.crt" in chain.message
    client = issue_client(user_ca, "sap-operator", days=30, now=NOW)
    assert check(user_secret(client, user_ca.certificate_pem), server=False).problems == ()


def test_an_expired_user_certificate_is_expired_not_invalid(user_ca: KeyPair) -> None:
    server = issue_server(user_ca, [ACTIVE], days=2, now=NOW)
    later = NOW + timedelta(days=3)
    found = check(user_secret(server, user_ca.certificate_pem), now=later)
    assert found.problems == ()
    condition = CertificateReport("Secrets", (found.entry,), found.problems).condition(later)
    assert condition is not None and (condition.status, condition.reason) == (False, EXPIRED)


def test_a_bundle_reports_its_first_certificate_or_what_is_missing(user_ca: KeyPair) -> None:
    secret = user_secret(None, user_ca.certificate_pem)
    entry, problem = check_bundle(
        "upstreamCA",
        secret,
        namespace="shop",
        secret_name="cloud-ca",
        key="ca.crt",
        field="spec.tls.upstreamCASecretRef",
    )
    assert problem is None and entry.secret == "cloud-ca:ca.crt"
    assert entry.info is not None and entry.info.serial == user_ca.info().serial
    _, missing = check_bundle(
        "upstreamCA",
        secret,
        namespace="shop",
        secret_name="cloud-ca",
        key="bundle.pem",
        field="spec.tls.upstreamCASecretRef",
    )
    assert missing is not None and missing.reason == MISSING and "no key bundle.pem" in missing.message


def test_an_oversized_value_is_refused_before_it_is_decoded() -> None:
    huge = {"data": {"tls.crt": "A" * (1 << 20)}}
    with pytest.raises(ValueError, match="over the 65536-byte limit"):
        shapes.secret_pem(huge, "tls.crt", what="Secret shop/x tls.crt")
