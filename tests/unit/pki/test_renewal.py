"""What ``plan_renewal`` asks for, and the reasons it gives (they become events)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from broker_operator.pki import (
    CertificateError,
    KeyPair,
    Materials,
    RenewalPolicy,
    Target,
    Verb,
    expiry_warnings,
    issue_client,
    issue_server,
    plan_renewal,
    renew_ca,
)
from tests.unit.pki.conftest import NAMES, NOW, OPERATOR

POLICY = RenewalPolicy()


def plan(materials: Materials, *, names: tuple[str, ...] = NAMES, days: float = 0) -> list[str]:
    return [
        str(renewal)
        for renewal in plan_renewal(
            materials,
            server_dns_names=names,
            client_name=OPERATOR,
            policy=POLICY,
            now=NOW + timedelta(days=days),
        )
    ]


def test_nothing_to_do_while_everything_is_good(ca: KeyPair, server: KeyPair, client: KeyPair) -> None:
    good = Materials(ca, server, client)
    assert plan(good) == []
    assert plan(good, days=60 - 0.01) == []  # 30 days and a bit left


def test_an_empty_cluster_gets_everything_ca_first() -> None:
    renewals = plan_renewal(
        Materials(None, None, None), server_dns_names=NAMES, client_name=OPERATOR, policy=POLICY, now=NOW
    )
    assert [(r.target, r.verb) for r in renewals] == [
        (Target.CA, Verb.ISSUE),
        (Target.SERVER, Verb.ISSUE),
        (Target.CLIENT, Verb.ISSUE),
    ]
    assert [str(r) for r in renewals] == [
        "ca: issue (missing)",
        "server: issue (missing)",
        "client: issue (missing)",
    ]


def test_leaves_of_a_lost_ca_are_reissued(server: KeyPair, client: KeyPair) -> None:
    assert plan(Materials(None, server, client)) == [
        "ca: issue (missing)",
        "server: reissue (the CA is issued anew)",
        "client: reissue (the CA is issued anew)",
    ]


def test_leaves_are_renewed_within_the_window(ca: KeyPair, server: KeyPair, client: KeyPair) -> None:
    assert plan(Materials(ca, server, client), days=70) == [
        "server: reissue (expires in 20 days)",
        "client: reissue (expires in 20 days)",
    ]
    assert plan(Materials(ca, server, None), days=95) == [
        "server: reissue (expired 5 days ago)",
        "client: issue (missing)",
    ]
    assert plan(Materials(ca, None, client), days=89.9)[1] == "client: reissue (expires in 2 hours)"


def test_a_ca_is_renewed_with_its_key_a_year_before_it_ends(ca: KeyPair) -> None:
    server = issue_server(ca, NAMES, days=90, now=NOW + timedelta(days=3280))
    client = issue_client(ca, OPERATOR, days=90, now=NOW + timedelta(days=3280))
    assert plan(Materials(ca, server, client), days=3284) == []  # 366 days left
    assert plan(Materials(ca, server, client), days=3286) == ["ca: renew-same-key (expires in 364 days)"]
    late = plan_renewal(
        Materials(ca, None, None),
        server_dns_names=NAMES,
        client_name=OPERATOR,
        policy=POLICY,
        now=NOW + timedelta(days=3630),
    )
    assert str(late[0]) == "ca: renew-same-key (expires in 20 days)" and late[0].verb is Verb.RENEW_SAME_KEY
    # Renewed with its key, the CA still vouches for the leaves it signed: they are not reissued.
    renewed = renew_ca(ca, days=3650, now=NOW + timedelta(days=3286))
    assert plan(Materials(renewed, server, client), days=3287) == []


def test_a_san_change_reissues_and_says_which_names(ca: KeyPair, server: KeyPair, client: KeyPair) -> None:
    grown = (*NAMES, "orders-2.orders-brokers")
    shrunk = tuple(name for name in NAMES if name != "orders-active")
    assert plan(Materials(ca, server, client), names=grown) == [
        "server: reissue (SANs changed: +orders-2.orders-brokers)"
    ]
    assert plan(Materials(ca, server, client), names=shrunk) == [
        "server: reissue (SANs changed: -orders-active)"
    ]
    both = (*shrunk, "orders-2.orders-brokers")
    assert plan(Materials(ca, server, client), names=both, days=80) == [
        "server: reissue (SANs changed: +orders-2.orders-brokers -orders-active; expires in 10 days)",
        "client: reissue (expires in 10 days)",
    ]
    # Order and case are not a change.
    assert plan(Materials(ca, server, client), names=tuple(name.upper() for name in reversed(NAMES))) == []


def test_a_renamed_operator_gets_a_new_client_certificate(ca: KeyPair, server: KeyPair) -> None:
    renamed = issue_client(ca, "old-operator.operators.svc", days=90, now=NOW)
    assert plan(Materials(ca, server, renamed)) == [
        f"client: reissue (name changed: +{OPERATOR} -old-operator.operators.svc)"
    ]


def test_a_leaf_that_does_not_verify_against_the_current_ca_is_reissued(
    ca: KeyPair, other_ca: KeyPair, server: KeyPair, client: KeyPair
) -> None:
    assert plan(Materials(other_ca, server, client)) == [
        "server: reissue (does not verify against the current CA (another CA signed it))",
        "client: reissue (does not verify against the current CA (another CA signed it))",
    ]


def test_a_leaf_refused_by_the_verifier_is_reissued(ca: KeyPair, client: KeyPair) -> None:
    """Signed by the CA, but not usable as a server certificate: the client's key in the server's place."""
    reasons = plan(Materials(ca, KeyPair(client.certificate_pem, client.key_pem), client), names=(OPERATOR,))
    assert len(reasons) == 1
    assert reasons[0].startswith("server: reissue (does not verify against the current CA (")
    assert "EKU" in reasons[0]


def test_a_leaf_from_the_future_is_reissued(ca: KeyPair, client: KeyPair) -> None:
    ahead = issue_server(ca, NAMES, days=90, now=NOW + timedelta(days=2))  # a clock that ran ahead
    assert plan(Materials(ca, ahead, client)) == [
        "server: reissue (not valid until 2026-11-29T11:55:00+00:00)"
    ]


def test_unreadable_leaves_are_reissued_but_an_unreadable_ca_stops(
    ca: KeyPair, server: KeyPair, client: KeyPair
) -> None:
    broken = KeyPair(b"not a certificate", server.key_pem)
    mismatched = KeyPair(client.certificate_pem, server.key_pem)
    reasons = plan(Materials(ca, broken, mismatched))
    assert reasons[0].startswith("server: reissue (unreadable: neither PEM nor a DER certificate")
    assert reasons[1].startswith("client: reissue (unreadable: the private key")
    with pytest.raises(CertificateError, match="is not the certificate's"):
        plan(Materials(KeyPair(ca.certificate_pem, server.key_pem), server, client))
    with pytest.raises(CertificateError, match="not a CA certificate"):
        plan(Materials(server, server, client))


def test_policy_refuses_windows_that_would_renew_forever() -> None:
    with pytest.raises(ValueError, match=r"renew_before_days \(90\) must be at least 1 and less than"):
        RenewalPolicy(certificate_days=90, renew_before_days=90)
    with pytest.raises(ValueError, match=r"ca_renew_before_days \(20\) must be at least renew_before_days"):
        RenewalPolicy(ca_renew_before_days=20)
    with pytest.raises(ValueError, match=r"ca_renew_before_days \(3650\) must be .* less than ca_days"):
        RenewalPolicy(ca_renew_before_days=3650)
    with pytest.raises(ValueError, match=r"warn_before_days \(30\) must be less than"):
        RenewalPolicy(warn_before_days=30)
    with pytest.raises(ValueError, match="aware"):
        plan_renewal(
            Materials(None, None, None),
            server_dns_names=NAMES,
            client_name=OPERATOR,
            policy=POLICY,
            now=NOW.replace(tzinfo=None),
        )


def test_expiry_warnings_list_what_is_close_soonest_first(
    ca: KeyPair, server: KeyPair, client: KeyPair
) -> None:
    late_client = issue_client(ca, OPERATOR, days=85, now=NOW)
    infos = {"ca": ca.info(), "server": server.info(), "client": late_client.info()}
    within = timedelta(days=POLICY.warn_before_days)
    assert expiry_warnings(infos, within=within, now=NOW + timedelta(days=70)) == ()
    warnings = expiry_warnings(infos, within=within, now=NOW + timedelta(days=80))
    assert [w.name for w in warnings] == ["client", "server"]
    assert str(warnings[0]) == "client expires in 5 days (2027-02-20T12:00:00+00:00)"
    gone = expiry_warnings(infos, within=within, now=NOW + timedelta(days=87))
    assert str(gone[0]).startswith("client expired 2 days ago")
    assert [w.name for w in expiry_warnings(infos, within=timedelta(days=3650), now=NOW)] == [
        "client",
        "server",
        "ca",
    ]
