"""Certificates for the brokers' TLS listeners and their clients, made with the ``openssl`` CLI.

A stand-in for the two PKIs a broker meets, for the tests, the demo and the benchmarks: the
operator's (a CA, the broker's serving certificate with its Service names, the operator's client
certificate) and the customer's (the CA that signs the SAP backend's client certificates). What
it writes is what the broker reads from a mounted Secret (``broker_contracts.tls.layout``), and
:func:`write_secret_volume` writes it the way the kubelet updates a Secret volume, so that a
rotation in a test is the rotation a pod sees.

Here, beside :mod:`local_cluster.pki`, rather than in ``tests/``: the demo and the benchmarks use
it too and never import the test suite; and like ``pki`` it shells out to ``openssl`` (the
``cryptography`` package belongs to the operator's own PKI, not to test infrastructure). Keys
are RSA-2048, what the SAP-facing listener needs (DAY2_FACTS.md); each takes a fraction of a
second to generate. Serials are random (16 octets), so no two certificates share one.

Not here: renewal rules or anything the operator decides; that is ``broker_operator.pki``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_contracts.tls.layout import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE
from local_cluster.pki import _openssl

DATA_LINK = "..data"  # the kubelet's name for the symlink to a Secret volume's current files


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate (PEM) and its private key (PEM, unencrypted)."""

    cert: Path
    key: Path


def _rsa_key(path: Path) -> Path:
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path.name, cwd=path.parent
    )
    return path


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA on disk (``<name>-ca.crt``, ``<name>-ca.key``) that issues leaves into its directory."""

    name: str
    cert: Path
    key: Path

    def _issue(self, name: str, subject: str, extensions: str, days: int) -> CertificateFiles:
        directory = self.cert.parent
        key = _rsa_key(directory / f"{name}.key")
        (directory / f"{name}.ext").write_text(extensions)
        _openssl("req", "-new", "-key", key.name, "-subj", subject, "-out", f"{name}.csr", cwd=directory)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", self.cert.name, "-CAkey", self.key.name,
            "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(days), "-sha256",
            "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory,
        )  # fmt: skip
        return CertificateFiles(cert=directory / f"{name}.crt", key=key)

    def issue_server(
        self, name: str, dns_names: Sequence[str], *, ip_addresses: Sequence[str] = (), days: int = 30
    ) -> CertificateFiles:
        """A serving certificate for ``dns_names`` and ``ip_addresses`` (its SANs; the CN is the
        first name). ``days`` below zero gives one that has already expired (for tests of what a
        client then sees)."""
        alt_names = ",".join([*(f"DNS:{dns}" for dns in dns_names), *(f"IP:{ip}" for ip in ip_addresses)])
        return self._issue(
            name,
            f"/CN={dns_names[0]}",
            f"subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=critical,CA:FALSE\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
            days,
        )

    def issue_client(self, name: str, subject: str, *, days: int = 30) -> CertificateFiles:
        """A client certificate with ``subject`` in openssl's ``-subj`` form (``/O=ACME/CN=sap-erp``)."""
        return self._issue(
            name,
            subject,
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"
            "basicConstraints=critical,CA:FALSE\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
            days,
        )


def create_ca(directory: Path, name: str, *, days: int = 365) -> CertificateAuthority:
    """A self-signed RSA-2048 CA, ``CN=<name>``, in ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = _rsa_key(directory / f"{name}-ca.key")
    _openssl(
        "req", "-x509", "-new", "-key", key.name, "-subj", f"/CN={name}", "-days", str(days), "-sha256",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", f"{name}-ca.crt", cwd=directory,
    )  # fmt: skip
    return CertificateAuthority(name=name, cert=directory / f"{name}-ca.crt", key=key)


def tls_secret(server: CertificateFiles, trust: Sequence[Path]) -> dict[str, bytes]:
    """The keys of a broker's TLS Secret: its certificate and key, and ``trust`` as ``ca.crt``."""
    return {
        TLS_CERT_FILE: server.cert.read_bytes(),
        TLS_KEY_FILE: server.key.read_bytes(),
        TLS_CA_FILE: b"".join(path.read_bytes() for path in trust),
    }


def write_secret_volume(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into ``directory`` as the kubelet updates a Secret volume.

    The new contents go into a fresh hidden directory, a ``..data`` symlink is pointed at it in one
    ``rename``, and each key is a symlink ``<key> -> ..data/<key>``: a reader sees all old files
    or all new ones, never a mix. The directory the old ``..data`` named is removed afterwards.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fresh = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{secrets.token_hex(4)}"
    fresh.mkdir()
    for key, data in files.items():
        (fresh / key).write_bytes(data)
    data_link = directory / DATA_LINK
    previous = os.readlink(data_link) if data_link.is_symlink() else None
    staging = directory / f"{DATA_LINK}_tmp"
    staging.unlink(missing_ok=True)
    staging.symlink_to(fresh.name)
    staging.rename(data_link)  # rename(2): atomic, the swap every reader sees at once
    for key in files:
        link = directory / key
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(f"{DATA_LINK}/{key}")
    if previous is not None and previous != fresh.name:
        shutil.rmtree(directory / previous, ignore_errors=True)
