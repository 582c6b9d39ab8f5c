"""``kubectl broker ca CLUSTER``: the CA the brokers' serving certificate chains to, for the SAP admin.

The SAP backend calls the ``-active`` Service over TLS and must trust the CA of the brokers'
serving certificate: in transaction STRUST (the SSL client PSE the SOAP logical port uses) or in
the PI/PO NWA's TrustedCAs keystore view. Both import an X.509 certificate file, Base64 (PEM) or
binary (DER, usually named ``.cer``); one certificate per import. So this prints the CA bundle as
PEM (stdout, or ``--file``), or writes one DER file per certificate, and tells which certificate
is which by subject, SHA-256 and SHA-1 fingerprints (STRUST shows the latter) and end date, so
that the person importing it can compare what they see.

Where the CA comes from (docs/tls.md): mode ``Operator``, the ``ca.crt`` key of ``<name>-tls``,
which the operator writes (two CAs while a CA key replacement is in its Trusting or Reissuing
phase: import both); mode ``Secrets``, the ``ca.crt`` of the Secret ``spec.tls.secrets.server``
names. Only certificates are read and printed: the key of ``<name>-tls`` is never decoded, and
nothing of ``<name>-ca`` is read. Mode ``Disabled`` has no CA: exit 2, with what to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.serialization import Encoding

from broker_contracts.tls.serial import serial_hex
from broker_operator.controller import names
from broker_operator.controller.bodies import BrokerClusterBody
from broker_operator.core import spec_fields as fields
from broker_operator.kubectl_plugin.errors import EXIT_USAGE, PluginError
from broker_operator.kubectl_plugin.kube import Kube, cluster_spec
from broker_operator.pki.material import CertificateError, load_certificates

SCHEMA: Final = "kubectl-broker/ca/v1"
CA_KEY: Final = "ca.crt"
FORMATS: Final = ("pem", "der")


@dataclass(frozen=True)
class ExportedCa:
    subject: str
    serial: str  # lower-case hex, as status.tls shows serials
    not_after: str  # RFC 3339
    sha256: str  # colon-separated upper-case hex, as openssl and STRUST print fingerprints
    sha1: str
    pem: str

    def document(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "serial": self.serial,
            "notAfter": self.not_after,
            "sha256": self.sha256,
            "sha1": self.sha1,
            "pem": self.pem,
        }


def _colon_hex(digest: bytes) -> str:
    return ":".join(f"{byte:02X}" for byte in digest)


def ca_source(body: BrokerClusterBody) -> tuple[str, str]:
    """(Secret, key) holding the CA bundle SAP must trust, for the cluster's ``spec.tls.mode``."""
    name = body["metadata"]["name"]
    tls = cluster_spec(body).tls
    if tls.mode == fields.TLS_MODE_DISABLED:
        raise PluginError(
            f"BrokerCluster {name} has spec.tls.mode Disabled: its brokers serve plain HTTP and there is "
            "no CA to export; set spec.tls.mode Operator (the default) or Secrets",
            EXIT_USAGE,
        )
    if tls.secrets is not None:  # mode Secrets: the user's serving Secret, cert-manager's shape
        return tls.secrets.server, CA_KEY
    return names.tls_secret_name(name), CA_KEY


def exported_cas(pem: bytes, where: str) -> list[ExportedCa]:
    """The CA certificates of a bundle, parsed with the PKI's bounds; a leaf in it is refused."""
    try:
        certificates = load_certificates(pem, what=where)
    except CertificateError as error:
        raise PluginError(f"{where} does not hold a readable certificate bundle: {error}") from None
    exported = []
    for certificate in certificates:
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise PluginError(
                f"{where} holds {certificate.subject.rfc4514_string()}, which is not a CA certificate; "
                "give SAP the CA, not a leaf"
            )
        exported.append(
            ExportedCa(
                subject=certificate.subject.rfc4514_string(),
                serial=serial_hex(certificate.serial_number),
                not_after=certificate.not_valid_after_utc.isoformat(),
                sha256=_colon_hex(certificate.fingerprint(hashes.SHA256())),
                sha1=_colon_hex(certificate.fingerprint(hashes.SHA1())),  # what STRUST shows beside SHA-256
                pem=certificate.public_bytes(Encoding.PEM).decode("ascii"),
            )
        )
    return exported


def read_cas(kube: Kube, body: BrokerClusterBody) -> tuple[str, list[ExportedCa]]:
    secret, key = ca_source(body)
    pem = kube.secret_bytes(secret, key)
    where = f"Secret {kube.namespace}/{secret} key {key}"
    if pem is None:
        raise PluginError(
            f"{where} is not there yet: the operator writes it when the BrokerCluster is reconciled "
            "(mode Operator), or the Secret's owner must add it (mode Secrets); see condition "
            "CertificatesValid in kubectl describe bc"
        )
    return where, exported_cas(pem, where)


def der_paths(file: Path, count: int) -> list[Path]:
    """One DER file per certificate: FILE itself for one, FILE's stem numbered from 1 for more."""
    if count == 1:
        return [file]
    return [file.with_name(f"{file.stem}-{index}{file.suffix or '.cer'}") for index in range(1, count + 1)]


def write_der(cas: list[ExportedCa], file: Path) -> list[Path]:
    paths = der_paths(file, len(cas))
    for ca, path in zip(cas, paths, strict=True):
        der = x509.load_pem_x509_certificate(ca.pem.encode("ascii")).public_bytes(Encoding.DER)
        path.write_bytes(der)
    return paths


def render_summary(where: str, cas: list[ExportedCa]) -> str:
    lines = [f"{len(cas)} CA certificate{'s' if len(cas) != 1 else ''} from {where}:"]
    for ca in cas:
        lines += [
            f"  subject:  {ca.subject}",
            f"  serial:   {ca.serial}",
            f"  notAfter: {ca.not_after}",
            f"  SHA-256:  {ca.sha256}",
            f"  SHA-1:    {ca.sha1}",
        ]
    if len(cas) > 1:
        lines.append("  import every one of them (a CA key replacement is under way; docs/tls.md)")
    return "\n".join(lines)
