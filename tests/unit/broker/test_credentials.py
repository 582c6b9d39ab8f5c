"""Credential rotation (issue 13 item 5): the broker follows its mounted Secret files without a restart.

The files are laid out and swapped the way the kubelet updates a Secret volume (a timestamped
directory, ``..data`` pointing at it, the key a symlink through ``..data``, one rename to swap),
and the clock is a fake one, so the grace window is exact.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from broker_service.credentials import BrokerCredentials, Role
from broker_service.settings import BrokerSettings, parse_settings

GRACE, CHECK = 30.0, 1.0
_versions = itertools.count()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def write_secret_volume(volume: Path, value: str) -> Path:
    """Write ``token`` into a Secret-volume-like directory, swapping ``..data`` atomically."""
    volume.mkdir(parents=True, exist_ok=True)
    version = f"..v{next(_versions)}"
    (volume / version).mkdir()
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
        token="op-1",
        backend_token="be-1",
        token_file=operator,
        backend_token_file=backend,
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


def test_a_token_from_the_environment_never_changes(clock: FakeClock) -> None:
    settings = BrokerSettings(token="op", backend_token="be", token_grace_seconds=GRACE)
    credentials = BrokerCredentials.from_settings(settings, clock)
    clock.now += 10 * CHECK
    assert (credentials.role_of(b"op"), credentials.role_of(b"be")) == (Role.OPERATOR, Role.BACKEND)


def test_settings_keep_the_files_and_the_grace_window(tmp_path: Path) -> None:
    token = write_secret_volume(tmp_path / "operator", "op")
    env = {"BROKER_DATA_DIR": str(tmp_path), "BROKER_TOKEN_FILE": str(token), "BROKER_BACKEND_TOKEN": "be"}
    settings = parse_settings([], env)
    assert (settings.token_file, settings.backend_token_file, settings.token_grace_seconds) == (
        token,
        None,
        30,
    )
    assert parse_settings([], {**env, "BROKER_TOKEN_GRACE_SECONDS": "5"}).token_grace_seconds == 5
    assert parse_settings(["--token-grace-seconds", "0"], env).token_grace_seconds == 0
