"""The operator's SOAP client for the broker's ``Heartbeat`` operation.

zeep builds each request envelope and parses each reply (including SOAP faults and the WSDL's
types; ``heartbeat_soap``, both cached), while the bytes travel over one shared aiohttp session.
That split is deliberate: zeep's own AsyncClient over httpx collapsed beyond ~200 brokers in our
measurements, while zeep's messages over one aiohttp session kept 1,000 brokers at 1 Hz.

Every failure becomes a :class:`HeartbeatError` whose ``reached`` says whether the
request may have been received: only a failed connect proves it was not, and the
engine relies on that to decide whether an ``active=true`` call could have
renewed a broker's lease.

Token rotation: the client holds the cluster's current operator token and the one it
replaced (``update_token``), and remembers per broker which one that broker last took. A
heartbeat refused with ``UNAUTHENTICATED`` is sent again with the other token, and if both are
refused the client re-reads the token (``refresh_token``: the Secret, at most once a second)
and tries the new value. Re-sending is safe because a broker checks the credential before it
reads the body, so a refused call changed nothing. That is the client's only retry: a Secret
update reaches the operator and each broker pod at different instants, and a heartbeat must
not fail (and count towards a failover) because of the order; see docs/operator.md.

TLS (``tls=``, a :class:`~broker_operator.tls_client.TlsClient`): a target whose URL is
``https`` is called with the client's current context (TLS 1.2 at least, the operator's client
certificate, the trust bundle alone) and verified as ``BrokerTarget.tls_server_name``, the pod's
DNS name, while the request dials its IP; ``http`` targets are called exactly as without TLS.
Heartbeats ride on keep-alive connections (a full mutual-TLS handshake costs ~20 heartbeats' CPU);
the ``TlsClient`` makes a fresh context every few minutes and on every rotation, and aiohttp's
pool, keyed by the context, then opens new connections: a fresh handshake now and then, so that a
broken listener or an expired certificate cannot hide behind an old connection. Each handshake
records the serial the broker served (``served_serials``), and each reply over TLS the version of
the CA bundle the broker's admin port trusts now, from its ``X-Broker-Trust-Bundle`` header
(``loaded_bundles``; ``broker_contracts.tls.bundle``): a CA key replacement waits on both.

A failure in TLS (a certificate that does not verify; a handshake the broker refuses) is
``HeartbeatError.tls_error``, with a reason that names the problem and the server name, logged
once per broker and problem (``tls_problems``). The engine does not count it toward a failover:
a certificate error is no proof of death, and the next broker shares the PKI. A refused client
certificate looks like a crash on the wire (a reset in the handshake, or a close right after
it, with no alert the client can read), so a reset or close before any reply from an ``https``
broker is checked with up to two new connections that send nothing (``tls_refusal.py``): taken
by TCP and cut by TLS means a live broker refusing the certificate; a refused port means a dead
one, classified as without TLS.

This module does not decide anything and does not retry otherwise; the engine does both.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from yarl import URL

from broker_contracts.redact import redact, redact_url
from broker_contracts.soap import AUTH_HEADER, AUTH_SCHEME, NAMESPACE, FaultCode
from broker_contracts.tls.bundle import TRUST_BUNDLE_HEADER, is_version
from broker_operator import tls_refusal
from broker_operator.core.model import BrokerTarget, HeartbeatReply
from broker_operator.heartbeat_soap import MAX_REPLY_BYTES, HeartbeatSoap, ReplyError
from broker_operator.tls_client import TlsClient

__all__ = ["HeartbeatClient", "HeartbeatError", "HeartbeatReply"]

_SOAP_ACTION = f"{NAMESPACE}/Heartbeat"
_REPLY_CACHE_SIZE = 8192  # brokers (URLs, names) remembered; cleared when full
_REFRESH_MIN_SECONDS = 1.0  # a broker refusing every token re-reads the Secret at most this often
_PEER_CLOSED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})
logger = logging.getLogger(__name__)
TokenReader = Callable[[], Awaitable[str | None]]


class HeartbeatError(Exception):
    """A heartbeat that got no usable answer. ``reached`` is False only if it surely never arrived."""

    def __init__(
        self,
        target: BrokerTarget,
        reason: str,
        *,
        reached: bool,
        code: str | None = None,
        peer_closed: bool = False,
        timed_out: bool = False,
        tls_error: bool = False,
    ) -> None:
        # The URL as shown (an endpoint's may carry userinfo); ``reason`` comes redacted from the client.
        super().__init__(f"heartbeat to {target.name} at {redact_url(target.url)}: {reason}")
        self.target = target
        self.reason = reason
        self.reached = reached
        self.code = code  # the SOAP fault's code, when the broker answered with one
        # The connection was closed or reset by the peer before any reply: whatever process got
        # the request is gone or never read it (a live broker answers; it does not reset).
        self.peer_closed = peer_closed
        self.timed_out = timed_out  # no reply within the limit (the engine asks whose delay that was)
        # TLS failed between the operator and this broker: its certificate did not verify (chain,
        # name, expiry), or it refused the operator's (proven by a second handshake, see
        # tls_refusal.tls_refused). Proof of nothing about the broker's health, and never a
        # reason to fail over: the brokers share the PKI, so the next one would fail the same way.
        self.tls_error = tls_error


@functools.lru_cache(maxsize=_REPLY_CACHE_SIZE)  # pods come and go with new addresses
def _parsed_url(url: str) -> URL:
    # Parsed once per broker: aiohttp parses a str URL on every request, and at 2,000
    # clusters that was 5% of the operator's CPU (docs/benchmarks.md). Without userinfo: the
    # operator authenticates with its token, and aiohttp refuses a URL's credentials beside an
    # Authorization header (a ValueError that no heartbeat survived).
    return URL(url).with_user(None)


@functools.lru_cache(maxsize=64)
def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
    # The engine passes its timeout with every heartbeat; one object per value, not per call.
    return aiohttp.ClientTimeout(total=seconds)


class HeartbeatClient:
    """Sends ``Heartbeat(active, epoch, operatorId)`` to brokers with one operator token (and the
    one it replaced); one instance per cluster. ``refresh`` re-reads the token (its Secret)."""

    def __init__(
        self,
        token: str,
        operator_id: str,
        timeout: float,
        *,
        refresh: TokenReader | None = None,
        tls: TlsClient | None = None,
    ) -> None:
        if not token:
            raise ValueError(
                "HeartbeatClient needs the operator's token (brokers refuse unauthenticated calls)"
            )
        self._token = token
        self._previous_token: str | None = None
        self._taken: dict[str, str] = {}  # broker URL -> the token it last accepted
        self._header_cache: dict[str, dict[str, str]] = {}
        self._refresh = refresh
        self._refresh_lock = asyncio.Lock()
        self._refreshed_at = -_REFRESH_MIN_SECONDS
        self._operator_id = operator_id
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._soap = HeartbeatSoap(operator_id)
        self._session: aiohttp.ClientSession | None = None
        self._tls = tls
        self._server_names: dict[str, str] = {}  # broker name -> the TLS name it was last dialled as
        self._tls_problems: dict[str, str] = {}  # broker name -> its TLS problem (logged once each)
        self._loaded_bundles: dict[str, str] = {}  # broker name -> the trust bundle its last reply named

    @property
    def tls(self) -> TlsClient | None:
        """The client TLS context source (``TlsClient.update`` takes each new material)."""
        return self._tls

    def use_tls(self, tls: TlsClient | None) -> None:
        """Call TLS brokers with ``tls`` from now on: the engine started before the cluster's client
        material was there (spec.tls turned on later). A client that has one keeps it: a new
        material goes to ``tls.update``."""
        if self._tls is None:
            self._tls = tls

    def served_serials(self) -> Mapping[str, str]:
        """Broker name -> the serial (lower-case hex) of the certificate it served in the latest
        handshake with it; brokers not yet called over TLS are absent (``status.tls.served[]``)."""
        if self._tls is None:
            return {}
        served = {name: self._tls.served_serial(server) for name, server in self._server_names.items()}
        return {name: serial for name, serial in served.items() if serial is not None}

    def loaded_bundles(self) -> Mapping[str, str]:
        """Broker name -> the version of the CA bundle its admin port trusted at its latest reply over
        TLS (its ``X-Broker-Trust-Bundle`` header); brokers that never named one are absent."""
        return dict(self._loaded_bundles)

    def presented_certificate(self) -> bytes | None:
        """The client certificate (PEM) new handshakes present; None without TLS material."""
        return None if self._tls is None else self._tls.certificate_pem

    def tls_problems(self) -> Mapping[str, str]:
        """Broker name -> why TLS with it fails now (redacted, for a condition or an event); a
        broker leaves it at its next answered call."""
        return dict(self._tls_problems)

    @property
    def token(self) -> str:
        return self._token

    def update_token(self, token: str) -> bool:
        """Use ``token`` from now on, keeping the current one for brokers that have not seen it yet."""
        if not token or token == self._token:
            return False
        self._previous_token, self._token = self._token, token
        self._taken.clear()  # every broker is offered the new token first
        logger.info("the operator token changed; heartbeats use the new one (the previous one as fallback)")
        return True

    async def refresh_token(self) -> bool:
        """Re-read the token now, unless it was read less than a second ago; True if it changed.

        Concurrent callers (every broker of a cluster refusing at once) share one read.
        """
        if self._refresh is None:
            return False
        async with self._refresh_lock:
            if time.monotonic() - self._refreshed_at < _REFRESH_MIN_SECONDS:
                return False
            self._refreshed_at = time.monotonic()
            try:
                token = await self._refresh()
            except Exception as error:  # an unreadable Secret must not stop the heartbeats
                logger.warning(
                    "re-reading the operator token failed (%s); keeping the current one",
                    self._redact(str(error)),
                )
                return False
            return self.update_token(token or "")

    def _redact(self, text: str) -> str:
        """Text from or about a broker, as it may be shown: this is where a broker's words enter
        the operator's status, events and logs, so no token or URL credential gets past here."""
        return redact(text, [t for t in (self._token, self._previous_token) if t])

    def _headers(self, token: str) -> dict[str, str]:
        headers = self._header_cache.get(token)
        if headers is None:
            if len(self._header_cache) >= 2:
                self._header_cache.clear()  # only the current and the previous token are ever sent
            headers = self._header_cache[token] = {
                "Content-Type": 'text/xml; charset="utf-8"',
                "SOAPAction": f'"{_SOAP_ACTION}"',
                AUTH_HEADER: f"{AUTH_SCHEME} {token}",
            }
        return headers

    def watch_token(self, url: str) -> str:
        """The token to open a broker's ``/watch`` with (``broker_watch``): the one the broker at
        ``url`` last took, else the current one."""
        return self._taken.get(url) or self._token

    def _tokens_to_offer(self, url: str) -> list[str]:
        """The token this broker last took first, then the current one, then the previous one."""
        ordered = [self._taken.get(url), self._token, self._previous_token]
        return list(dict.fromkeys(t for t in ordered if t))

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No per-host limit: one cluster's brokers must not queue behind another's.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _envelope(self, active: bool, epoch: int, renew: bool, lease_seconds: float | None = None) -> bytes:
        return self._soap.envelope(active, epoch, renew, lease_seconds)

    async def heartbeat(
        self,
        target: BrokerTarget,
        active: bool,
        epoch: int,
        *,
        renew: bool = True,
        lease_seconds: float | None = None,
        limit_seconds: float | None = None,
    ) -> HeartbeatReply:
        """``renew=False`` (with ``active=True``) checks the active without renewing its lease;
        ``lease_seconds`` makes a renewal a handover renewal (WSDL ``leaseSeconds``: the lease it
        asks, which the broker honours only for its Active term at its epoch, capped at its
        ``--max-lease-seconds``); ``limit_seconds`` replaces the client's timeout for this call
        (an activation's is longer)."""
        body = self._envelope(active, epoch, renew, lease_seconds)
        limit = self._timeout if limit_seconds is None else _client_timeout(limit_seconds)
        offered: list[str] = []
        refused: HeartbeatError | None = None
        for attempt in range(2):
            if attempt:  # every token we knew was refused: the Secret may hold a newer one
                await self.refresh_token()
            for token in self._tokens_to_offer(target.url):
                if token in offered:
                    continue
                offered.append(token)
                try:
                    reply = await self._send(target, body, token, limit)
                except HeartbeatError as error:
                    if error.code != FaultCode.UNAUTHENTICATED:
                        raise
                    refused = error  # changed nothing on the broker: offer the next token
                    continue
                if len(self._taken) >= _REPLY_CACHE_SIZE:
                    self._taken.clear()  # pods come and go with new addresses
                self._taken[target.url] = token
                return reply
        raise refused or HeartbeatError(target, "no operator token to send", reached=False)

    async def _send(
        self, target: BrokerTarget, body: bytes, token: str, limit: aiohttp.ClientTimeout
    ) -> HeartbeatReply:
        url = _parsed_url(target.url)
        if url.scheme != "https":
            return await self._send_plain(target, url, body, token, limit)
        return await self._send_tls(target, url, body, token, limit)

    async def _send_plain(
        self, target: BrokerTarget, url: URL, body: bytes, token: str, limit: aiohttp.ClientTimeout
    ) -> HeartbeatReply:
        try:
            async with self._session_now().post(
                url, data=body, headers=self._headers(token), timeout=limit
            ) as response:
                content = await response.content.read(MAX_REPLY_BYTES + 1)
                status = response.status
                content_type = response.headers.get("Content-Type", "text/xml")
        except aiohttp.ClientConnectorError as error:
            raise self._connect_failed(target, error) from error
        except TimeoutError as error:
            raise self._timed_out(target, limit) from error
        except aiohttp.ClientError as error:
            raise self._connection_failed(target, error) from error
        return self._reply(target, status, content, content_type)

    async def _send_tls(
        self, target: BrokerTarget, url: URL, body: bytes, token: str, limit: aiohttp.ClientTimeout
    ) -> HeartbeatReply:
        """Over TLS: with the operator's client context and the target's server name, when there is
        a ``tls``; an ``https`` endpoint without one keeps aiohttp's default (the system's trust).
        A reset or close before any reply is checked by :func:`tls_refusal.tls_refused`: under TLS it is also
        how a broker refuses the operator's certificate, which must not count as a crash."""
        started = asyncio.get_running_loop().time()
        context: ssl.SSLContext | None = None
        if self._tls is not None:
            context = self._tls.context()
            if target.tls_server_name is not None:  # for served_serials(): the name each handshake reports
                self._server_names[target.name] = target.tls_server_name
        elif target.tls_server_name is not None:
            raise self._tls_failed(
                target,
                f"{target.name} serves TLS and the operator has no client certificate for it yet"
                " (the certificates controller has not handed one over)",
                reached=False,
            )
        server_name = target.tls_server_name or url.host or ""
        try:
            async with self._session_now().post(
                url,
                data=body,
                headers=self._headers(token),
                timeout=limit,
                ssl=True if context is None else context,
                server_hostname=target.tls_server_name,
            ) as response:
                content = await response.content.read(MAX_REPLY_BYTES + 1)
                status = response.status
                content_type = response.headers.get("Content-Type", "text/xml")
                self._record_bundle(target.name, response.headers.get(TRUST_BUNDLE_HEADER))
        except aiohttp.ClientConnectorCertificateError as error:  # a ClientConnectorError: first
            problem = tls_refusal.verify_message(error.certificate_error)
            raise self._tls_failed(
                target, f"certificate verify failed: {problem} for {server_name}", reached=False
            ) from error
        except aiohttp.ClientConnectorError as error:
            cut = tls_refusal.handshake_cut(error.os_error)
            if not cut and isinstance(error.os_error, ssl.SSLError):
                # An alert or a protocol mismatch (a plain-HTTP listener answers a ClientHello
                # with "wrong version number"): the connection is there, TLS is not.
                reason = f"TLS handshake with {server_name} failed: {tls_refusal.ssl_reason(error.os_error)}"
                raise self._tls_failed(target, reason, reached=False) from error
            if cut and await tls_refusal.tls_refused(url, context, target.tls_server_name, started, limit):
                raise self._tls_failed(
                    target, tls_refusal.refused_reason(server_name), reached=False
                ) from error
            raise self._connect_failed(target, error) from error
        except TimeoutError as error:
            raise self._timed_out(target, limit) from error
        except aiohttp.ClientError as error:
            failed = self._connection_failed(target, error)
            if failed.peer_closed and await tls_refusal.tls_refused(
                url, context, target.tls_server_name, started, limit
            ):
                # TLS 1.3: the client's side of the handshake ends before the broker checks the
                # certificate, so its refusal reads as a close after the request was written.
                raise self._tls_failed(
                    target, tls_refusal.refused_reason(server_name), reached=True
                ) from error
            raise failed from error
        if self._tls_problems.pop(target.name, None) is not None:
            logger.info("heartbeats to %s over TLS work again", target.name)
        return self._reply(target, status, content, content_type)

    def _record_bundle(self, broker: str, version: str | None) -> None:
        """Keep what a broker's reply names as its trusted bundle; a value of another shape is not
        kept (a broker of an older image names none: absent, so nothing waits on a guess)."""
        if not is_version(version):
            self._loaded_bundles.pop(broker, None)
            return
        assert version is not None  # is_version
        if self._loaded_bundles.get(broker) != version:
            if len(self._loaded_bundles) >= _REPLY_CACHE_SIZE and broker not in self._loaded_bundles:
                self._loaded_bundles.clear()  # names come and go with pods; the next replies refill it
            self._loaded_bundles[broker] = version

    def _connect_failed(self, target: BrokerTarget, error: aiohttp.ClientConnectorError) -> HeartbeatError:
        reason = self._redact(f"cannot connect: {error.os_error}")
        return HeartbeatError(target, reason, reached=False)

    def _timed_out(self, target: BrokerTarget, limit: aiohttp.ClientTimeout) -> HeartbeatError:
        return HeartbeatError(target, f"timeout after {limit.total:g}s", reached=True, timed_out=True)

    def _connection_failed(self, target: BrokerTarget, error: aiohttp.ClientError) -> HeartbeatError:
        closed = isinstance(error, aiohttp.ServerDisconnectedError) or (
            isinstance(error, aiohttp.ClientOSError) and error.errno in _PEER_CLOSED_ERRNOS
        )
        return HeartbeatError(
            target, self._redact(f"connection failed: {error!r}"), reached=True, peer_closed=closed
        )

    def _tls_failed(self, target: BrokerTarget, reason: str, *, reached: bool) -> HeartbeatError:
        """A TLS failure with ``target``: logged once per distinct problem, kept for a condition."""
        shown = self._redact(reason)
        if self._tls_problems.get(target.name) != shown:
            if len(self._tls_problems) >= _REPLY_CACHE_SIZE:
                self._tls_problems.clear()
            self._tls_problems[target.name] = shown
            logger.warning(
                "heartbeats to %s fail in TLS: %s. Not counted toward a failover (a certificate "
                "error is no proof of death); fix the certificates",
                target.name,
                shown,
            )
        return HeartbeatError(target, shown, reached=reached, tls_error=True)

    def _reply(self, target: BrokerTarget, status: int, content: bytes, content_type: str) -> HeartbeatReply:
        try:
            return self._soap.reply(status, content, content_type, self._redact)
        except ReplyError as error:
            raise HeartbeatError(target, self._redact(error.reason), reached=True, code=error.code) from None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
            # Let the connector's transports finish closing (aiohttp's documented advice).
            await asyncio.sleep(0)
        self._session = None
