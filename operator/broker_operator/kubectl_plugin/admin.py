"""The broker's admin SOAP operations for the plugin: ``ListHeld``, ``ReplayHeld``, ``DiscardHeld``.

A synchronous zeep client built from the shared WSDL (``broker_contracts.wsdl_path()``, the same
file the broker serves and the operator's heartbeat client reads), one ``requests`` session per
broker carrying ``Authorization: Bearer <operator token>``. The plugin makes a handful of calls
per command, so the operator's aiohttp machinery (built for 1,000 brokers at 1 Hz) is not needed.

A broker that serves TLS (an ``https`` URL) is called with mutual TLS, given an
:class:`~broker_operator.kubectl_plugin.admin_tls.AdminTls`: the operator's client certificate
presented, the broker verified against the cluster's CA bundle alone under its pod's DNS name while
the pod's IP (or a port-forward) is dialled (``admin_tls.VerifiedAsAdapter``). The bearer token is
still sent: the second factor, as for the operator.

Every failure becomes a :class:`PluginError` naming the broker and its URL: a SOAP fault with the
broker's code (``UNAUTHENTICATED``, ``NOT_FOUND``, ``JOURNAL_ERROR``, ...), a TLS failure with what
must hold (the chain, the name, the client certificate, and which Secret), a refused or timed-out
connection with what to do from outside the pod network (``kubectl port-forward`` and ``--url``).
zeep parses with DTDs, entities and external fetches forbidden, as the operator's client does.

Not here: which broker to ask (``held``), or how to print the answer.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Final

import requests
import urllib3.exceptions
import zeep
import zeep.exceptions
from lxml import etree
from zeep.transports import Transport

import broker_contracts
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, NAMESPACE, FaultCode, HeldMessage
from broker_operator.heartbeat_soap import fault_code
from broker_operator.kubectl_plugin.admin_tls import AdminTls, VerifiedAsAdapter
from broker_operator.kubectl_plugin.errors import PluginError

_BINDING: Final = f"{{{NAMESPACE}}}BrokerBinding"
DEFAULT_TIMEOUT_SECONDS: Final = 10.0


def held_json(message: HeldMessage) -> dict[str, Any]:
    """A held message as the plugin's ``-o json`` documents spell it (the WSDL's names)."""
    return {
        "direction": message.direction,
        "stream": message.stream,
        "seq": message.seq,
        "msgId": message.msg_id,
        "attempts": message.attempts,
        "lastError": message.last_error,
        "heldSince": message.held_since,
    }


class BrokerAdminError(PluginError):
    """An admin call that failed; ``code`` is the broker's fault code when it answered with one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@functools.cache
def _client() -> zeep.Client:
    settings = zeep.Settings(strict=True, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    return zeep.Client(str(broker_contracts.wsdl_path()), settings=settings)


class BrokerAdmin:
    """The admin operations of one broker at ``url``, authenticated with the operator's ``token`` (and,
    for an ``https`` URL with ``tls``, the operator's client certificate)."""

    def __init__(
        self,
        broker: str,
        url: str,
        token: str,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        *,
        tls: AdminTls | None = None,
    ) -> None:
        self.broker = broker
        self.url = url
        self._tls = tls if url.lower().startswith("https://") else None
        session = requests.Session()
        if self._tls is not None:
            session.mount("https://", VerifiedAsAdapter(self._tls.context(), self._tls.server_name))
        session.headers[AUTH_HEADER] = f"{AUTH_SCHEME} {token}"
        self._session = session
        transport = Transport(session=session, timeout=timeout, operation_timeout=timeout)
        client = zeep.Client(_client().wsdl, settings=_client().settings, transport=transport)
        self._service = client.create_service(_BINDING, url)

    def list_held(self, stream: str | None = None) -> list[HeldMessage]:
        reply = self._invoke("ListHeld", **({"stream": stream} if stream else {}))
        return [_held(entry) for entry in reply or []]

    def replay(self, direction: str, stream: str, seq: int) -> str:
        """``ReplayHeld``; returns the broker's message."""
        return self._action("ReplayHeld", direction, stream, seq)

    def discard(self, direction: str, stream: str, seq: int) -> str:
        """``DiscardHeld``; returns the broker's message."""
        return self._action("DiscardHeld", direction, stream, seq)

    def _action(self, operation: str, direction: str, stream: str, seq: int) -> str:
        reply = self._invoke(operation, direction=direction, stream=stream, seq=seq)
        if not reply.done:
            raise BrokerAdminError(f"{operation} on {self.broker}: not done: {reply.message}")
        return str(reply.message or "done")

    def _invoke(self, operation: str, **arguments: Any) -> Any:
        try:
            return getattr(self._service, operation)(**arguments)
        except zeep.exceptions.Fault as fault:
            code = fault_code(fault)
            hint = _FAULT_HINTS.get(code, "")
            raise BrokerAdminError(
                f"{operation} refused by broker {self.broker} ({self.url}): {code}: {fault.message}{hint}",
                code,
            ) from None
        except requests.exceptions.SSLError as error:
            raise BrokerAdminError(
                f"TLS with broker {self.broker} at {self.url} failed ({_short(error)}){self._tls_hint()}"
            ) from None
        except requests.exceptions.Timeout:
            raise BrokerAdminError(
                f"broker {self.broker} at {self.url} did not answer {operation} in time{_REACH_HINT}"
            ) from None
        except requests.exceptions.ConnectionError as error:
            if self._tls is not None and _closed_unanswered(error):
                # A refused client certificate has no alert the client can read: the broker's TLS
                # layer closes the connection (TLS 1.3: after the client's side of the handshake).
                raise BrokerAdminError(
                    f"broker {self.broker} at {self.url} closed the connection without answering "
                    f"{operation}, as a broker serving TLS does when its admin port refuses the client "
                    f"certificate{self._tls_hint()}"
                ) from None
            raise BrokerAdminError(
                f"broker {self.broker} unreachable at {self.url} ({_short(error)}){_REACH_HINT}"
            ) from None
        except requests.exceptions.RequestException as error:
            raise BrokerAdminError(
                f"broker {self.broker} unreachable at {self.url} ({_short(error)}){_REACH_HINT}"
            ) from None
        except (zeep.exceptions.Error, etree.LxmlError, ValueError) as error:
            raise BrokerAdminError(
                f"broker {self.broker} at {self.url} answered {operation} with something unusable: {error}"
            ) from None

    def _tls_hint(self) -> str:
        if self._tls is None:
            return "; the broker's certificate was checked against the system's trust store"
        name = self._tls.server_name or "its URL's host"
        return (
            f"; the broker's certificate must chain to ca.crt of {self._tls.source} and carry {name}, and "
            f"its admin port must accept the client certificate of {self._tls.source}: see condition "
            "CertificatesValid and the operator's HeartbeatTLSFailed events (kubectl describe bc)"
        )


_REACH_HINT: Final = (
    "; brokers are reached at their pod IPs, which only work from inside the pod network: from "
    "elsewhere run `kubectl port-forward pod/BROKER 18081:8081` (its admin port; 8080 for a pod "
    "without one) and pass --url http://127.0.0.1:18081/soap (https:// for a broker that serves TLS: "
    "its certificate is still verified as the pod's DNS name)"
)
_FAULT_HINTS: Final = {
    FaultCode.WRONG_PORT.value: (
        " (this broker takes the admin operations on its 'admin' port only: give --url that port)"
    ),
    FaultCode.UNAUTHENTICATED.value: (
        " (the operator's token from the cluster's Secret did not open it: rotated just now, or the "
        "broker was given another Secret?)"
    ),
    FaultCode.NOT_FOUND.value: " (see `kubectl broker held list`)",
    FaultCode.JOURNAL_ERROR.value: " (ask the active broker)",
}


def _held(entry: Any) -> HeldMessage:
    since = entry.heldSince
    return HeldMessage(
        direction=str(entry.direction),
        stream=str(entry.stream),
        seq=int(entry.seq),
        msg_id=str(entry.msgId),
        attempts=int(entry.attempts),
        last_error=str(entry.lastError or ""),
        held_since=since.isoformat() if isinstance(since, datetime) else str(since),
    )


def _closed_unanswered(error: requests.exceptions.ConnectionError) -> bool:
    """The connection was made and then closed or reset before a reply (urllib3's ``ProtocolError``,
    "Connection aborted."), as opposed to a connect that failed (nothing listens there)."""
    return any(isinstance(arg, urllib3.exceptions.ProtocolError) for arg in error.args)


def _short(error: Exception) -> str:
    """The innermost reason of a requests error (``Connection refused``), not urllib3's whole chain."""
    text = str(error)
    for marker in ("] ", "Errno"):
        if marker in text:
            return text.rsplit(marker, 1)[-1].rstrip("')\"")
    return text
