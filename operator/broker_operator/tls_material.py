"""What the operator presents and trusts when it calls a broker over TLS: one frozen value.

The controller reads it from the cluster's Secrets (``controller/certificates.py``: the operator's
client certificate and the CA bundle the brokers' serving certificates chain to, issued by the
operator in mode Operator or the user's in mode Secrets); the heartbeat client builds its
``ssl.SSLContext`` from it (``tls_client.py``). The two meet only here, so neither imports the
other. ``version`` changes whenever any of the three changes: a client holding a context built
from an older version builds a new one, and new connections (fresh handshakes) use it.

Never logged, never put into status or events: ``__repr__`` shows the version only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClientTlsMaterial:
    certificate_pem: bytes = field(repr=False)  # the operator's client certificate (leaf first)
    key_pem: bytes = field(repr=False)  # its private key, unencrypted PEM
    trust_bundle_pem: bytes = field(repr=False)  # the CAs the brokers' serving certificates chain to

    @property
    def version(self) -> str:
        """A short digest of all three: equal versions, equal material."""
        digest = hashlib.sha256()
        for part in (self.certificate_pem, self.key_pem, self.trust_bundle_pem):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
        return digest.hexdigest()[:16]
