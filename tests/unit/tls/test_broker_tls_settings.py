"""The broker's TLS settings: flags and variables, checked at start, errors naming flag, value and remedy."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_contracts.tls import parse_subject
from broker_contracts.token_verifier import token_verifier
from broker_service.settings import SettingsError, parse_settings
from local_cluster.broker_certificates import tls_secret, write_secret_volume
from tests.unit.tls.conftest import UnitPki

SAP = "CN=sap-erp,O=ACME,C=DE"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "BROKER_DATA_DIR": str(tmp_path / "data"),
        "BROKER_TOKEN_VERIFIER": token_verifier("t"),
        "BROKER_BACKEND_TOKEN_VERIFIER": token_verifier("b"),
        "BROKER_ADMIN_PORT": "8081",
    }


@pytest.fixture
def tls_dir(unit_pki: UnitPki, tmp_path: Path) -> Path:
    write_secret_volume(tmp_path / "tls", tls_secret(unit_pki.server, [unit_pki.ca.cert]))
    return tmp_path / "tls"


def test_tls_is_off_unless_the_directory_is_set(env: dict[str, str]) -> None:
    settings = parse_settings([], env)
    assert (settings.tls, settings.upstream_ca_file) == (None, None)
    assert parse_settings([], {**env, "BROKER_TLS_DIR": "", "BROKER_UPSTREAM_CA_FILE": " "}).tls is None


def test_every_setting_from_variables_and_subjects_from_flags_or_lines(
    env: dict[str, str], tls_dir: Path, unit_pki: UnitPki
) -> None:
    variables = {
        **env,
        "BROKER_TLS_DIR": str(tls_dir),
        "BROKER_TLS_RELOAD_SECONDS": "2.5",
        "BROKER_CLIENT_CA_FILE": str(unit_pki.other_ca.cert),
        "BROKER_ALLOWED_CLIENT_SUBJECTS": f"{SAP}\n\n  cn=second, o=ACME  \n",
        "BROKER_UPSTREAM_CA_FILE": str(unit_pki.ca.cert),
    }
    settings = parse_settings([], variables)
    assert settings.tls is not None
    assert (settings.tls.directory, settings.tls.reload_seconds) == (tls_dir, 2.5)
    assert settings.tls.client_ca_file == unit_pki.other_ca.cert
    assert settings.tls.allowed_client_subjects == {parse_subject(SAP), parse_subject("CN=second,O=ACME")}
    assert settings.upstream_ca_file == unit_pki.ca.cert
    assert settings.tls.handshake_timeout_seconds == 10
    # The flag, once per subject, wins over the variable.
    flagged = parse_settings(
        [
            "--allowed-client-subjects",
            "CN=only,O=ACME",
            "--allowed-client-subjects",
            SAP,
            "--tls-handshake-timeout-seconds",
            "3",
        ],
        variables,
    )
    assert flagged.tls is not None
    assert flagged.tls.allowed_client_subjects == {parse_subject("CN=only,O=ACME"), parse_subject(SAP)}
    assert flagged.tls.handshake_timeout_seconds == 3


def _refused(argv: list[str], env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as refused:
        parse_settings(argv, env)
    return str(refused.value)


def test_tls_needs_an_admin_port(env: dict[str, str], tls_dir: Path) -> None:
    del env["BROKER_ADMIN_PORT"]
    text = _refused(["--tls-dir", str(tls_dir)], env)
    assert text.startswith(f"--tls-dir / BROKER_TLS_DIR = '{tls_dir}' needs --admin-port / BROKER_ADMIN_PORT")
    assert "kubelet probes" in text


def test_a_directory_that_cannot_be_served_is_refused_naming_the_file(
    env: dict[str, str], tls_dir: Path, tmp_path: Path, unit_pki: UnitPki
) -> None:
    text = _refused(["--tls-dir", str(tmp_path / "nowhere")], env)
    assert f"--tls-dir / BROKER_TLS_DIR = '{tmp_path / 'nowhere'}' cannot be served" in text
    assert "No such file" in text and "or unset it to serve plain HTTP" in text
    write_secret_volume(
        tls_dir,
        {**tls_secret(unit_pki.server, [unit_pki.ca.cert]), "tls.key": unit_pki.rotated.key.read_bytes()},
    )
    assert "KEY_VALUES_MISMATCH" in _refused(["--tls-dir", str(tls_dir)], env)
    write_secret_volume(tls_dir, tls_secret(unit_pki.server, [unit_pki.server.cert]))  # a leaf is no CA
    assert "holds no CA certificate" in _refused(["--tls-dir", str(tls_dir)], env)


@pytest.mark.parametrize("value", ["0.05", "301", "nan", "soon"])
def test_the_reload_interval_is_bounded(env: dict[str, str], tls_dir: Path, value: str) -> None:
    text = _refused(["--tls-dir", str(tls_dir), "--tls-reload-seconds", value], env)
    assert f"--tls-reload-seconds / BROKER_TLS_RELOAD_SECONDS = '{value}'" in text
    # Without --tls-dir too: the upstream bundle is read again on the same interval.
    text = _refused(["--tls-reload-seconds", value], env)
    assert f"--tls-reload-seconds / BROKER_TLS_RELOAD_SECONDS = '{value}'" in text


def test_the_reload_interval_applies_to_the_upstream_bundle_without_tls_dir(
    env: dict[str, str], unit_pki: UnitPki
) -> None:
    settings = parse_settings(
        ["--upstream-ca-file", str(unit_pki.ca.cert), "--tls-reload-seconds", "0.5"], env
    )
    assert (settings.tls, settings.upstream_ca_file, settings.tls_reload_seconds) == (
        None,
        unit_pki.ca.cert,
        0.5,
    )
    assert parse_settings([], env).tls_reload_seconds == 10


def test_client_certificates_need_tls_and_subjects_need_their_ca(
    env: dict[str, str], tls_dir: Path, unit_pki: UnitPki, tmp_path: Path
) -> None:
    ca = str(unit_pki.other_ca.cert)
    assert "--client-ca-file is set but --tls-dir" in _refused(["--client-ca-file", ca], env)
    assert "--allowed-client-subjects is set but --tls-dir" in _refused(
        ["--allowed-client-subjects", SAP], env
    )
    text = _refused(["--tls-dir", str(tls_dir), "--allowed-client-subjects", SAP], env)
    assert "--allowed-client-subjects / BROKER_ALLOWED_CLIENT_SUBJECTS needs --client-ca-file" in text
    text = _refused(["--tls-dir", str(tls_dir), "--client-ca-file", str(unit_pki.client.cert)], env)
    assert f"--client-ca-file / BROKER_CLIENT_CA_FILE = '{unit_pki.client.cert}' cannot be used" in text
    assert "holds no CA certificate" in text
    text = _refused(
        ["--tls-dir", str(tls_dir), "--client-ca-file", ca, "--allowed-client-subjects", "XX=1"], env
    )
    assert (
        "--allowed-client-subjects / BROKER_ALLOWED_CLIENT_SUBJECTS: subject 'XX=1': unknown attribute type"
        in text
    )


def test_the_upstream_ca_file_must_hold_a_ca(env: dict[str, str], unit_pki: UnitPki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not pem")
    for path in (garbage, tmp_path / "missing.pem", unit_pki.server.cert):
        text = _refused(["--upstream-ca-file", str(path)], env)
        assert text.startswith(f"--upstream-ca-file / BROKER_UPSTREAM_CA_FILE = '{path}' cannot be used")
        assert "or unset it to trust the system's store" in text
