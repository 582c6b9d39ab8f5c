"""``ssl.SSLContext`` builders for every TLS channel: one place for the protocol floor and ciphers.

* **TLS 1.2 minimum**, not 1.3: SAP ABAP kernels may lack TLS 1.3 (DAY2_FACTS.md), and the
  backend is the main port's only caller. 1.3 is negotiated whenever both sides have it.
* **Ciphers**: Python's own default list, left as it is. On this Python (3.11, OpenSSL 3.0) it is
  ``@SECLEVEL=2:ECDH+AESGCM:ECDH+CHACHA20:ECDH+AES:DHE+AES:!aNULL:!eNULL:!aDSS:!SHA1:!AESCCM``:
  forward secrecy only, no SHA-1 MACs, and at security level 2 (RSA and DH keys of 2048 bits or
  more, no SHA-1 signatures). The ECDHE-RSA-AES-GCM suites it keeps are the ones SAP's
  CommonCryptoLib offers over TLS 1.2, so a list of our own would only be one more thing to keep
  up to date.
* **Client-initiated renegotiation is off** on servers (``OP_NO_RENEGOTIATION``): under TLS 1.2
  it lets one connection make the server redo its most expensive step at will.
* **Verification** is stated per use: a server asks for client certificates not at all, optionally
  (the main port: kubelet probes present none) or always (the admin port: the operator's); a
  client always verifies the server's chain and name, against a given CA file or, without one,
  the system's trust store.

Certificates and keys are read from paths (``load_cert_chain`` takes nothing else on this
Python). A context built here is never changed after it is handed out: to serve a new
certificate, build a new context (:mod:`broker_contracts.tls.reloading` says why).
"""

from __future__ import annotations

import enum
import ssl
from pathlib import Path
from typing import Final

MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2


class ClientCertificates(enum.Enum):
    """Whether a server asks its clients for a certificate."""

    NONE = ssl.CERT_NONE  # not asked for
    OPTIONAL = ssl.CERT_OPTIONAL  # asked for; none is fine, a bad one fails the handshake
    REQUIRED = ssl.CERT_REQUIRED  # a connection without a verified one fails the handshake


def server_context(
    cert_file: Path,
    key_file: Path,
    *,
    client_certificates: ClientCertificates = ClientCertificates.NONE,
    client_ca_file: Path | None = None,
) -> ssl.SSLContext:
    """A server context serving ``cert_file`` (leaf and chain) with ``key_file``.

    With ``client_certificates`` other than ``NONE``, a client's certificate is verified against
    the CA(s) in ``client_ca_file``, which is then required. Raises ``OSError`` or
    ``ssl.SSLError`` (a file missing, unreadable, not PEM, a key that is not the certificate's).
    """
    if client_certificates is not ClientCertificates.NONE and client_ca_file is None:
        raise ValueError(f"client certificates {client_certificates.name}: a client CA file is needed")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None and client_certificates is not ClientCertificates.NONE:
        context.load_verify_locations(cafile=client_ca_file)
        if not context.get_ca_certs():
            # A bundle of leaves (or of nothing a CA would be) would refuse every client.
            raise ssl.SSLError(f"{client_ca_file} holds no CA certificate")
    context.verify_mode = client_certificates.value
    return context


def client_context(
    *,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
) -> ssl.SSLContext:
    """A client context that verifies the server's chain and host name.

    Against ``ca_file`` when given, else the system's trust store. With ``cert_file`` and
    ``key_file`` it presents that client certificate.
    """
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=None if ca_file is None else str(ca_file)
    )
    context.minimum_version = MINIMUM_VERSION
    if ca_file is not None and not context.get_ca_certs():
        raise ssl.SSLError(f"{ca_file} holds no CA certificate")
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client certificate needs both its certificate file and its key file")
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(cert_file, key_file)
    return context
