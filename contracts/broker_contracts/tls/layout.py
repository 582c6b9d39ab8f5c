"""Where the TLS files are: the names inside a mounted TLS directory, written once.

The broker reads one directory (``--tls-dir``), mounted from a Secret of cert-manager's shape
(``kubernetes.io/tls`` plus ``ca.crt``), which the operator writes (or a user provides and the
operator only reads):

* ``tls.crt``: the broker's serving certificate, leaf first, then any intermediates;
* ``tls.key``: its private key;
* ``ca.crt``: the trust bundle for the admin port, i.e. the CA(s) whose client certificates the
  operator presents. While a CA key is being replaced it holds the old and the new CA, so that
  either of the operator's certificates is accepted during the switch.

The backend's client CA (the customer's own PKI, for the main port) and the CA bundle for the
broker's own ``https://`` calls are separate files named by settings, not in this directory:
they come from other Secrets, owned by other people.

Names only; what reads them is :mod:`broker_contracts.tls.contexts` and
:mod:`broker_contracts.tls.reloading`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

TLS_CERT_FILE: Final = "tls.crt"
TLS_KEY_FILE: Final = "tls.key"
TLS_CA_FILE: Final = "ca.crt"


@dataclass(frozen=True)
class TlsDirectory:
    """A mounted TLS directory and the paths of its three files."""

    path: Path

    @property
    def cert(self) -> Path:
        return self.path / TLS_CERT_FILE

    @property
    def key(self) -> Path:
        return self.path / TLS_KEY_FILE

    @property
    def ca(self) -> Path:
        return self.path / TLS_CA_FILE
