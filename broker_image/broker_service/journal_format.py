"""The journal's bytes on disk (format 2): the file header, the frame, and the scan that tells a torn tail
from damage.

A file is ``FILE_HEADER`` and then frames. A frame is::

    <u32 length><u32 crc32(kind + body)><u32 crc32(the 8 bytes before it)><kind byte><body>

little endian, ``length`` counting kind and body. The third field checks the first two, so a flipped
bit in the length is caught where it is rather than taken for "a frame running past the end" (format 1
had the length outside every CRC: one flipped length byte made recovery cut every fsynced frame after
it as a torn tail, silently). Once a header checks, we know where its frame ends, so we can tell the
two failures apart, as etcd's WAL and Kafka's log recovery do:

* a torn tail: the crash tore the last write. Its frames were never fsynced, so never acknowledged.
  It is a partial header at the end of the file, a frame whose (checked) length runs past the end,
  or a bad frame followed by nothing or by zeros only (a file system that kept the new size but not
  the blocks). Recovery cuts it off.
* damage: a bad frame with anything else after it, a checksummed frame of an unknown kind or with an
  unreadable body, or a torn-looking tail in a file that newer files follow. Recovery refuses
  (:class:`JournalCorruptError`) and names the file, the offset and the frame; it never guesses.

``FILE_HEADER`` carries the format version. A file without it (format 1, written before the header
CRC existed) is refused with :class:`JournalFormatError`, which says what to do: this is pre-1.0 and
reading the old format would keep its flaw. The header opens with four zero bytes on purpose: a
format-1 broker (a rolled-back image) reads them as a zero-length frame with data after it, which
it refuses as damage, instead of taking the whole file for a torn tail.

Errors name where (file, offset, frame number) and what kind of fault, never the bytes: they reach
logs and the heartbeat's ``unavailabilityMessage``, and a body holds business payloads.

Not here: what the records mean (:mod:`broker_service.journal`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

FORMAT_VERSION = 2
FILE_HEADER = b"\x00\x00\x00\x00" + b"bfjrnl" + struct.pack("<H", FORMAT_VERSION)
_HEADER = struct.Struct("<III")
_HEADER_FIELDS = 8  # length and body CRC: what the header CRC covers
HEADER_SIZE = _HEADER.size

KIND_ACCEPTED = b"A"
KIND_BUNDLE = b"B"
KIND_CONFIRMED = b"C"
KIND_HELD = b"H"
KIND_RELEASED = b"R"
KINDS = (KIND_ACCEPTED, KIND_BUNDLE, KIND_CONFIRMED, KIND_HELD, KIND_RELEASED)

# The errors a record's decoder raises on a body that passed its CRC but makes no sense.
_UNREADABLE = (ValueError, TypeError, AttributeError, LookupError)

_START_OVER = (
    "Keep the volume for inspection; this broker will not serve from it. To start over, move the "
    "journal directory aside: on activation the backend resends every message it has not had "
    "confirmed, but the holds and discards recorded in the journal are lost"
)


class JournalError(RuntimeError):
    """The journal cannot be written or read; the broker must not acknowledge anything."""


class JournalCorruptError(JournalError):
    """A damaged record with intact records after it: not a torn tail, so not safe to cut."""


class JournalFormatError(JournalError):
    """A journal file this broker does not read (another format version)."""


def frame(kind: bytes, *parts: bytes) -> bytes:
    """One frame whose body is ``parts`` concatenated; the CRC is chained over them, so the
    (often 60 KB) body is copied once, into the frame, instead of once per concatenation."""
    crc = zlib.crc32(kind)
    length = len(kind)
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    fields = struct.pack("<II", length, crc)
    return b"".join((fields, struct.pack("<I", zlib.crc32(fields)), kind, *parts))


def _only_zeros(data: bytes, start: int) -> bool:
    return not data[start:].strip(b"\x00")


def scan(data: bytes, apply: Callable[[bytes, bytes], None], *, source: str, last_file: bool) -> int:
    """Check the file header, apply every good frame of ``data``; return the length of its good prefix.

    The rest, if any, is a torn tail (only ever in the last file); anything else raises.
    """
    size = len(data)
    if size < len(FILE_HEADER) and FILE_HEADER.startswith(data):
        # Created, then the crash came before the header was whole: nothing was ever in it (the
        # header and the snapshot go out in one write, before any frame is appended). Recovery
        # cuts such a file to empty, and a newer file may follow it if the next crash comes
        # before the rotation deleted it, so this holds in any file, not only the last.
        return 0
    if data[: len(FILE_HEADER)] != FILE_HEADER:
        raise JournalFormatError(
            f"{source} is not a journal of format {FORMAT_VERSION} (its file header is missing): an "
            "older broker wrote it in format 1, which this broker does not read. Let the older broker "
            "drain first (ListHeld empty, everything confirmed to the backend), or move the journal "
            "directory aside: on activation the backend resends every message it has not had confirmed"
        )
    offset, number = len(FILE_HEADER), 0
    while offset < size:
        number += 1
        problem, end, may_be_torn = _check(data, offset)
        if problem is None:
            kind, body = (
                data[offset + HEADER_SIZE : offset + HEADER_SIZE + 1],
                data[offset + HEADER_SIZE + 1 : end],
            )
            try:
                apply(kind, body)
            except _UNREADABLE as error:
                # Only the exception's type: its text may quote the body.
                raise JournalCorruptError(
                    f"{source}: frame {number} at offset {offset} passed its checksums but its "
                    f"{kind.decode('ascii')} record cannot be read ({type(error).__name__}). {_START_OVER}"
                ) from None
            offset = end
            continue
        if may_be_torn and _only_zeros(data, end):
            return _torn(offset, data, source=source, number=number, problem=problem, last_file=last_file)
        raise JournalCorruptError(
            f"{source}: frame {number} at offset {offset} is damaged ({problem}) and {size - end} bytes "
            f"that are not zeros follow it: not a torn write. {_START_OVER}"
        )
    return offset


def _check(data: bytes, offset: int) -> tuple[str | None, int, bool]:
    """``(problem or None, where the frame ends, whether a crash can explain the problem)``."""
    size = len(data)
    if size - offset < HEADER_SIZE:
        return "partial header", size, True
    length, crc, header_crc = _HEADER.unpack_from(data, offset)
    if zlib.crc32(data[offset : offset + _HEADER_FIELDS]) != header_crc:
        # The length cannot be trusted, so the frame's end is unknown: torn only if all after is zeros.
        return "header checksum mismatch", offset + HEADER_SIZE, True
    end = offset + HEADER_SIZE + length
    if end > size:
        return f"a frame of {length} bytes runs past the end of the file", size, True
    payload = data[offset + HEADER_SIZE : end]
    if zlib.crc32(payload) != crc:
        return "body checksum mismatch", end, True
    if payload[:1] not in KINDS:
        # Checksummed whole: written on purpose, by something this broker does not understand.
        return "unknown record kind", end, False
    return None, end, False


def _torn(offset: int, data: bytes, *, source: str, number: int, problem: str, last_file: bool) -> int:
    if not last_file:
        raise JournalCorruptError(
            f"{source}: frame {number} at offset {offset} is incomplete ({problem}) but newer journal "
            f"files follow this one, so it is no torn write. {_START_OVER}"
        )
    return offset
