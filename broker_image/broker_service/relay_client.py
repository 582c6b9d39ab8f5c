"""The broker's HTTP client for the relay contract (:mod:`broker_contracts.relay`).

One aiohttp session for both targets, with the broker's epoch and name on
every call. Failures are sorted into the three cases the broker acts on
differently:

* :class:`StaleEpochError`: the target has seen a higher epoch, so another broker
  is active; the caller fences itself.
* :class:`TargetUnreachableError`: connection refused, timeout, a 5xx or a reply
  that is not the contract's JSON; the caller retries with backoff (these are
  never counted as delivery attempts).
* Anything the target answers per message (``rejected``) comes back in the
  reply for the stream table to judge.

Bodies are encoded and replies decoded with the relay contract's codec
(:func:`broker_contracts.relay.dumps`: orjson when installed; a cloud bundle is
thousands of ~500-byte messages) and sent as bytes; the broker never builds
JSON by hand here.

``https://`` targets are verified (chain and host name) against ``--upstream-ca-file``, or the
system's trust store without it, with the TLS 1.2 floor of :func:`broker_contracts.tls.client_context`;
``http://`` targets are called as before. A verification failure is a
:class:`TargetUnreachableError` like any other transport failure (its text names the target and
OpenSSL's reason). The bundle is followed, not read once (``upstream_tls.py`` checks it every
``--tls-reload-seconds``): every call passes the newest context as aiohttp's per-request ``ssl=``,
so new connections verify with the new trust while connections in use are not dropped.

Two boundaries are kept here, because this is where a target's answer enters the broker:

* A reply is read up to ``reply_limit_bytes`` (``--relay-reply-limit-bytes``) and no further:
  a Content-Length above it is refused before reading, a body without one is read in chunks and
  dropped once it passes the limit. Either is a :class:`TargetUnreachableError` naming the
  limit and the flag, retried like any other.
* Every error text is produced here and passed through :func:`broker_contracts.redact.redact`
  with the target's secrets (:mod:`broker_service.target_credentials`) before it leaves: it
  becomes the heartbeat's ``unavailabilityMessage``, log lines, a held message's last error.
  Targets are shown by their redacted URL; the URL the broker calls has no userinfo (its
  credential goes in an ``Authorization`` header), so an aiohttp exception cannot repeat it;
  and a reply body quoted in a message (a verbose target may echo the request, header and all)
  is redacted like the rest.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any, NoReturn

import aiohttp

from broker_contracts import relay
from broker_contracts.redact import redact
from broker_contracts.tls import ReloadingClientContext
from broker_service.target_credentials import RelayTarget, TargetCredentialError

_READ_CHUNK = 64 * 1024
_QUOTED_CHARS = 200  # how much of a target's reply a message quotes
# How much of it is redacted before the quote is cut: cutting first could leave the head of a
# credential the target echoed (the first bytes of a Basic token) that no rule recognises.
_REDACTED_CHARS = 4096

RelayMessage = tuple[str, int, str, str]
"""``(stream, seq, msgId, payload)``; JSON encodes it as the contract's wire array."""


class RelayError(Exception):
    pass


class StaleEpochError(RelayError):
    def __init__(self, target: str, epoch: int, seen: int) -> None:  # target: its redacted URL
        super().__init__(
            f"{target} refused epoch {epoch}: it has seen epoch {seen}; another broker is active"
        )
        self.seen = seen


class TargetUnreachableError(RelayError):
    pass


class RelayClient:
    def __init__(
        self,
        *,
        backend: RelayTarget,
        cloud: RelayTarget,
        broker_name: str,
        timeout_seconds: float,
        reply_limit_bytes: int,
        trust: ReloadingClientContext | None = None,
    ) -> None:
        self.backend = backend
        self.cloud = cloud
        self.broker_name = broker_name
        self.reply_limit_bytes = reply_limit_bytes
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        # None: aiohttp's default (the system's store); the broker passes upstream_tls.upstream_trust's.
        self._trust = trust

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=32, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    def _ssl(self) -> ssl.SSLContext | bool:
        """The ``ssl=`` of one call: the newest context, taken per call, never kept.

        Why per call and not the connector's: aiohttp (3.14, ``connector.py``) pools idle
        connections by ``ClientRequest.connection_key``, which holds the request's ``ssl`` (the
        SSLContext object itself; ``_get`` reuses only a connection of the same key) and creates a
        new connection with that context (``_get_ssl_context``). So after a swap new calls open new
        connections with the new trust, a call in progress keeps its connection, and the idle
        connections of the old context are never reused: ``_cleanup`` closes them after the
        keep-alive timeout (15 s). ``limit`` counts connections in use only, so they do not hold
        new ones back.
        """
        return True if self._trust is None else self._trust.current

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, epoch: int, target: RelayTarget) -> dict[str, str]:
        headers = {
            relay.EPOCH_HEADER: str(epoch),
            relay.BROKER_HEADER: self.broker_name,
            "Content-Type": "application/json",
        }
        authorization = target.current_authorization()
        if authorization is not None:
            headers["Authorization"] = authorization
        return headers

    @staticmethod
    def _fail(target: RelayTarget, text: str) -> NoReturn:
        """The one way an error leaves this client: its text redacted with the target's secrets."""
        raise TargetUnreachableError(redact(text, target.secrets))

    @staticmethod
    def _quote(target: RelayTarget, value: object) -> str:
        """A target's reply, or a part of it, as a message may quote it: redacted, then cut."""
        return redact(repr(value)[:_REDACTED_CHARS], target.secrets)[:_QUOTED_CHARS]

    async def _read_bounded(self, response: aiohttp.ClientResponse, target: RelayTarget, shown: str) -> bytes:
        """The reply's body, or an error once it is larger than ``reply_limit_bytes``."""
        limit = self.reply_limit_bytes
        too_large = (
            f"{shown} answered a reply larger than the broker's limit of {limit} bytes "
            "(--relay-reply-limit-bytes); the rest was not read"
        )
        if response.content_length is not None and response.content_length > limit:
            self._fail(target, too_large)
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.content.read(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                self._fail(target, too_large)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _call(
        self,
        method: str,
        target: RelayTarget,
        path: str,
        epoch: int,
        body: object | None = None,
        *,
        query: dict[str, str] | None = None,
        expect_json: bool = True,
    ) -> Any:
        shown = f"{method} {target.display_of(path)}"
        if self._session is None:
            self._fail(target, f"relay client is closed; cannot {shown}")
        if not target.configured:
            self._fail(target, f"the {target.name} URL is not configured (--{target.name}-url)")
        data = relay.dumps(body) if body is not None else None
        try:
            headers = self._headers(epoch, target)
            async with self._session.request(
                method, target.call_url(path, query), data=data, headers=headers, ssl=self._ssl()
            ) as response:
                text = await self._read_bounded(response, target, shown)
                if response.status == relay.STALE_EPOCH_STATUS:
                    seen = _seen_epoch(text)
                    raise StaleEpochError(target.display_of(path), epoch, seen)
                if response.status >= 300:
                    quoted = self._quote(target, text[:_REDACTED_CHARS])
                    self._fail(target, f"{shown} answered HTTP {response.status}: {quoted}")
                return relay.loads(text) if text and expect_json else None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self._fail(target, f"{shown} failed: {error.__class__.__name__}: {error}")
        except TargetCredentialError as error:
            self._fail(target, f"{shown}: the {target.name} credentials cannot be used: {error}")
        except ValueError as error:
            self._fail(target, f"{shown} answered something that is not JSON: {error}")

    # ---- backend -----------------------------------------------------------------------------

    async def request_resend(self, epoch: int, account: str, company: str) -> dict[str, int]:
        body: relay.ResendRequest = {
            "account": account,
            "company": company,
            "broker": self.broker_name,
            "epoch": epoch,
        }
        reply = await self._call("POST", self.backend, relay.BACKEND_RESEND_PATH, epoch, body)
        streams = reply.get("streams") if isinstance(reply, dict) else None
        if not isinstance(streams, dict):
            self._fail(
                self.backend, f"backend resend reply lacks 'streams': {self._quote(self.backend, reply)}"
            )
        return {str(name): int(seq) for name, seq in streams.items()}

    async def confirm_outbound(self, epoch: int, watermarks: dict[str, int]) -> None:
        body: relay.ConfirmRequest = {"streams": watermarks}
        await self._call("POST", self.backend, relay.BACKEND_CONFIRM_PATH, epoch, body)

    async def deliver_inbound(self, epoch: int, messages: Sequence[RelayMessage]) -> relay.DeliveryReply:
        body = {"messages": messages}
        reply = await self._call("POST", self.backend, relay.BACKEND_INBOUND_PATH, epoch, body)
        return self._delivery_reply(self.backend, reply)

    # ---- cloud -------------------------------------------------------------------------------

    async def cloud_ready(self, epoch: int) -> None:
        await self._call("GET", self.cloud, relay.HEALTH_PATH, epoch, expect_json=False)

    async def forward_outbound(self, epoch: int, messages: Sequence[RelayMessage]) -> relay.DeliveryReply:
        body = {"messages": messages}
        reply = await self._call("POST", self.cloud, relay.CLOUD_OUTBOUND_PATH, epoch, body)
        return self._delivery_reply(self.cloud, reply)

    async def poll_inbound(self, epoch: int, limit: int) -> list[RelayMessage]:
        reply = await self._call("GET", self.cloud, relay.CLOUD_POLL_PATH, epoch, query={"max": str(limit)})
        messages = reply.get("messages") if isinstance(reply, dict) else None
        if not isinstance(messages, list):
            self._fail(self.cloud, f"cloud poll reply lacks 'messages': {self._quote(self.cloud, reply)}")
        try:
            return [(str(m[0]), int(m[1]), str(m[2]), str(m[3])) for m in messages]
        except (TypeError, ValueError, IndexError, KeyError) as error:
            self._fail(
                self.cloud,
                f"cloud poll reply holds a message that is not [stream, seq, msgId, payload]: {error}",
            )

    def _delivery_reply(self, target: RelayTarget, reply: Any) -> relay.DeliveryReply:
        if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
            self._fail(target, f"delivery reply lacks 'results': {self._quote(target, reply)}")
        reasons = reply.get("reasons") or {}
        return {"results": reply["results"], "reasons": reasons if isinstance(reasons, dict) else {}}

    async def confirm_inbound(self, epoch: int, pairs: list[list[object]]) -> None:
        body: relay.InboundConfirmRequest = {"confirmed": pairs}
        await self._call("POST", self.cloud, relay.CLOUD_CONFIRM_PATH, epoch, body)


def _seen_epoch(text: bytes) -> int:
    try:
        return int(relay.loads(text).get("seenEpoch", -1))
    except (ValueError, AttributeError, TypeError):
        return -1
