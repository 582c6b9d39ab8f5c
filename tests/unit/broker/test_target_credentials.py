"""What the broker presents to the backend and the cloud (``broker_service.target_credentials``).

A mounted Secret's ``token`` is a Bearer credential, its ``username`` and ``password`` a Basic one;
a URL's userinfo still works (Basic) but leaves the URL the broker calls; both at once, or a
directory with neither, stop the broker at start with the flags named and no value repeated.
A Secret rotated in place is read again, and the value it replaced stays among the secrets the
relay client masks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_contracts.redact import basic_credential
from broker_contracts.token_verifier import token_verifier
from broker_service.settings import SettingsError, parse_settings
from broker_service.target_credentials import TargetCredentialError, relay_target


def target(url: str, directory: Path | None = None):  # type: ignore[no-untyped-def]
    return relay_target(
        "backend", url, directory, flag="--backend-url", dir_flag="--backend-credentials-dir", check_seconds=0
    )


def test_userinfo_leaves_the_url_and_becomes_basic() -> None:
    made = target("https://sapuser:S3cret%21PW@erp.example:8443/broker?sig=Q1w2e3")
    assert str(made.call_url("/relay/resend")) == "https://erp.example:8443/broker/relay/resend?sig=Q1w2e3"
    assert made.current_authorization() == "Basic " + basic_credential("sapuser", "S3cret!PW")
    assert "S3cret" not in made.display and "Q1w2e3" not in made.display
    assert {"S3cret!PW", "sapuser", "Q1w2e3"} <= set(made.secrets)  # redact() adds encoded forms


def test_a_token_key_is_bearer_and_username_password_are_basic(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok-123456\n")
    assert target("https://erp.example", tmp_path).current_authorization() == "Bearer tok-123456"
    (tmp_path / "token").unlink()
    (tmp_path / "username").write_text("someone")
    (tmp_path / "password").write_text("pw-654321")
    made = target("https://erp.example", tmp_path)
    assert made.current_authorization() == "Basic " + basic_credential("someone", "pw-654321")


def test_a_rotated_secret_is_read_again_and_the_old_value_stays_masked(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("old-token-1")
    made = target("https://erp.example", tmp_path)
    assert made.current_authorization() == "Bearer old-token-1"
    (tmp_path / "token").write_text("new-token-22")
    os.utime(tmp_path / "token", ns=(1, 1))  # a different stamp even within one clock tick
    assert made.current_authorization() == "Bearer new-token-22"
    assert {"old-token-1", "new-token-22"} <= set(made.secrets)


def test_userinfo_and_a_credentials_directory_together_are_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok-123456")
    with pytest.raises(TargetCredentialError) as refused:
        target("https://u:S3cretPW@erp.example", tmp_path)
    assert "--backend-credentials-dir" in str(refused.value) and "S3cretPW" not in str(refused.value)


def test_settings_refuse_a_credentials_directory_without_usable_keys(tmp_path: Path) -> None:
    (tmp_path / "username").write_text("only-a-user")
    verifiers = tmp_path / "verifiers"  # not in the credentials directory, whose keys are checked
    verifiers.mkdir()
    (verifiers / "op").write_text(token_verifier("operator-token"))
    (verifiers / "bk").write_text(token_verifier("backend-token"))
    argv = [
        "--data-dir", str(tmp_path / "data"),
        "--token-verifier-file", str(verifiers / "op"),
        "--backend-token-verifier-file", str(verifiers / "bk"),
        "--backend-url", "https://erp.example",
        "--backend-credentials-dir", str(tmp_path),
    ]  # fmt: skip
    with pytest.raises(SettingsError, match="neither a 'token' key nor both 'username' and 'password'"):
        parse_settings(argv, environ={})
    with pytest.raises(SettingsError, match="--relay-reply-limit-bytes"):
        parse_settings([*argv[:6], "--relay-reply-limit-bytes", "10"], environ={})
    (tmp_path / "password").write_text("pw-654321")
    settings = parse_settings(argv, environ={})
    assert settings.backend_credentials_dir == tmp_path
    assert settings.relay_reply_limit_bytes == 16 * 1024 * 1024
