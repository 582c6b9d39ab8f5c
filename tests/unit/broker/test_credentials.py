"""Credential rotation (issue 13 item 5): the broker follows its mounted Secret files without a restart.

The files are laid out and swapped the way the kubelet updates a Secret volume (a timestamped
directory, ``..data`` pointing at it, the key a symlink through ``..data``, one rename to swap),
and the clock is a fake one, so the grace window is exact. The files hold verifiers (the SHA-256
of each token, issue 39 item 5), never the tokens: the tests present tokens and write verifiers.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

import pytest

from broker_contracts.token_verifier import token_verifier
from broker_service.credentials import AuthFailure, AuthFailureLog, BrokerCredentials, Role
from broker_service.metrics import BrokerMetrics
from broker_service.settings import BrokerSettings, SettingsError, parse_settings

GRACE, CHECK = 30.0, 1.0
_versions = itertools.count()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_secret_volume(volume: Path, token: str, *, raw: bool = False) -> Path:
    """Write the verifier of ``token`` (``token`` itself if ``raw``) into a Secret-volume-like
    directory, swapping ``..data`` atomically."""
    volume.mkdir(parents=True, exist_ok=True)
    version = f"..v{next(_versions)}"
    (volume / version).mkdir()
    value = token if raw or not token else token_verifier(token)
    (volume / version / "token").write_text(value + "\n")
    (volume / "..data_tmp").symlink_to(version)
    os.replace(volume / "..data_tmp", volume / "..data")
    key = volume / "token"
    if not key.is_symlink():
        key.symlink_to("..data/token")
    return key


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_secret_volume(tmp_path / "operator", "op-1"),
        write_secret_volume(tmp_path / "backend", "be-1"),
    )


def credentials_for(files: tuple[Path, Path], clock: FakeClock) -> BrokerCredentials:
    operator, backend = files
    settings = BrokerSettings(
        token_verifier=token_verifier("op-1"),
        backend_token_verifier=token_verifier("be-1"),
        token_verifier_file=operator,
        backend_token_verifier_file=backend,
        token_grace_seconds=GRACE,
        token_check_seconds=CHECK,
    )
    return BrokerCredentials.from_settings(settings, clock)


def test_a_rotated_operator_token_is_accepted_without_a_restart(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    assert credentials.role_of(b"op-1") is Role.OPERATOR
    write_secret_volume(tmp_path / "operator", "op-2")
    clock.now += CHECK
    assert credentials.role_of(b"op-2") is Role.OPERATOR
    assert credentials.role_of(b"be-1") is Role.BACKEND


def test_the_previous_token_works_for_the_grace_window_and_not_after(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    write_secret_volume(tmp_path / "operator", "op-2")
    clock.now += CHECK
    assert credentials.role_of(b"op-2") is Role.OPERATOR  # the broker sees the change now
    clock.now += GRACE - 0.01
    assert credentials.role_of(b"op-1") is Role.OPERATOR, "an operator a little late is not refused"
    clock.now += 0.02
    assert credentials.role_of(b"op-1") is None, "the old token must stop working after the window"
    assert credentials.role_of(b"op-2") is Role.OPERATOR


def test_an_unknown_value_makes_the_broker_look_at_its_files_at_once(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    write_secret_volume(tmp_path / "operator", "op-2")
    # No time has passed, so the periodic check is not due: the refused value itself triggers it.
    assert credentials.role_of(b"op-2") is Role.OPERATOR
    assert credentials.role_of(b"someone-else") is None


def test_the_file_is_read_only_when_its_stat_changed(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = credentials_for(files, clock)
    reads: list[Path] = []
    original = Path.read_text

    def counting_read(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting_read)
    for _ in range(100):
        clock.now += CHECK
        assert credentials.role_of(b"be-1") is Role.BACKEND
        assert credentials.role_of(b"nobody") is None
    assert reads == []
    write_secret_volume(tmp_path / "backend", "be-2")
    clock.now += CHECK
    assert credentials.role_of(b"be-2") is Role.BACKEND
    assert len(reads) == 1


def test_an_empty_missing_or_conflicting_file_keeps_the_current_token(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    write_secret_volume(tmp_path / "operator", "")
    clock.now += CHECK
    assert credentials.role_of(b"op-1") is Role.OPERATOR
    (tmp_path / "operator" / "..data").unlink()
    clock.now += CHECK
    assert credentials.role_of(b"op-1") is Role.OPERATOR
    # The backend's file taking the operator's value would let the backend switch brokers.
    write_secret_volume(tmp_path / "backend", "op-1")
    clock.now += CHECK
    assert credentials.role_of(b"op-1") is Role.OPERATOR
    assert credentials.role_of(b"be-1") is Role.BACKEND


def test_a_second_rotation_drops_the_oldest_token(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    write_secret_volume(tmp_path / "operator", "op-2")
    clock.now += CHECK
    assert credentials.role_of(b"op-2") is Role.OPERATOR
    write_secret_volume(tmp_path / "operator", "op-3")
    clock.now += CHECK
    assert credentials.role_of(b"op-3") is Role.OPERATOR
    assert credentials.role_of(b"op-2") is Role.OPERATOR  # the one just replaced, within its window
    assert credentials.role_of(b"op-1") is None


def test_a_verifier_from_the_environment_never_changes(clock: FakeClock) -> None:
    settings = BrokerSettings(
        token_verifier=token_verifier("op"),
        backend_token_verifier=token_verifier("be"),
        token_grace_seconds=GRACE,
    )
    credentials = BrokerCredentials.from_settings(settings, clock)
    clock.now += 10 * CHECK
    assert (credentials.role_of(b"op"), credentials.role_of(b"be")) == (Role.OPERATOR, Role.BACKEND)


def test_settings_keep_the_files_and_the_grace_window(tmp_path: Path) -> None:
    token = write_secret_volume(tmp_path / "operator", "op")
    env = {
        "BROKER_DATA_DIR": str(tmp_path),
        "BROKER_TOKEN_VERIFIER_FILE": str(token),
        "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("be"),
    }
    settings = parse_settings([], env)
    assert (
        settings.token_verifier_file,
        settings.backend_token_verifier_file,
        settings.token_grace_seconds,
    ) == (
        token,
        None,
        30,
    )
    assert parse_settings([], {**env, "BROKER_TOKEN_GRACE_SECONDS": "5"}).token_grace_seconds == 5
    assert parse_settings(["--token-grace-seconds", "0"], env).token_grace_seconds == 0


def test_the_broker_holds_verifiers_and_refuses_the_verifier_as_a_token(
    files: tuple[Path, Path], clock: FakeClock
) -> None:
    credentials = credentials_for(files, clock)
    held = {vars(credential).get("current") for credential in (credentials.operator, credentials.backend)}
    assert held.isdisjoint({b"op-1", b"be-1"}), "the broker must not hold a token"
    # Whoever reads a broker's files or memory learns the verifier, which opens nothing.
    assert credentials.role_of(token_verifier("op-1").encode()) is None
    assert credentials.role_of(token_verifier("op-1").removeprefix("sha256:").encode()) is None
    assert credentials.role_of(b" op-1 ") is Role.OPERATOR  # the bytes a header carries, stripped


def test_a_token_mounted_where_its_verifier_belongs_is_refused(
    files: tuple[Path, Path], clock: FakeClock, tmp_path: Path
) -> None:
    credentials = credentials_for(files, clock)
    # A rotation that writes the token itself (not its verifier) is ignored: the old one stays.
    write_secret_volume(tmp_path / "operator", "op-2", raw=True)
    clock.now += CHECK
    assert credentials.role_of(b"op-2") is None
    assert credentials.role_of(b"op-1") is Role.OPERATOR
    # And at start the broker refuses to run on it, naming the setting but never the value.
    env = {"BROKER_DATA_DIR": str(tmp_path), "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("be")}
    raw = write_secret_volume(tmp_path / "raw", "a-token-that-is-not-a-verifier", raw=True)
    with pytest.raises(SettingsError, match="BROKER_TOKEN_VERIFIER_FILE") as refused:
        parse_settings([], {**env, "BROKER_TOKEN_VERIFIER_FILE": str(raw)})
    assert "a-token-that-is-not-a-verifier" not in str(refused.value)


def test_a_token_in_the_brokers_environment_is_refused(tmp_path: Path) -> None:
    env = {
        "BROKER_DATA_DIR": str(tmp_path),
        "BROKER_TOKEN_VERIFIER": token_verifier("op"),
        "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("be"),
    }
    assert parse_settings([], env).token_verifier == token_verifier("op")
    for variable in ("BROKER_TOKEN", "BROKER_BACKEND_TOKEN"):
        with pytest.raises(SettingsError, match=f"{variable} is set") as refused:
            parse_settings([], {**env, variable: "a-real-token"})
        assert "a-real-token" not in str(refused.value)


def test_refusals_are_all_counted_and_logged_once_per_window(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = BrokerMetrics()
    failures = AuthFailureLog(metrics.auth_failures, window_seconds=60.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="broker_service.credentials")
    for _ in range(10):
        failures.record("operator", AuthFailure.UNKNOWN, "127.0.0.9", "POST /soap")
    failures.record("backend", AuthFailure.MISSING, "127.0.0.9", "POST /soap")
    assert len(caplog.records) == 1
    clock.now += 59.9
    failures.record("operator", AuthFailure.UNKNOWN, "127.0.0.9", "POST /soap")
    assert len(caplog.records) == 1
    clock.now += 0.1
    failures.record("operator", AuthFailure.WRONG_ROLE, "127.0.0.7", "SOAP Heartbeat")
    assert len(caplog.records) == 2
    assert "127.0.0.7" in caplog.records[1].getMessage()
    assert "12 refusal(s)" in caplog.records[1].getMessage()  # the ones the window held back, and this one
    rendered = metrics.render().decode()
    assert 'broker_auth_failures_total{reason="unknown",role="operator"} 11.0' in rendered
    assert 'broker_auth_failures_total{reason="missing",role="backend"} 1.0' in rendered
    assert 'broker_auth_failures_total{reason="wrong_role",role="operator"} 1.0' in rendered
