"""``spec.tls``: the defaults, and every CEL rule's Python twin refusing the same spec in the same words."""

from __future__ import annotations

import re
from typing import Any

import pytest

from broker_operator.controller import tls_spec
from broker_operator.controller.secret_refs import SecretRef
from broker_operator.controller.spec import SpecError, parse_spec
from broker_operator.controller.tls_spec import BackendClients, CertificateLifetimes, TlsSecrets, TlsSpec
from broker_operator.pki.renewal import RenewalPolicy
from tests.unit.controller.cel_messages import rendered, rules_at, rules_below

SECRETS = {"server": "erp-broker-tls", "operatorClient": "erp-operator-tls"}
BACKEND_CLIENTS = {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": ["CN=SAP-ERP-PRD,O=Example"]}


def minimal(**extra: Any) -> dict[str, Any]:
    return {"account": "acme", "company": "1000", **extra}


def problems_of(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as refused:
        parse_spec("orders", spec)
    return list(refused.value.problems)


def test_tls_is_on_by_default_with_the_operators_ca() -> None:
    tls = parse_spec("orders", minimal()).tls
    assert tls == TlsSpec(mode="Operator", cluster_domain="cluster.local")
    assert tls.enabled and tls.operator_issues
    assert tls.certificates == CertificateLifetimes(
        validity_days=90, renew_before_days=30, ca_validity_days=3650
    )
    assert (tls.secrets, tls.backend_clients, tls.upstream_ca, tls.extra_dns_names) == (None, None, None, ())
    assert not parse_spec("orders", minimal(tls={"mode": "Disabled"})).tls.enabled


def test_every_field_is_read_into_its_place() -> None:
    tls = parse_spec(
        "orders",
        minimal(
            tls={
                "mode": "Secrets",
                "clusterDomain": "corp.internal",
                "secrets": SECRETS,
                "backendClients": {**BACKEND_CLIENTS, "caSecretRef": {"name": "sap-ca", "key": "bundle.pem"}},
                "upstreamCASecretRef": {"name": "cloud-ca"},
            }
        ),
    ).tls
    assert tls.secrets == TlsSecrets(server="erp-broker-tls", operator_client="erp-operator-tls")
    assert tls.backend_clients == BackendClients(
        SecretRef("sap-ca", "bundle.pem"), ("CN=SAP-ERP-PRD,O=Example",)
    )
    assert tls.upstream_ca == SecretRef("cloud-ca", "ca.crt")  # the key defaults to ca.crt
    assert tls.cluster_domain == "corp.internal"
    issued = parse_spec(
        "orders",
        minimal(
            tls={
                "extraDNSNames": ["erp-broker.example.com"],
                "certificates": {"validityDays": 30, "renewBeforeDays": 10, "caValidityDays": 1000},
            }
        ),
    ).tls
    assert issued.extra_dns_names == ("erp-broker.example.com",)
    assert issued.certificates == CertificateLifetimes(30, 10, 1000)
    # The upstream bundle is the brokers' trust as clients: allowed whatever the mode.
    plain = parse_spec(
        "orders", minimal(tls={"mode": "Disabled", "upstreamCASecretRef": {"name": "cloud-ca"}})
    )
    assert plain.tls.upstream_ca == SecretRef("cloud-ca", "ca.crt")


# (the spec's tls, where the CRD's rule is (below spec), the message, the values its format takes)
RULES = [
    pytest.param({"mode": "Secrets"}, "tls", tls_spec.SECRETS_REQUIRED_MESSAGE, {}, id="secrets-required"),
    pytest.param(
        {"secrets": SECRETS},
        "tls",
        tls_spec.secrets_forbidden_message("Operator"),
        {"self.mode": "Operator"},
        id="secrets-without-mode-secrets",
    ),
    pytest.param(
        {"mode": "Disabled", "secrets": SECRETS},
        "tls",
        tls_spec.secrets_forbidden_message("Disabled"),
        {"self.mode": "Disabled"},
        id="secrets-with-mode-disabled",
    ),
    pytest.param(
        {"mode": "Secrets", "secrets": SECRETS, "certificates": {"validityDays": 90}},
        "tls",
        tls_spec.certificates_forbidden_message("Secrets"),
        {"self.mode": "Secrets"},
        id="certificates-without-mode-operator",
    ),
    pytest.param(
        {"mode": "Disabled", "extraDNSNames": ["erp-broker.example.com"]},
        "tls",
        tls_spec.extra_dns_names_forbidden_message("Disabled"),
        {"self.mode": "Disabled"},
        id="extra-names-without-mode-operator",
    ),
    pytest.param(
        {"mode": "Disabled", "backendClients": BACKEND_CLIENTS},
        "tls",
        tls_spec.BACKEND_CLIENTS_NEED_TLS_MESSAGE,
        {},
        id="backend-clients-without-tls",
    ),
    pytest.param(
        {"certificates": {"validityDays": 30, "renewBeforeDays": 30}},
        "tls.certificates",
        tls_spec.renew_before_message(30, 30),
        {"self.renewBeforeDays": 30, "self.validityDays": 30},
        id="renew-before-not-below-validity",
    ),
    pytest.param(
        {"certificates": {"renewBeforeDays": 120}},  # validityDays defaults to 90
        "tls.certificates",
        tls_spec.renew_before_message(120, 90),
        {"self.renewBeforeDays": 120, "self.validityDays": 90},
        id="renew-before-above-default-validity",
    ),
    pytest.param(
        {"backendClients": {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": []}},
        "tls.backendClients",
        tls_spec.SUBJECTS_REQUIRED_MESSAGE,
        {},
        id="allowed-subjects-empty",
    ),
    pytest.param(
        {"backendClients": {"caSecretRef": {"name": "sap-ca"}}},
        "tls.backendClients",
        tls_spec.SUBJECTS_REQUIRED_MESSAGE,
        {},
        id="allowed-subjects-absent",
    ),
    pytest.param(
        {"backendClients": {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": ["SAP-ERP-PRD"]}},
        "tls.backendClients.allowedSubjects[]",
        tls_spec.subject_shape_message("SAP-ERP-PRD"),
        {"self": "SAP-ERP-PRD"},
        id="allowed-subject-not-rfc4514",
    ),
    pytest.param(
        {"extraDNSNames": ["ERP_Broker.example.com"]},
        "tls.extraDNSNames[]",
        tls_spec.dns_name_message("spec.tls.extraDNSNames[]", "ERP_Broker.example.com"),
        {"self": "ERP_Broker.example.com"},
        id="extra-name-not-a-dns-name",
    ),
    pytest.param(
        {"extraDNSNames": ["*.example.com"]},
        "tls.extraDNSNames[]",
        tls_spec.dns_name_message("spec.tls.extraDNSNames[]", "*.example.com"),
        {"self": "*.example.com"},
        id="extra-name-wildcard",
    ),
    pytest.param(
        {"clusterDomain": "cluster.local."},
        "tls.clusterDomain",
        tls_spec.dns_name_message("spec.tls.clusterDomain", "cluster.local."),
        {"self": "cluster.local."},
        id="cluster-domain-trailing-dot",
    ),
]


@pytest.mark.parametrize(("tls", "where", "message", "values"), RULES)
def test_each_rule_refuses_in_the_crds_words(
    tls: dict[str, Any], where: str, message: str, values: dict[str, object]
) -> None:
    # Exactly one problem, and it is the message one of the CRD's rules at that field renders.
    assert problems_of(minimal(tls=tls)) == [message]
    assert message in [rendered(rule, values) for rule in rules_at(where) if _renders(rule, values)]


def _renders(rule: dict[str, Any], values: dict[str, object]) -> bool:
    try:
        rendered(rule, values)
    except KeyError:  # a rule that formats other values than this case gives
        return False
    return True


def test_every_rule_of_spec_tls_has_a_twin_above() -> None:
    covered = {where for _tls, where, _message, _values in (case.values for case in RULES)}
    rules = list(rules_below("tls"))
    assert {where for where, _rule in rules} == covered
    for where, rule in rules:
        twins = [case for case in RULES if case.values[1] == where and _renders(rule, case.values[3])]
        assert any(rendered(rule, case.values[3]) == case.values[2] for case in twins), rule


def test_the_operator_parses_each_subject_as_the_broker_does() -> None:
    # Beyond CEL: a subject the broker would refuse at start (and crash-loop on) never reaches a pod.
    clients = {"caSecretRef": {"name": "sap-ca"}, "allowedSubjects": ["CN=SAP-ERP-PRD,XX=Example"]}
    (problem,) = problems_of(minimal(tls={"backendClients": clients}))
    assert problem.startswith(
        "spec.tls.backendClients.allowedSubjects[0]: subject 'CN=SAP-ERP-PRD,XX=Example'"
    )
    assert "unknown attribute type 'XX'" in problem


def test_schema_bounds_are_checked_too() -> None:
    (problem,) = problems_of(minimal(tls={"certificates": {"caValidityDays": 365}}))
    assert problem == "spec.tls.certificates.caValidityDays (365) must be an integer from 366 to 36500"
    (problem,) = problems_of(minimal(tls={"mode": "Optional"}))
    assert problem == "spec.tls.mode ('Optional') must be one of Operator, Secrets, Disabled"
    too_many = [f"n{i}.example.com" for i in range(17)]
    (problem,) = problems_of(minimal(tls={"extraDNSNames": too_many}))
    assert problem.startswith("spec.tls.extraDNSNames must be a list of at most 16 DNS names")


@pytest.mark.parametrize(
    ("validity", "renew_before", "ca_validity"),
    [(2, 1, 366), (90, 30, 3650), (3650, 365, 366), (366, 365, 36500), (16, 15, 400), (15, 14, 366)],
)
def test_every_accepted_lifetime_is_a_valid_renewal_policy(
    validity: int, renew_before: int, ca_validity: int
) -> None:
    # The CRD's bounds and its renewBeforeDays rule are what keeps the PKI's policy satisfiable.
    certificates = {"validityDays": validity, "renewBeforeDays": renew_before, "caValidityDays": ca_validity}
    lifetimes = parse_spec("orders", minimal(tls={"certificates": certificates})).tls.certificates
    policy = lifetimes.renewal_policy()
    assert isinstance(policy, RenewalPolicy)
    assert (policy.certificate_days, policy.renew_before_days, policy.ca_days) == (
        validity,
        renew_before,
        ca_validity,
    )
    assert policy.warn_before_days == min(14, renew_before - 1)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("erp-broker.example.com", True),
        ("a", True),
        ("x" * 63 + ".example", True),
        ("x" * 64 + ".example", False),  # a label over 63
        (".".join(["abcdefgh"] * 28), True),  # 251 characters
        (".".join(["abcdefgh"] * 28) + ".xy", False),  # 254 characters
        (".".join(["abcdefgh"] * 28) + ".x", True),  # 253
        ("ERP.example.com", False),
        ("erp.example.com.", False),
        ("-erp.example.com", False),
        ("erp-.example.com", False),
        ("erp..example.com", False),
        ("*.example.com", False),
    ],
)
def test_the_crds_dns_name_rule_is_the_pkis(name: str, valid: bool) -> None:
    # The CRD spells out in a pattern the rule the PKI applies (pki.names.check_dns_names, lower
    # case only): a name one accepts and the other refuses would be issued, or refused, silently.
    (rule,) = rules_at("tls.extraDNSNames[]")
    pattern = re.search(r"self\.matches\('(.*)'\)", rule["rule"])
    assert pattern is not None
    assert (len(name) <= 253 and re.match(pattern[1].replace("\\\\", "\\"), name) is not None) is valid
    spec = minimal(tls={"extraDNSNames": [name]})
    if valid:
        assert parse_spec("orders", spec).tls.extra_dns_names == (name,)
    else:
        with pytest.raises(SpecError):
            parse_spec("orders", spec)
