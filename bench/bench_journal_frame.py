"""What the journal's format-2 frame header costs on the hot path, against format 1's.

Format 2 (issue 39) adds a CRC over the length and the body's CRC, so a damaged length is caught
instead of being taken for a torn tail. On the hot path that is one ``crc32`` over 8 bytes and one
more ``struct.pack`` per frame; the body's CRC, which both formats compute, dominates. This times
:func:`broker_service.journal.bundle_frame` on a bundle-sized body (100 messages, about 60 KB) and
format 1's framing of the same parts, alternated, and prints the medians. A figure for docs, not a
test: nothing here asserts a time.

    .venv/bin/python bench/bench_journal_frame.py [--body-bytes 60000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import timeit
import zlib

from broker_contracts.relay import dumps
from broker_service.journal import bundle_frame


def format_1_bundle_frame(soap_body: bytes, accepted: list[int]) -> bytes:
    """Format 1's frame, as journal.py wrote it before issue 39: the length outside every CRC."""
    parts = (dumps(accepted), b"\n", soap_body)
    crc = zlib.crc32(b"B")
    length = 1
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return b"".join((struct.pack("<II", length, crc), b"B", *parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-bytes", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    body = (b"<t:message>payload</t:message>" * (args.body_bytes // 30 + 1))[: args.body_bytes]
    accepted = list(range(100))
    calls = 2000
    new, old = [], []
    for _ in range(args.rounds):
        new.append(timeit.timeit(lambda: bundle_frame(body, accepted), number=calls) / calls * 1e6)
        old.append(timeit.timeit(lambda: format_1_bundle_frame(body, accepted), number=calls) / calls * 1e6)
    new_median, old_median = statistics.median(new), statistics.median(old)
    print(f"frame of a {args.body_bytes}-byte bundle, median of {args.rounds} rounds of {calls} calls:")
    change = new_median - old_median
    print(f"  format 1: {old_median:.2f} us   format 2: {new_median:.2f} us   ({change:+.2f} us)")
    print(f"  per message of a 100-message bundle: {change / 100 * 1000:+.1f} ns")


if __name__ == "__main__":
    main()
