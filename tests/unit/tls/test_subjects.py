"""Subject normalisation: spellings of one name match, a certificate's subject matches its RFC 4514
form, and what cannot be read says so."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from broker_contracts.tls.subjects import SubjectError, parse_subject, peer_subject, render_subject
from tests.unit.tls.conftest import UnitPki

SAP = "CN=sap-erp-prod,OU=Basis,O=ACME,C=DE"


@pytest.mark.parametrize(
    "spelling",
    [
        SAP,
        "cn=sap-erp-prod,ou=Basis,o=ACME,c=DE",
        "CN = sap-erp-prod , OU = Basis, O=ACME ,C=DE",
        "commonName=sap-erp-prod,organizationalUnitName=Basis,organizationName=ACME,countryName=DE",
        "2.5.4.3=sap-erp-prod,2.5.4.11=Basis,2.5.4.10=ACME,2.5.4.6=DE",
        "CN=sap\\2Derp\\2dprod,OU=Basis,O=ACME,C=DE",  # hex pairs: any character may be written so
    ],
)
def test_spellings_of_one_subject_normalise_alike(spelling: str) -> None:
    assert parse_subject(spelling) == parse_subject(SAP)


def test_values_compare_exactly_and_order_matters_between_rdns() -> None:
    assert parse_subject("CN=SAP-ERP-PROD,OU=Basis,O=ACME,C=DE") != parse_subject(SAP)
    assert parse_subject("OU=Basis,CN=sap-erp-prod,O=ACME,C=DE") != parse_subject(SAP)
    # ... but not inside a multi-valued RDN, which is a set.
    assert parse_subject("CN=a+UID=b,O=ACME") == parse_subject("UID=b+CN=a,O=ACME")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("CN=Acme\\, Inc.", "Acme, Inc."),
        ("CN=a\\+b", "a+b"),
        ("CN=\\#not-hex", "#not-hex"),
        ("CN=\\ padded\\ ", " padded "),
        ("CN=trailing  ", "trailing"),
        ("CN=M\\C3\\BCller", "Müller"),
        ("CN=back\\\\slash", "back\\slash"),
        ("CN=a=b", "a=b"),
    ],
)
def test_escapes_are_undone(text: str, value: str) -> None:
    assert parse_subject(text) == ((("commonName", value),),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty subject"),
        ("   ", "empty subject"),
        ("XX=foo", "unknown attribute type 'XX'"),
        ("CN", "is not 'TYPE=value'"),
        ("=foo", "is not 'TYPE=value'"),
        ("CN=#04024869", "'#hex' value form is not supported"),
        ("CN=a;O=b", "';' in a value must be escaped"),
        ("CN=a<b", "'<' in a value must be escaped"),
        ("CN=dangling\\", "escapes nothing"),
        ("CN=bad\\zz", "escapes nothing"),
        ("CN=\\FF\\FE", "not UTF-8"),
        ("CN=" + "x" * 5000, "over 4096"),
    ],
)
def test_unreadable_subjects_say_why(text: str, message: str) -> None:
    with pytest.raises(SubjectError, match=message):
        parse_subject(text)


def test_a_certificates_subject_matches_its_rfc4514_form(unit_pki: UnitPki) -> None:
    decoded = ssl._ssl._test_decode_cert(str(unit_pki.client.cert))  # type: ignore[attr-defined]  # test only
    assert peer_subject(decoded["subject"]) == parse_subject("CN=sap-erp,O=ACME,C=DE")
    assert render_subject(peer_subject(decoded["subject"])) == "CN=sap-erp,O=ACME,C=DE"


_VALUES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_TYPES = st.sampled_from(
    ["commonName", "organizationName", "organizationalUnitName", "countryName", "userId"]
)


@example([[("commonName", " ")]])  # a value that is both a leading and a trailing space
@given(st.lists(st.lists(st.tuples(_TYPES, _VALUES), min_size=1, max_size=3), min_size=1, max_size=4))
def test_rendering_and_parsing_round_trip(rdns: list[list[tuple[str, str]]]) -> None:
    subject = tuple(tuple(sorted(rdn)) for rdn in rdns)
    assert parse_subject(render_subject(subject)) == subject
