"""One local run's PKI: a CA and every certificate a broker and the two simulators need on loopback.

For the integration tests, the benchmarks and (later) the demo and the local runner, which start
real processes on ``127.x.y.z`` addresses (``broker_simulators.local_processes``) rather than pods
behind Services. One CA stands for all three PKIs a deployment has (the operator's, the
customer's SAP client CA, the targets' servers): on one machine there is nobody to keep apart,
and one ``ca.crt`` lets every process verify every other. Issued, all from that CA:

* a serving certificate per process, on demand (:meth:`LocalPki.serving_dir`), naming
  ``localhost``, ``127.0.0.1`` and the process's own loopback address as IP SANs (the processes are
  called by address: a client verifies the name it dialled, and the broker's upstream URLs and
  the backend's broker URLs are ``https://127.x.y.z:port``); written as the kubelet writes a
  Secret volume (``tls.crt``, ``tls.key``, ``ca.crt``), the layout the broker reads;
* the operator's client certificate, which a broker's admin port requires;
* the SAP backend's client certificate, whose subject a broker in allowed-subjects mode lists
  (:data:`BACKEND_SUBJECT_ALLOWED`).

Made with :mod:`local_cluster.broker_certificates` (openssl, RSA-2048, what the SAP-facing
listener needs): about a second for the CA and the two client certificates on a quiet machine,
a fraction of one per serving certificate. The flags that hand these files to each process are
:meth:`broker_args` and :meth:`backend_args`, so that the file names are written in one place.

Not here: starting anything (``local_cluster.loopback_relay``), and any rule the operator
applies to its certificates (``broker_operator.pki``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from broker_contracts.tls import TlsDirectory
from broker_simulators.local_processes import CallerTls
from local_cluster.broker_certificates import (
    CertificateAuthority,
    CertificateFiles,
    create_ca,
    tls_secret,
    write_secret_volume,
)

OPERATOR_SUBJECT = "/O=broker-failover/CN=broker-failover-operator"
BACKEND_SUBJECT = "/O=ACME/OU=Basis/CN=sap-erp-local"
"""The backend simulator's client certificate (openssl's ``-subj`` form)."""
BACKEND_SUBJECT_ALLOWED = "CN=sap-erp-local,OU=Basis,O=ACME"
"""The same subject in RFC 4514, as ``--allowed-client-subjects`` takes it."""


@dataclass(frozen=True)
class LocalPki:
    """The CA and the two client certificates of one run, under ``root``."""

    root: Path
    ca: CertificateAuthority
    operator: CertificateFiles
    backend_client: CertificateFiles

    def serving_dir(self, name: str, host: str) -> TlsDirectory:
        """A fresh serving certificate for the process ``name`` on ``host``, in ``<root>/<name>-tls``."""
        ips = list(dict.fromkeys([host, "127.0.0.1"]))
        files = self.ca.issue_server(f"{name}-server", ["localhost", name], ip_addresses=ips)
        directory = self.root / f"{name}-tls"
        write_secret_volume(directory, tls_secret(files, [self.ca.cert]))
        return TlsDirectory(directory)

    def readiness_context(self) -> ssl.SSLContext:
        """For readiness polls: the chain and the address verified, no client certificate."""
        return self.caller().context()

    def caller(self, *, operator: bool = False) -> CallerTls:
        """How to call a process of this run; ``operator``: with the operator's certificate."""
        if not operator:
            return CallerTls(ca_file=self.ca.cert)
        return CallerTls(ca_file=self.ca.cert, cert_file=self.operator.cert, key_file=self.operator.key)

    def broker_args(self, tls_dir: TlsDirectory, *, allowed_subjects: bool = True) -> list[str]:
        """A broker's TLS flags: both ports on ``tls_dir`` (the admin port verifying the operator's
        certificate against its ``ca.crt``), ``https://`` upstreams verified against the run's CA,
        and with ``allowed_subjects`` only the backend's client certificate may send."""
        args = ["--tls-dir", str(tls_dir.path), "--upstream-ca-file", str(self.ca.cert)]
        if allowed_subjects:
            args += [
                "--client-ca-file",
                str(self.ca.cert),
                "--allowed-client-subjects",
                BACKEND_SUBJECT_ALLOWED,
            ]
        return args

    def backend_args(self, *, client_certificate: bool = True) -> list[str]:
        """The backend simulator's flags for ``https://`` broker URLs (its own listener aside)."""
        args = ["--broker-ca-file", str(self.ca.cert)]
        if client_certificate:
            args += ["--client-cert-file", str(self.backend_client.cert)]
            args += ["--client-key-file", str(self.backend_client.key)]
        return args


def create_local_pki(root: Path) -> LocalPki:
    """A CA, the operator's and the backend's client certificates, under ``root`` (created)."""
    ca = create_ca(root, "broker-failover-local")
    return LocalPki(
        root=root,
        ca=ca,
        operator=ca.issue_client("operator", OPERATOR_SUBJECT),
        backend_client=ca.issue_client("backend-client", BACKEND_SUBJECT),
    )
