"""What the request bounds of issue 39 item 2 cost per bundle, and how long the worst bodies hold the loop.

``parse_request`` now checks, between the lxml parse and the schema validation, the namespace
prefixes in scope at the Body, the operation against the caller's role, and the bundle's message
count. This measures, in one process with no I/O:

* ``bounded_us`` / ``unbounded_us``: one valid bundle (``--messages`` messages of
  ``--payload-bytes``, the backend simulator's shape) parsed with the server's bounds and with
  none (what the journal's replay passes, and what every request got before), alternated over
  ``--rounds`` rounds of ``--repeat`` parses, best round of each (on a shared machine their
  difference is mostly noise); ``pre_check_alone_us``: the checks alone on the parsed bundle;
* ``worst_*_ms``: the slowest bodies the server still has to parse, each under the limits: the
  largest bundle the contract allows (``BUNDLE_MAX_MESSAGES`` messages), ``BUNDLE_MAX_BYTES`` of
  the smallest messages (refused by the count, after the parse), ``BUNDLE_MAX_BYTES`` of
  namespace declarations on the Envelope (refused before the validation; 20,000 of them took 4 s
  before the bound), and ``BUNDLE_MAX_BYTES`` of empty elements in the Header.

Usage: ``python -m bench.bench_request_bounds [--messages 100] [--payload-bytes 500]``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import timeit
from collections.abc import Callable

from lxml import etree

from broker_contracts.soap import BUNDLE_MAX_BYTES, BUNDLE_MAX_MESSAGES, SOAP_ENV_NAMESPACE
from broker_service.soap_codec import MAX_NAMESPACES_IN_SCOPE, SoapFaultError, _check_bounds, parse_request
from broker_simulators.backend import build_envelope


def bundle(messages: int, payload_bytes: int) -> bytes:
    return build_envelope(
        "acme",
        "1000",
        [(f"orders-{i % 200:04d}", i + 1, f"m-{i}", "x" * payload_bytes) for i in range(messages)],
    )


def bounded(body: bytes) -> None:
    with contextlib.suppress(SoapFaultError):
        parse_request(
            body,
            operations=frozenset({"SendMessages"}),
            max_namespaces=MAX_NAMESPACES_IN_SCOPE,
            max_messages=BUNDLE_MAX_MESSAGES,
        )


def unbounded(body: bytes) -> None:
    parse_request(body)


def check_bounds_once(soap_body: etree._Element) -> None:
    """The pre-check alone, on an already parsed bundle (the private step ``parse_request`` runs)."""
    _check_bounds(
        soap_body,
        soap_body[0],
        "SendMessages",
        operations=frozenset({"SendMessages"}),
        refused=None,
        max_namespaces=MAX_NAMESPACES_IN_SCOPE,
        max_messages=BUNDLE_MAX_MESSAGES,
    )


def best_seconds(parse: Callable[[bytes], None], body: bytes, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        parse(body)
    return (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--payload-bytes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()

    body = bundle(args.messages, args.payload_bytes)
    body_element = etree.fromstring(body).find(f"{{{SOAP_ENV_NAMESPACE}}}Body")
    with_bounds, without = [], []
    for round_ in range(args.rounds):  # alternated, first one then the other, against drift and order
        if round_ % 2:
            without.append(best_seconds(unbounded, body, args.repeat))
            with_bounds.append(best_seconds(bounded, body, args.repeat))
        else:
            with_bounds.append(best_seconds(bounded, body, args.repeat))
            without.append(best_seconds(unbounded, body, args.repeat))
    b, u = min(with_bounds), min(without)
    direct = min(timeit.repeat(lambda: check_bounds_once(body_element), number=2000, repeat=5)) / 2000
    print(
        f"bundle of {args.messages} x {args.payload_bytes} B ({len(body)} bytes): bounded_us={b * 1e6:.1f} "
        f"unbounded_us={u * 1e6:.1f} difference_us={(b - u) * 1e6:.1f} ({(b - u) / u * 100:+.1f}%)"
    )
    print(f"pre_check_alone_us={direct * 1e6:.2f} ({direct / u * 100:.2f}% of the unbounded parse)")

    smallest = bundle(1, 0)
    per_message = len(bundle(2, 0)) - len(smallest)
    count = BUNDLE_MAX_BYTES // per_message
    while len(smallest_messages := bundle(count, 0)) > BUNDLE_MAX_BYTES:
        count = count * 97 // 100
    room = BUNDLE_MAX_BYTES - len(smallest) - 100
    declarations = b" ".join(b'xmlns:n%d="u"' % i for i in range(room // 14))[:room]
    declarations = declarations[: declarations.rfind(b" ")]
    elements = b"<x/>" * (room // 4)
    worst = {
        "largest_valid_bundle": bundle(BUNDLE_MAX_MESSAGES, args.payload_bytes),
        "max_bytes_of_smallest_messages": smallest_messages,
        "max_bytes_of_namespace_declarations": smallest.replace(
            b"<soap:Envelope", b"<soap:Envelope " + declarations, 1
        ),
        "max_bytes_of_empty_header_elements": smallest.replace(
            b"<soap:Body>", b"<soap:Header>" + elements + b"</soap:Header><soap:Body>", 1
        ),
    }
    for name, hostile in worst.items():
        seconds = min(best_seconds(bounded, hostile, 3) for _ in range(3))
        assert len(hostile) <= BUNDLE_MAX_BYTES, (name, len(hostile))
        print(f"worst_{name}_ms={seconds * 1e3:.1f} ({len(hostile)} bytes)")


if __name__ == "__main__":
    main()
