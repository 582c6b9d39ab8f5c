"""``--allowed-client-subjects``: only listed client certificates may send bundles on the main port.

The TLS handshake has already verified a certificate the client presented against
``--client-ca-file`` (a bad one never gets this far); what is left is whether the connection
presented one, and whether its subject is on the list. That is checked on every ``POST /soap`` of
the main port, before the bearer credential and before the body is read, so that a caller without
a listed certificate learns nothing about tokens and costs the broker a dictionary lookup. The
probes, ``/metrics`` and the WSDL stay open: kubelet presents no certificate.

A refusal is an ``UNAUTHENTICATED`` fault that says which of the two it was (and the subject
presented, which is the caller's own and no secret), counted and logged like any refused
credential (``credentials.AuthFailureLog``: ``broker_auth_failures_total`` with reason
``no_client_certificate`` or ``client_subject_not_allowed``).

Not here: parsing the list (``tls_settings.py``) or subjects (``broker_contracts.tls.subjects``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker_contracts.soap import FaultCode
from broker_contracts.tls import Subject, peer_subject, render_subject
from broker_service.credentials import AuthFailure, AuthFailureLog
from broker_service.soap_codec import SoapFaultError

ALLOWED_SUBJECTS_KEY: web.AppKey[frozenset[Subject]] = web.AppKey("allowed_client_subjects", frozenset)


def _peer_certificate(request: web.Request) -> dict[str, Any] | None:
    transport = request.transport
    certificate = transport.get_extra_info("peercert") if transport is not None else None
    return certificate or None  # {} when the handshake verified nothing


def check_client_subject(request: web.Request, failures: AuthFailureLog, needed: str) -> None:
    """Raise an ``UNAUTHENTICATED`` fault unless the connection's client certificate is listed."""
    allowed = request.app.get(ALLOWED_SUBJECTS_KEY)
    if not allowed:
        return
    certificate = _peer_certificate(request)
    operation = f"{request.method} {request.path}"
    if certificate is None:
        failures.record(needed, AuthFailure.NO_CLIENT_CERTIFICATE, request.remote, operation)
        raise SoapFaultError(
            FaultCode.UNAUTHENTICATED,
            "this port accepts SOAP calls only from a client certificate whose subject is in the broker's "
            "--allowed-client-subjects, and this connection presented none: configure the backend's TLS "
            "client identity (in SAP, the SSL client PSE) with a certificate from the CA in the broker's "
            "--client-ca-file",
        )
    subject = peer_subject(certificate.get("subject", ()))
    if subject not in allowed:
        failures.record(needed, AuthFailure.CLIENT_SUBJECT_NOT_ALLOWED, request.remote, operation)
        raise SoapFaultError(
            FaultCode.UNAUTHENTICATED,
            f"the client certificate's subject {render_subject(subject)!r} is not in the broker's "
            "--allowed-client-subjects; add it there (RFC 4514, matched exactly) or present a listed one",
        )
