"""The broker's TLS settings: what its listeners serve and whom they trust, checked at start.

Read by :func:`broker_service.settings.parse_settings` from the flags and variables below, and
checked there once, so that a broker that could not serve TLS stops at start with the flag, the
value and what to do, instead of failing every handshake later:

* ``--tls-dir`` (``BROKER_TLS_DIR``): the mounted TLS Secret (``tls.crt``, ``tls.key``,
  ``ca.crt``; ``broker_contracts.tls.layout``). Set, both ports serve TLS only; unset, plain
  HTTP as before. It needs ``--admin-port``: the operator's port requires a client certificate
  and the main port cannot (kubelet probes present none), so one port cannot be both.
* ``--tls-reload-seconds`` (``BROKER_TLS_RELOAD_SECONDS``, 10): how often the files are read
  for a rotation, the listeners' and ``--upstream-ca-file``; between 0.1 and 300, checked even
  without ``--tls-dir``.
* ``--client-ca-file`` (``BROKER_CLIENT_CA_FILE``): the CA(s) of the backend's client
  certificates (the customer's PKI). Given, the main port asks for a client certificate and
  verifies one that is presented; none is still fine there (probes, ``/metrics``).
* ``--allowed-client-subjects`` (``BROKER_ALLOWED_CLIENT_SUBJECTS``, one RFC 4514 subject per
  line; the flag may repeat): given, ``SendMessages`` needs a verified client certificate with
  one of these subjects (``broker_contracts.tls.subjects``). Needs ``--client-ca-file``: a
  subject is only worth checking on a certificate the broker verified.
* ``--upstream-ca-file`` (``BROKER_UPSTREAM_CA_FILE``): the CA bundle that ``https://`` backend
  and cloud URLs are verified against; unset, the system's trust store. Independent of
  ``--tls-dir``; read again every ``--tls-reload-seconds`` (``upstream_tls.py``).
* ``--tls-handshake-timeout-seconds`` (tuning, no variable; 10): how long a connection may take
  to finish its handshake; until then it is not counted by ``--max-connections``.

Not here: serving (``listener_tls.py``), following the upstream bundle (``upstream_tls.py``), the
subject check (``server.py``).
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from broker_contracts import environment
from broker_contracts.tls import (
    ClientCertificates,
    Subject,
    SubjectError,
    TlsDirectory,
    certificate_serial,
    client_context,
    parse_subject,
    server_context,
)

RELOAD_SECONDS_RANGE: Final = (0.1, 300.0)
DEFAULT_HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0


class TlsSettingsError(ValueError):
    """A TLS setting that cannot be used; the text names the flag, its variable, the value, what to do."""


@dataclass(frozen=True)
class ListenerTlsSettings:
    """TLS on both listeners (``--tls-dir`` set)."""

    directory: Path
    reload_seconds: float = 10.0
    client_ca_file: Path | None = None  # None: the main port asks for no client certificate
    allowed_client_subjects: frozenset[Subject] = frozenset()  # empty: SendMessages needs none
    handshake_timeout_seconds: float = DEFAULT_HANDSHAKE_TIMEOUT_SECONDS

    @property
    def files(self) -> TlsDirectory:
        return TlsDirectory(self.directory)


def _names(flag: str, env: str, value: str) -> str:
    return f"{flag} / {env} = {value!r}"


def _seconds(text: str, flag: str, env: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TlsSettingsError(f"{_names(flag, env, text)} is not a number of seconds") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise TlsSettingsError(f"{_names(flag, env, text)} must be between {low:g} and {high:g} seconds")
    return value


def parse_reload_seconds(text: str) -> float:
    """``--tls-reload-seconds``: used by the listeners and by the upstream bundle alike."""
    return _seconds(
        text, "--tls-reload-seconds", environment.BROKER_TLS_RELOAD_SECONDS, *RELOAD_SECONDS_RANGE
    )


def _check_served(directory: Path) -> None:
    """The directory's files make the admin port's context, and the certificate's serial reads."""
    names = _names("--tls-dir", environment.BROKER_TLS_DIR, str(directory))
    files = TlsDirectory(directory)
    try:
        server_context(
            files.cert, files.key, client_certificates=ClientCertificates.REQUIRED, client_ca_file=files.ca
        )
        certificate_serial(files.cert.read_text(encoding="ascii", errors="replace"))
    except (OSError, ssl.SSLError, ValueError) as error:
        raise TlsSettingsError(
            f"{names} cannot be served: {error}. Mount the broker's TLS Secret there ({files.cert.name}: "
            f"the certificate and its chain, {files.key.name}: its key, {files.ca.name}: the CA(s) of the "
            "operator's client certificates), or unset it to serve plain HTTP"
        ) from None


def _check_ca_file(path: Path, flag: str, env: str, what: str) -> None:
    try:
        client_context(ca_file=path)
    except (OSError, ssl.SSLError) as error:
        raise TlsSettingsError(
            f"{_names(flag, env, str(path))} cannot be used: {error}. Give a PEM file of {what}"
        ) from None


def parse_subjects(text: str) -> frozenset[Subject]:
    """``--allowed-client-subjects``: one RFC 4514 subject per line, blank lines ignored."""
    subjects = set()
    for line in text.splitlines():
        if line.strip():
            try:
                subjects.add(parse_subject(line.strip()))
            except SubjectError as error:
                raise TlsSettingsError(
                    f"--allowed-client-subjects / {environment.BROKER_ALLOWED_CLIENT_SUBJECTS}: {error}"
                ) from None
    return frozenset(subjects)


def parse_listener_tls(
    *,
    tls_dir: str,
    reload_seconds: float,
    client_ca_file: str,
    allowed_client_subjects: str,
    handshake_timeout_seconds: float,
    admin_port: int | None,
) -> ListenerTlsSettings | None:
    """The listeners' TLS from the raw values (empty is unset; ``reload_seconds`` already checked by
    :func:`parse_reload_seconds`), or a :class:`TlsSettingsError`."""
    subjects = parse_subjects(allowed_client_subjects)
    client_ca = Path(client_ca_file.strip()) if client_ca_file.strip() else None
    if not tls_dir.strip():
        if client_ca is not None or subjects:
            flag = "--client-ca-file" if client_ca is not None else "--allowed-client-subjects"
            raise TlsSettingsError(
                f"{flag} is set but --tls-dir / {environment.BROKER_TLS_DIR} is not: client certificates "
                "exist only over TLS; set --tls-dir too, or unset it"
            )
        return None
    directory = Path(tls_dir.strip())
    if admin_port is None:
        raise TlsSettingsError(
            f"{_names('--tls-dir', environment.BROKER_TLS_DIR, str(directory))} needs --admin-port / "
            f"{environment.BROKER_ADMIN_PORT}: the operator's port requires a client certificate, and the "
            "main port cannot (kubelet probes present none); set --admin-port, or unset --tls-dir"
        )
    _check_served(directory)
    if client_ca is not None:
        _check_ca_file(
            client_ca,
            "--client-ca-file",
            environment.BROKER_CLIENT_CA_FILE,
            "the CA certificate(s) that sign the backend's client certificates",
        )
    elif subjects:
        raise TlsSettingsError(
            f"--allowed-client-subjects / {environment.BROKER_ALLOWED_CLIENT_SUBJECTS} needs "
            f"--client-ca-file / {environment.BROKER_CLIENT_CA_FILE}: a subject is only worth checking on a "
            "certificate the broker verified; give the CA of the backend's client certificates"
        )
    if handshake_timeout_seconds < 0.1 or not math.isfinite(handshake_timeout_seconds):
        raise TlsSettingsError(
            f"--tls-handshake-timeout-seconds = {handshake_timeout_seconds} must be a finite number of at "
            "least 0.1"
        )
    return ListenerTlsSettings(
        directory=directory,
        reload_seconds=reload_seconds,
        client_ca_file=client_ca,
        allowed_client_subjects=subjects,
        handshake_timeout_seconds=handshake_timeout_seconds,
    )


def parse_upstream_ca(text: str) -> Path | None:
    """``--upstream-ca-file``: unset or empty is None (the system's trust store)."""
    if not text.strip():
        return None
    path = Path(text.strip())
    _check_ca_file(
        path,
        "--upstream-ca-file",
        environment.BROKER_UPSTREAM_CA_FILE,
        "the CA certificate(s) that sign the backend's and the cloud's server certificates, or unset it "
        "to trust the system's store",
    )
    return path
