"""TLS for the simulators' own listeners: ``--tls-dir``, so a broker can be tested against ``https://``.

The backend and the cloud are the broker's upstream targets; a broker verifies their
certificates against ``--upstream-ca-file`` (or the system's store). Given ``--tls-dir`` (the same
layout as the broker's: ``tls.crt``, ``tls.key``; ``broker_contracts.tls.layout``), a simulator
serves HTTPS with a context from :func:`broker_contracts.tls.server_context`, read once at start:
a simulator's certificate does not rotate.

Not here: the backend simulator's own calls to a TLS broker (``calling_tls.py``).
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

from broker_contracts.tls import TlsDirectory, server_context


def add_tls_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="serve HTTPS with tls.crt and tls.key from this directory (default: plain HTTP)",
    )


def serving_context(tls_dir: Path | None) -> ssl.SSLContext | None:
    """The listener's context for ``--tls-dir``, or None for plain HTTP."""
    if tls_dir is None:
        return None
    files = TlsDirectory(tls_dir)
    return server_context(files.cert, files.key)
