"""What a broker holds instead of a bearer token: its verifier, ``sha256:<64 hex digits>``.

A broker must be able to tell the operator's (and the backend's) token when it is presented, but
must not hold it: a broker that held the operator's token could, once compromised, send Heartbeat
or DiscardHeld to its peers. So the operator keeps the token and gives the brokers only the
SHA-256 of it (docs/broker.md, "Credentials"); the broker hashes what a caller presents and
compares the digests in constant time.

Why a plain SHA-256 and no slow KDF (bcrypt, scrypt, Argon2): a slow KDF protects low-entropy
secrets (passwords) against guessing from a stolen hash. These tokens are random with at least
:data:`MIN_TOKEN_BYTES` bytes (the operator generates 32 random bytes, and refuses a user's token
shorter than that), so guessing a preimage of the digest is out of reach whatever the hash costs,
while a slow KDF would cost every request (each SendMessages bundle) tens of milliseconds of CPU
and give an anonymous caller a way to burn it.

One function makes a verifier and one reads it, here, so that the operator, the local runner, the
test helpers and the broker agree on the bytes (the token's UTF-8, without surrounding
whitespace, as a header value or a Secret file carries it). Not here: where verifiers are stored
or how they rotate (the operator's controller, the broker's ``credentials.py``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

VERIFIER_SCHEME: Final = "sha256:"
MIN_TOKEN_BYTES: Final = 32
"""The shortest token the operator accepts from a user's Secret (its own are 43 characters)."""

_VERIFIER = re.compile(r"sha256:([0-9a-f]{64})")


class VerifierError(ValueError):
    """Text that is not a verifier; the message says what was expected (never the text itself)."""


def token_digest(token: bytes) -> bytes:
    """The SHA-256 digest a presented token is compared by (surrounding whitespace removed)."""
    return hashlib.sha256(token.strip()).digest()


def token_verifier(token: str) -> str:
    """The verifier of ``token``: ``sha256:`` and the hex digest of its stripped UTF-8 bytes."""
    if not token.strip():
        raise VerifierError("an empty token has no verifier")
    return VERIFIER_SCHEME + token_digest(token.encode()).hex()


def parse_verifier(text: str) -> bytes:
    """The digest a verifier names. Anything else is refused without echoing it: a token mounted
    where its verifier belongs must neither be accepted nor reach a log."""
    match = _VERIFIER.fullmatch(text.strip())
    if match is None:
        raise VerifierError(
            f"not a token verifier: expected '{VERIFIER_SCHEME}' and 64 lowercase hex digits "
            f"(got {len(text.strip())} characters); was the token itself given where its verifier belongs?"
        )
    return bytes.fromhex(match.group(1))


def main() -> int:
    """``python -m broker_contracts.token_verifier < token``: print the token's verifier (local runs)."""
    import sys

    token = sys.stdin.read().strip()
    if len(token.encode()) < MIN_TOKEN_BYTES:
        print(
            f"a token needs at least {MIN_TOKEN_BYTES} bytes (this one has {len(token.encode())})",
            file=sys.stderr,
        )
        return 2
    print(token_verifier(token))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
