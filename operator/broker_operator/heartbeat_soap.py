"""zeep's side of a heartbeat: the request envelope built and the reply parsed, each cached.

One zeep client, built once from the shared WSDL (``broker_contracts.wsdl_path()``), serves every
broker of every cluster; the bytes travel elsewhere (``heartbeat_client``, over aiohttp). Both
caches are what kept 1,000 brokers at 1 Hz on one core:

- an envelope depends only on (active, epoch, renew, lease), so its bytes are built once;
- a broker answers the same bytes heartbeat after heartbeat (same state, same epoch), so each
  distinct successful reply is parsed once. Faults and errors are never cached.

A reply that is a SOAP fault, is not the WSDL's, or is too large is a :class:`ReplyError` with a
reason and (for a fault) the BrokerFault code; the caller redacts and wraps it. Nothing here
resolves entities or fetches DTDs: the client is strict and forbids both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import zeep
import zeep.exceptions
from lxml import etree
from zeep.transports import Transport

import broker_contracts
from broker_contracts.soap import NAMESPACE, BrokerState
from broker_operator.core.model import HeartbeatReply

__all__ = ["MAX_REPLY_BYTES", "HeartbeatSoap", "ReplyError", "fault_code"]

MAX_REPLY_BYTES: Final = 64 * 1024  # a Heartbeat reply is a few hundred bytes; refuse anything huge
_REPLY_CACHE_SIZE: Final = 8192  # distinct replies kept; cleared when full (replies are ~400 bytes)


class ReplyError(Exception):
    """A reply that is no usable ``HeartbeatReply``: ``reason`` unredacted, ``code`` for a fault."""

    def __init__(self, reason: str, code: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass
class _ReplyShim:
    """The few attributes of a requests.Response that zeep's process_reply reads."""

    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    encoding: str | None = None


@functools.cache
def _zeep_client() -> zeep.Client:
    # strict + forbid_* : a hostile or broken broker cannot make us resolve
    # entities or fetch DTDs while we parse its reply.
    settings = zeep.Settings(strict=True, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    return zeep.Client(str(broker_contracts.wsdl_path()), settings=settings, transport=Transport())


def fault_code(fault: zeep.exceptions.Fault) -> str:
    """The BrokerFault ``code`` from a fault's detail, or the SOAP faultcode."""
    detail = fault.detail
    if detail is not None:
        code = detail.find(f".//{{{NAMESPACE}}}code")
        if code is not None and code.text:
            return str(code.text)
    return str(fault.code)


class HeartbeatSoap:
    """Envelopes for one operator id, and replies parsed; one per ``HeartbeatClient``."""

    def __init__(self, operator_id: str) -> None:
        self._operator_id = operator_id
        self._client = _zeep_client()
        self._binding = self._client.service._binding
        self._operation = self._binding.get("Heartbeat")
        self._replies: dict[tuple[bytes, str], HeartbeatReply] = {}

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - the client lives as long as the process
    def envelope(self, active: bool, epoch: int, renew: bool, lease_seconds: float | None = None) -> bytes:
        # renewLease is sent only when false: absent means true, and a renewal stays
        # the message every broker built against the first WSDL understands. So is
        # leaseSeconds only when given (a handover renewal): absent = the broker's own lease.
        extra: dict[str, object] = {} if renew else {"renewLease": False}
        if lease_seconds is not None:
            extra["leaseSeconds"] = lease_seconds
        message = self._client.create_message(
            self._client.service,
            "Heartbeat",
            active=active,
            epoch=epoch,
            operatorId=self._operator_id,
            **extra,
        )
        return bytes(etree.tostring(message, xml_declaration=True, encoding="utf-8"))

    def reply(
        self, status: int, content: bytes, content_type: str, redact: Callable[[str], str]
    ) -> HeartbeatReply:
        """The parsed reply, its broker-written texts passed through ``redact``; or :class:`ReplyError`."""
        if len(content) > MAX_REPLY_BYTES:
            raise ReplyError(f"reply larger than {MAX_REPLY_BYTES} bytes")
        if status == 200:
            cached = self._replies.get((content, content_type))
            if cached is not None:
                return cached
        reply = self._parse(status, content, content_type, redact)
        if len(self._replies) >= _REPLY_CACHE_SIZE:
            self._replies.clear()
        self._replies[(content, content_type)] = reply
        return reply

    def _parse(
        self, status: int, content: bytes, content_type: str, redact: Callable[[str], str]
    ) -> HeartbeatReply:
        shim = _ReplyShim(status, content, {"Content-Type": content_type})
        try:
            result: Any = self._binding.process_reply(self._client, self._operation, shim)
        except zeep.exceptions.Fault as fault:
            code = fault_code(fault)
            raise ReplyError(f"SOAP fault {code}: {fault.message}", code) from None
        except (zeep.exceptions.Error, etree.LxmlError, ValueError) as error:
            raise ReplyError(f"unusable reply (HTTP {status}): {error}") from None
        try:
            state = BrokerState(result.state)
            epoch = int(result.epoch)
        except (AttributeError, TypeError, ValueError) as error:
            raise ReplyError(f"reply does not follow the WSDL: {error}") from None
        code_text, message = result.unavailabilityCode, result.unavailabilityMessage
        return HeartbeatReply(
            state=state,
            unavailability_code=redact(code_text) if code_text else None,
            unavailability_message=redact(message) if message else None,
            epoch=epoch,
        )
