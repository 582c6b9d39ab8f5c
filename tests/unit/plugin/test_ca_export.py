"""``kubectl broker ca``: which Secret per mode, PEM and DER output that openssl reads, the refusals.

The certificates are real (the operator's PKI makes them); only the API calls are the
in-memory ``FakeKube`` (the e2e test ``test_kubectl_plugin`` runs the command against a real
API server and an operator that wrote the Secret)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker_operator.kubectl_plugin import ca_export, cli
from broker_operator.kubectl_plugin.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from broker_operator.pki import issue_server, new_ca
from tests.unit.plugin.support import FakeKube, cluster_body

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def two_cas() -> tuple[bytes, bytes, bytes]:
    """Two CAs' certificates and a leaf of the first (2048-bit keys: fast enough per module)."""
    first = new_ca("broker-failover orders CA", days=3650, now=NOW, key_bits=2048)
    second = new_ca("broker-failover orders CA 2", days=3650, now=NOW, key_bits=2048)
    leaf = issue_server(first, ["orders-active.shop.svc"], days=90, now=NOW)
    return first.certificate_pem, second.certificate_pem, leaf.certificate_pem


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    fake = FakeKube(cluster_body())
    monkeypatch.setattr(cli, "connect", lambda *args: fake)
    return fake


def _openssl_subject(path: Path, inform: str) -> str:
    done = subprocess.run(
        ["openssl", "x509", "-inform", inform, "-in", str(path), "-noout", "-subject"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return done.stdout.strip()


def test_mode_operator_prints_the_tls_secrets_ca_as_pem_on_stdout(
    fake: FakeKube, two_cas: tuple[bytes, bytes, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first, _, _ = two_cas
    fake.secrets[("orders-tls", "ca.crt")] = first
    assert cli.main(["ca", "orders"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out.startswith("-----BEGIN CERTIFICATE-----") and out.count("BEGIN CERTIFICATE") == 1
    assert "from Secret shop/orders-tls key ca.crt" in err and "CN=broker-failover orders CA" in err
    assert "SHA-256:" in err and "SHA-1:" in err
    pem = tmp_path / "ca.pem"
    pem.write_text(out)
    assert _openssl_subject(pem, "PEM") == "subject=CN = broker-failover orders CA"


def test_mode_secrets_reads_the_users_serving_secret(
    fake: FakeKube, two_cas: tuple[bytes, bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    first, _, _ = two_cas
    secrets = {"server": "orders-serving", "operatorClient": "operator-client"}
    fake.body["spec"]["tls"] = {"mode": "Secrets", "secrets": secrets}
    fake.secrets[("orders-serving", "ca.crt")] = first
    fake.secrets[("orders-tls", "ca.crt")] = b"not this one"
    assert cli.main(["ca", "orders", "-o", "json"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "kubectl-broker/ca/v1"
    assert document["source"] == "Secret shop/orders-serving key ca.crt"
    assert [c["subject"] for c in document["certificates"]] == ["CN=broker-failover orders CA"]


def test_der_writes_one_file_per_ca_that_openssl_reads(
    fake: FakeKube, two_cas: tuple[bytes, bytes, bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first, second, _ = two_cas
    fake.secrets[("orders-tls", "ca.crt")] = first + second  # a CA key replacement under way
    assert cli.main(["ca", "orders", "--format", "der", "--file", str(tmp_path / "orders.cer")]) == EXIT_OK
    err = capsys.readouterr().err
    assert "import every one of them" in err
    written = sorted(tmp_path.glob("*.cer"))
    assert [p.name for p in written] == ["orders-1.cer", "orders-2.cer"]
    assert [_openssl_subject(p, "DER") for p in written] == [
        "subject=CN = broker-failover orders CA",
        "subject=CN = broker-failover orders CA 2",
    ]


def test_der_without_a_file_is_a_usage_error(
    fake: FakeKube, two_cas: tuple[bytes, bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.secrets[("orders-tls", "ca.crt")] = two_cas[0]
    assert cli.main(["ca", "orders", "--format", "der"]) == EXIT_USAGE
    assert "--file" in capsys.readouterr().err


def test_disabled_tls_has_no_ca_to_export(fake: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    fake.body["spec"]["tls"] = {"mode": "Disabled"}
    assert cli.main(["ca", "orders"]) == EXIT_USAGE
    assert "spec.tls.mode Disabled" in capsys.readouterr().err


def test_a_missing_secret_points_at_the_condition(fake: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ca", "orders"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "Secret shop/orders-tls key ca.crt is not there yet" in err and "CertificatesValid" in err


def test_a_leaf_or_garbage_is_refused_not_exported(
    fake: FakeKube, two_cas: tuple[bytes, bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fake.secrets[("orders-tls", "ca.crt")] = two_cas[2]
    assert cli.main(["ca", "orders"]) == EXIT_FAILED
    captured = capsys.readouterr()
    assert "not a CA certificate" in captured.err and captured.out == ""
    fake.secrets[("orders-tls", "ca.crt")] = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    assert cli.main(["ca", "orders"]) == EXIT_FAILED
    assert "does not hold a readable certificate bundle" in capsys.readouterr().err


def test_der_paths_number_only_when_there_are_several() -> None:
    assert ca_export.der_paths(Path("/x/ca.cer"), 1) == [Path("/x/ca.cer")]
    assert ca_export.der_paths(Path("/x/ca"), 2) == [Path("/x/ca-1.cer"), Path("/x/ca-2.cer")]
