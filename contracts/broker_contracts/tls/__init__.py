"""TLS for every channel of broker-failover: the file layout, context builders, hot reload.

Shared by the broker (its listeners and its calls to the backend and the cloud), the
simulators and the operator, with the standard library's ``ssl`` only (certificates are made
elsewhere: the operator's PKI, or ``local_cluster.broker_certificates`` for tests and demos).

* :mod:`~broker_contracts.tls.layout`: the names inside a mounted TLS directory;
* :mod:`~broker_contracts.tls.contexts`: server and client contexts (TLS 1.2 floor, ciphers);
* :mod:`~broker_contracts.tls.reloading`: a listener's context that follows its files;
* :mod:`~broker_contracts.tls.reloading_client`: a client's context that follows its files;
* :mod:`~broker_contracts.tls.serial`: a certificate's serial, for logs and metrics;
* :mod:`~broker_contracts.tls.bundle`: a trust bundle's version, and the header brokers report it in;
* :mod:`~broker_contracts.tls.subjects`: client certificate subjects, RFC 4514, normalised.
"""

from broker_contracts.tls.bundle import TRUST_BUNDLE_HEADER, BundleVersionError, bundle_version
from broker_contracts.tls.contexts import MINIMUM_VERSION, ClientCertificates, client_context, server_context
from broker_contracts.tls.layout import TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE, TlsDirectory
from broker_contracts.tls.reloading import ReloadingServerContext, TlsFilesError
from broker_contracts.tls.reloading_client import ReloadingClientContext
from broker_contracts.tls.serial import CertificateSerialError, certificate_serial
from broker_contracts.tls.subjects import Subject, SubjectError, parse_subject, peer_subject, render_subject

__all__ = [
    "MINIMUM_VERSION",
    "TLS_CA_FILE",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "TRUST_BUNDLE_HEADER",
    "BundleVersionError",
    "CertificateSerialError",
    "ClientCertificates",
    "ReloadingClientContext",
    "ReloadingServerContext",
    "Subject",
    "SubjectError",
    "TlsDirectory",
    "TlsFilesError",
    "bundle_version",
    "certificate_serial",
    "client_context",
    "parse_subject",
    "peer_subject",
    "render_subject",
    "server_context",
]
