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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from broker_contracts import relay

RelayMessage = tuple[str, int, str, str]
"""``(stream, seq, msgId, payload)``; JSON encodes it as the contract's wire array."""


class RelayError(Exception):
    pass


class StaleEpochError(RelayError):
    def __init__(self, target: str, epoch: int, seen: int) -> None:
        super().__init__(
            f"{target} refused epoch {epoch}: it has seen epoch {seen}; another broker is active"
        )
        self.seen = seen


class TargetUnreachableError(RelayError):
    pass


class RelayClient:
    def __init__(self, *, backend_url: str, cloud_url: str, broker_name: str, timeout_seconds: float) -> None:
        self.backend_url = backend_url
        self.cloud_url = cloud_url
        self.broker_name = broker_name
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=32, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, epoch: int) -> dict[str, str]:
        return {
            relay.EPOCH_HEADER: str(epoch),
            relay.BROKER_HEADER: self.broker_name,
            "Content-Type": "application/json",
        }

    async def _call(
        self, method: str, url: str, epoch: int, body: object | None = None, *, expect_json: bool = True
    ) -> Any:
        if self._session is None:
            raise TargetUnreachableError(f"relay client is closed; cannot call {url}")
        if not url.startswith(("http://", "https://")):
            raise TargetUnreachableError(
                f"target URL {url!r} is not configured (--backend-url / --cloud-url)"
            )
        data = relay.dumps(body) if body is not None else None
        try:
            async with self._session.request(
                method, url, data=data, headers=self._headers(epoch)
            ) as response:
                text = await response.read()
                if response.status == relay.STALE_EPOCH_STATUS:
                    seen = _seen_epoch(text)
                    raise StaleEpochError(url, epoch, seen)
                if response.status >= 300:
                    raise TargetUnreachableError(
                        f"{method} {url} answered HTTP {response.status}: {text[:200]!r}"
                    )
                return relay.loads(text) if text and expect_json else None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise TargetUnreachableError(
                f"{method} {url} failed: {error.__class__.__name__}: {error}"
            ) from None
        except ValueError as error:
            raise TargetUnreachableError(
                f"{method} {url} answered something that is not JSON: {error}"
            ) from None

    # ---- backend -----------------------------------------------------------------------------

    async def request_resend(self, epoch: int, account: str, company: str) -> dict[str, int]:
        body: relay.ResendRequest = {
            "account": account,
            "company": company,
            "broker": self.broker_name,
            "epoch": epoch,
        }
        reply = await self._call("POST", self.backend_url + relay.BACKEND_RESEND_PATH, epoch, body)
        streams = reply.get("streams") if isinstance(reply, dict) else None
        if not isinstance(streams, dict):
            raise TargetUnreachableError(f"backend resend reply lacks 'streams': {reply!r:.200}")
        return {str(name): int(seq) for name, seq in streams.items()}

    async def confirm_outbound(self, epoch: int, watermarks: dict[str, int]) -> None:
        body: relay.ConfirmRequest = {"streams": watermarks}
        await self._call("POST", self.backend_url + relay.BACKEND_CONFIRM_PATH, epoch, body)

    async def deliver_inbound(self, epoch: int, messages: Sequence[RelayMessage]) -> relay.DeliveryReply:
        body = {"messages": messages}
        return _delivery_reply(
            await self._call("POST", self.backend_url + relay.BACKEND_INBOUND_PATH, epoch, body)
        )

    # ---- cloud -------------------------------------------------------------------------------

    async def cloud_ready(self, epoch: int) -> None:
        await self._call("GET", self.cloud_url + relay.HEALTH_PATH, epoch, expect_json=False)

    async def forward_outbound(self, epoch: int, messages: Sequence[RelayMessage]) -> relay.DeliveryReply:
        body = {"messages": messages}
        return _delivery_reply(
            await self._call("POST", self.cloud_url + relay.CLOUD_OUTBOUND_PATH, epoch, body)
        )

    async def poll_inbound(self, epoch: int, limit: int) -> list[RelayMessage]:
        reply = await self._call("GET", f"{self.cloud_url}{relay.CLOUD_POLL_PATH}?max={limit}", epoch)
        messages = reply.get("messages") if isinstance(reply, dict) else None
        if not isinstance(messages, list):
            raise TargetUnreachableError(f"cloud poll reply lacks 'messages': {reply!r:.200}")
        try:
            return [(str(m[0]), int(m[1]), str(m[2]), str(m[3])) for m in messages]
        except (TypeError, ValueError, IndexError, KeyError) as error:
            raise TargetUnreachableError(
                f"cloud poll reply holds a message that is not [stream, seq, msgId, payload]: {error}"
            ) from None

    async def confirm_inbound(self, epoch: int, pairs: list[list[object]]) -> None:
        body: relay.InboundConfirmRequest = {"confirmed": pairs}
        await self._call("POST", self.cloud_url + relay.CLOUD_CONFIRM_PATH, epoch, body)


def _seen_epoch(text: bytes) -> int:
    try:
        return int(relay.loads(text).get("seenEpoch", -1))
    except (ValueError, AttributeError, TypeError):
        return -1


def _delivery_reply(reply: Any) -> relay.DeliveryReply:
    if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
        raise TargetUnreachableError(f"delivery reply lacks 'results': {reply!r:.200}")
    reasons = reply.get("reasons") or {}
    return {"results": reply["results"], "reasons": reasons if isinstance(reasons, dict) else {}}
