"""SPDY/3.1 framing, as much as the kubelet's server side of ``portforward.k8s.io`` needs.

The API server reaches a kubelet's ``/portForward`` over an HTTP upgrade to ``SPDY/3.1``
(Kubernetes' ``httpstream/spdy`` on ``github.com/moby/spdystream``); kubectl's WebSocket is
translated to that by the API server (feature gate ``PortForwardWebsockets``, on since 1.31), so
SPDY is all a kubelet ever sees. This module turns bytes into frames and back; what the frames
mean for port forwarding is ``port_forward``.

The wire format (SPDY/3 draft, section 2.2; 3.1 adds only flow control): a control frame is
``1 | version(15) | type(16) | flags(8) | length(24) | payload``, a data frame
``0 | stream-id(31) | flags(8) | length(24) | payload``. Name/value header blocks (SYN_STREAM,
SYN_REPLY, HEADERS) are ``count(32)`` then ``len(32) name len(32) value`` pairs, compressed with
zlib using the draft's fixed dictionary, one compression context per direction for the whole
connection, each block ending in a sync flush.

Why written here, not imported: no maintained SPDY library exists on PyPI (``spdy-py`` is one
untyped 2021 release, LGPL; ``python-spdylay`` binds a C library last released in 2012), and the
subset needed is this file.

What it does not do: flow control. spdystream neither sends nor honours WINDOW_UPDATE, so
neither does this; SETTINGS and WINDOW_UPDATE frames are parsed only to be ignored. No server
push, no priorities, no SPDY/2.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

VERSION: Final = 3
FLAG_FIN: Final = 0x01
MAX_LENGTH: Final = 0xFFFFFF  # 24-bit length field
HEADER_LENGTH: Final = 8


class FrameType(IntEnum):
    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    NOOP = 5  # SPDY/2 only; tolerated
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    CANCEL = 5  # what spdystream's Stream.Reset() sends
    INTERNAL_ERROR = 6


# The SPDY/3 header dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1): these words, each
# prefixed with its 32-bit length, then the tail as it is. Its zlib id (adler32) is 0xE3C6A7C2,
# which a peer checks; tests pin it.
# fmt: off
_DICTIONARY_WORDS: Final = (
    "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
    "accept-encoding", "accept-language", "accept-ranges", "age", "allow", "authorization",
    "cache-control", "connection", "content-base", "content-encoding", "content-language",
    "content-length", "content-location", "content-md5", "content-range", "content-type", "date",
    "etag", "expect", "expires", "from", "host", "if-match", "if-modified-since", "if-none-match",
    "if-range", "if-unmodified-since", "last-modified", "location", "max-forwards", "pragma",
    "proxy-authenticate", "proxy-authorization", "range", "referer", "retry-after", "server", "te",
    "trailer", "transfer-encoding", "upgrade", "user-agent", "vary", "via", "warning",
    "www-authenticate", "method", "get", "status", "200 OK", "version", "HTTP/1.1", "url", "public",
    "set-cookie", "keep-alive", "origin",
)
# fmt: on
_DICTIONARY_TAIL: Final = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 "
    "Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 "
    "Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, "
    "Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,"
    "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch"
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)


def _dictionary() -> bytes:
    encoded = b"".join(struct.pack(">I", len(word)) + word.encode() for word in _DICTIONARY_WORDS)
    return encoded + _DICTIONARY_TAIL.encode()


HEADER_DICTIONARY: Final = _dictionary()


class SpdyProtocolError(Exception):
    """The peer sent something that is not SPDY/3 as this module reads it; the session ends."""


@dataclass(frozen=True)
class ControlFrame:
    type: int
    flags: int
    payload: bytes


@dataclass(frozen=True)
class DataFrame:
    stream_id: int
    flags: int
    payload: bytes

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


Frame = ControlFrame | DataFrame


@dataclass
class FrameReader:
    """Splits a byte stream into frames; ``feed`` bytes as they arrive, take complete frames."""

    buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames: list[Frame] = []
        while len(self.buffer) >= HEADER_LENGTH:
            first, flags_length = struct.unpack_from(">II", self.buffer)
            length = flags_length & MAX_LENGTH
            if len(self.buffer) < HEADER_LENGTH + length:
                break
            payload = bytes(self.buffer[HEADER_LENGTH : HEADER_LENGTH + length])
            del self.buffer[: HEADER_LENGTH + length]
            flags = flags_length >> 24
            if first & 0x80000000:
                version = (first >> 16) & 0x7FFF
                if version != VERSION:
                    raise SpdyProtocolError(f"SPDY version {version} frame; only version {VERSION} is spoken")
                frames.append(ControlFrame(first & 0xFFFF, flags, payload))
            else:
                frames.append(DataFrame(first & 0x7FFFFFFF, flags, payload))
        return frames


class HeaderCodec:
    """One connection's header compression: a zlib context per direction, as SPDY/3 requires."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(zdict=HEADER_DICTIONARY)
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, HEADER_DICTIONARY)

    def decode(self, block: bytes) -> dict[str, list[str]]:
        """Header names lowercased (SPDY/3 requires it; spdystream lowercases on write too)."""
        try:
            raw = self._inflate.decompress(block)
        except zlib.error as error:
            raise SpdyProtocolError(f"header block does not decompress: {error}") from error
        try:
            (count,) = struct.unpack_from(">I", raw)
            offset, headers = 4, dict[str, list[str]]()
            for _ in range(count):
                (name_length,) = struct.unpack_from(">I", raw, offset)
                name = raw[offset + 4 : offset + 4 + name_length].decode("latin-1").lower()
                offset += 4 + name_length
                (value_length,) = struct.unpack_from(">I", raw, offset)
                value = raw[offset + 4 : offset + 4 + value_length].decode("latin-1")
                offset += 4 + value_length
                headers.setdefault(name, []).extend(value.split("\x00"))
        except struct.error as error:
            raise SpdyProtocolError(f"header block truncated: {error}") from error
        return headers

    def encode(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for name, value in headers.items():
            for part in (name.lower().encode("latin-1"), value.encode("latin-1")):
                raw += struct.pack(">I", len(part)) + part
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)


def control_frame(frame_type: FrameType, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_LENGTH:
        raise ValueError(f"control frame payload of {len(payload)} bytes exceeds {MAX_LENGTH}")
    return struct.pack(">HHI", 0x8000 | VERSION, frame_type, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, payload: bytes, fin: bool = False) -> bytes:
    if len(payload) > MAX_LENGTH:
        raise ValueError(f"data frame payload of {len(payload)} bytes exceeds {MAX_LENGTH}")
    flags = FLAG_FIN if fin else 0
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(payload)) + payload


def syn_stream_fields(payload: bytes) -> tuple[int, bytes]:
    """(stream id, compressed header block) of a SYN_STREAM payload."""
    if len(payload) < 10:
        raise SpdyProtocolError(f"SYN_STREAM payload of {len(payload)} bytes (at least 10 expected)")
    (stream_id,) = struct.unpack_from(">I", payload)
    return stream_id & 0x7FFFFFFF, payload[10:]  # then associated id (4), priority (1), slot (1)


def stream_id_of(payload: bytes) -> int:
    """The stream id that opens a RST_STREAM, SYN_REPLY, HEADERS or WINDOW_UPDATE payload."""
    if len(payload) < 4:
        raise SpdyProtocolError(f"control frame payload of {len(payload)} bytes has no stream id")
    return int(struct.unpack_from(">I", payload)[0]) & 0x7FFFFFFF


def syn_reply(stream_id: int, header_block: bytes) -> bytes:
    return control_frame(FrameType.SYN_REPLY, struct.pack(">I", stream_id) + header_block)


def rst_stream(stream_id: int, status: RstStatus) -> bytes:
    return control_frame(FrameType.RST_STREAM, struct.pack(">II", stream_id, status))


def goaway(last_good_stream_id: int) -> bytes:
    return control_frame(FrameType.GOAWAY, struct.pack(">II", last_good_stream_id, 0))
