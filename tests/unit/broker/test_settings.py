"""Settings: flags win over env vars, errors name the flag, the variable and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_contracts.token_verifier import token_verifier
from broker_service.settings import PoisonPolicy, SettingsError, parse_settings

T, B = token_verifier("t"), token_verifier("b")
VERIFIERS = {"BROKER_TOKEN_VERIFIER": T, "BROKER_BACKEND_TOKEN_VERIFIER": B}


def test_flags_win_over_environment(tmp_path: Path) -> None:
    token = tmp_path / "token.sha256"
    token.write_text(token_verifier("s3cret") + "\n")
    env = {
        "BROKER_DATA_DIR": str(tmp_path),
        "BROKER_PORT": "9000",
        "BROKER_TOKEN_VERIFIER_FILE": str(token),
        "BROKER_BACKEND_TOKEN_VERIFIER": B,
    }
    settings = parse_settings(["--port", "9100", "--on-poison", "Hold"], env)
    assert (settings.port, settings.token_verifier, settings.on_poison) == (
        9100,
        token_verifier("s3cret"),
        PoisonPolicy.HOLD,
    )
    assert settings.data_dir == tmp_path


def test_verifier_from_env_when_no_file(tmp_path: Path) -> None:
    settings = parse_settings([], {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS})
    assert (settings.token_verifier, settings.backend_token_verifier) == (T, B)


def test_the_backends_verifier_is_read_like_the_operators_and_is_its_own(tmp_path: Path) -> None:
    backend = tmp_path / "backend-token.sha256"
    backend.write_text(token_verifier("from-file") + "\n")
    env = {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS}
    from_file = token_verifier("from-file")
    assert (
        parse_settings([], {**env, "BROKER_BACKEND_TOKEN_VERIFIER_FILE": str(backend)}).backend_token_verifier
        == from_file
    )
    assert (
        parse_settings(["--backend-token-verifier-file", str(backend)], env).backend_token_verifier
        == from_file
    )
    assert parse_settings([], env).backend_token_verifier == B
    with pytest.raises(SettingsError, match="holds the operator's verifier"):
        parse_settings([], {**env, "BROKER_BACKEND_TOKEN_VERIFIER": T})


def test_the_admin_port_is_off_unless_set_and_must_differ_from_the_port(tmp_path: Path) -> None:
    env = {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS}
    assert parse_settings([], env).admin_port is None  # one port for everything, as before
    assert parse_settings([], {**env, "BROKER_ADMIN_PORT": ""}).admin_port is None
    assert parse_settings([], {**env, "BROKER_ADMIN_PORT": "8081"}).admin_port == 8081
    assert parse_settings(["--admin-port", "9001"], {**env, "BROKER_ADMIN_PORT": "8081"}).admin_port == 9001
    with pytest.raises(SettingsError, match="--admin-port / BROKER_ADMIN_PORT = 8080 is the same as --port"):
        parse_settings(["--admin-port", "8080"], env)
    with pytest.raises(SettingsError, match="'admin' is not a int"):
        parse_settings(["--admin-port", "admin"], env)
    with pytest.raises(SettingsError, match="must be at most 65535"):
        parse_settings(["--admin-port", "70000"], env)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"BROKER_TOKEN_VERIFIER": T}, "--data-dir / BROKER_DATA_DIR is required"),
        (
            [],
            {"BROKER_DATA_DIR": "/x", "BROKER_BACKEND_TOKEN_VERIFIER": B},
            "no credential: set --token-verifier-file",
        ),
        (
            [],
            {"BROKER_DATA_DIR": "/x", "BROKER_TOKEN_VERIFIER": T},
            "no credential: set --backend-token-verifier-file",
        ),
        (
            ["--backend-token-verifier-file", "/nonexistent/b"],
            {"BROKER_DATA_DIR": "/x", "BROKER_TOKEN_VERIFIER": T},
            "BROKER_BACKEND_TOKEN_VERIFIER_FILE = '/nonexistent/b' cannot be read",
        ),
        (
            [],
            {"BROKER_DATA_DIR": "/x", "BROKER_TOKEN_VERIFIER": "t", "BROKER_BACKEND_TOKEN_VERIFIER": B},
            "BROKER_TOKEN_VERIFIER: not a token verifier",
        ),
        (
            ["--lease-seconds", "soon"],
            {"BROKER_DATA_DIR": "/x", **VERIFIERS},
            "'soon' is not a float",
        ),
        (
            ["--on-poison", "Drop"],
            {"BROKER_DATA_DIR": "/x", **VERIFIERS},
            "'Drop'; use one of",
        ),
        (["--token-verifier-file", "/nonexistent/t"], {"BROKER_DATA_DIR": "/x"}, "cannot be read"),
    ],
)
def test_errors_name_what_is_wrong(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_settings(argv, env)


@pytest.mark.parametrize(
    ("lease", "margin", "tick"), [(1.0, 0.25, 0.1), (2.0, 0.25, 0.1), (5.0, 0.5, 0.1), (0.5, 0.25, 0.05)]
)
def test_the_lease_margin_is_the_operators(tmp_path: Path, lease: float, margin: float, tick: float) -> None:
    # The operator waits lease + max(0.25 s, 10 % of the lease) before activating another broker;
    # a broker stalled for longer than that margin fences itself.
    settings = parse_settings(
        ["--lease-seconds", str(lease)],
        {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS},
    )
    assert settings.lease_margin_seconds == pytest.approx(margin)
    assert settings.lease_tick_seconds == pytest.approx(tick)


def test_the_max_lease_defaults_to_the_lease_and_may_only_lengthen_it(tmp_path: Path) -> None:
    env = {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS}
    assert parse_settings(["--lease-seconds", "3"], env).max_lease_cap_seconds == 3.0
    assert parse_settings(["--lease-seconds", "3"], env).max_lease_seconds is None
    settings = parse_settings(["--lease-seconds", "3"], {**env, "BROKER_MAX_LEASE_SECONDS": "30"})
    assert settings.max_lease_cap_seconds == 30.0
    # The lease watcher, the margin and the stall rule stay the lease's.
    assert (settings.lease_margin_seconds, settings.lease_tick_seconds) == pytest.approx((0.3, 0.1))
    flag_wins = parse_settings(["--max-lease-seconds", "10"], {**env, "BROKER_MAX_LEASE_SECONDS": "30"})
    assert flag_wins.max_lease_cap_seconds == 10.0
    with pytest.raises(
        SettingsError,
        match=r"--max-lease-seconds / BROKER_MAX_LEASE_SECONDS = 2 is below --lease-seconds / "
        r"BROKER_LEASE_SECONDS \(5\)",
    ):
        parse_settings(["--max-lease-seconds", "2"], env)


@pytest.mark.parametrize("flag", ["--lease-seconds", "--max-lease-seconds"])
@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_a_lease_must_be_a_finite_number(tmp_path: Path, flag: str, text: str) -> None:
    # A NaN lease would never run out: every comparison with it is false.
    with pytest.raises(SettingsError, match=f"{flag} / .* = '{text}' is not a finite number"):
        parse_settings([f"{flag}={text}"], {"BROKER_DATA_DIR": str(tmp_path), **VERIFIERS})
