"""The one redaction function (``broker_contracts.redact``): what it removes without being told,
what it removes when told, and what it leaves readable."""

from __future__ import annotations

import pytest

from broker_contracts.redact import MASK, basic_credential, redact, redact_url


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("POST http://sapuser:S3cretPW@erp.example:8443/broker/relay/resend failed", ["sapuser", "S3cretPW"]),
        ("GET https://u:p%40ss@h/x answered", ["u:p%40ss"]),
        ("raw @ in a password: http://user:pa@ss@h/x", ["user", "pa@ss"]),
        ("GET https://cloud.example/api/relay/poll?sig=AbCdEf123&max=500 failed", ["AbCdEf123"]),
        ("echo: GET /cloud/healthz?sig=AbCdEf123 HTTP/1.1", ["AbCdEf123"]),
        ("b'you sent:\\r\\nAuthorization: Basic ZXJwOnNlY3JldA==\\r\\n'", ["ZXJwOnNlY3JldA=="]),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc", ["eyJhbGciOiJIUzI1NiJ9.abc"]),
        ('{"password": "hunter22", "user": "x"}', ["hunter22"]),
        ("login with password=hunter22&user=x", ["hunter22"]),
    ],
)
def test_recognisable_credentials_are_masked_without_being_named(text: str, gone: list[str]) -> None:
    redacted = redact(text)
    for secret in gone:
        assert secret not in redacted, redacted
    assert MASK in redacted


def test_named_secrets_are_masked_raw_and_encoded_and_as_basic_credentials() -> None:
    token, password = "tok/en+with=odd chars", "pw-1234"
    basic = basic_credential("someone", password)
    text = f"a target echoed {token} and tok%2Fen%2Bwith%3Dodd%20chars and {password} and {basic}"
    redacted = redact(text, [token, password, basic])
    for value in (token, "tok%2Fen%2Bwith%3Dodd%20chars", password, basic):
        assert value not in redacted, redacted


def test_what_is_no_credential_stays_readable() -> None:
    text = (
        "POST http://erp.example:8080/broker/relay/resend failed: ClientConnectorError: "
        "Cannot connect to host erp.example:8080 ssl:default [Connection refused]; use Basic auth"
    )
    assert redact(text) == text
    assert redact("", ["abcd"]) == ""
    # Short values are not searched for (a one-letter "secret" would blank every word).
    assert redact("the broker t is up", ["t"]) == "the broker t is up"


def test_redact_url_keeps_scheme_host_port_and_path() -> None:
    assert (
        redact_url("https://u:p@h.example:8443/base?sig=x&v=1")
        == "https://***@h.example:8443/base?sig=***&v=***"
    )
    assert redact_url("http://h.example/base") == "http://h.example/base"
