"""How the operator process uses Python's cyclic garbage collector: larger young generations, and
``gc.freeze()`` once the long-lived objects are there. The operator's main and
bench/bench_operator.py apply the same policy.

Why (measured with bench/bench_operator.py, see docs/benchmarks.md): the operator is one event
loop heartbeating every cluster, and in its steady state it makes no cyclic garbage at all; every
object it makes dies by reference count. With the default thresholds (700, 10, 10), though, the
objects merely alive at an instant (requests in flight, each engine's current state) pass 700 many
times a second, so collections ran ~130 times a second at 2,000 clusters. Each promoted the
engines' states, which live about one heartbeat interval, into the older generations, and full
collections then scanned them again and again: 18% of a core, and pauses of up to 136 ms that
pushed the heartbeat p99 past 500 ms. A young generation of 10,000 was still not enough: after the
start-up burst (every cluster probing and activating at once) the backlog of requests in flight
kept crossing it, the collections kept the backlog, and 2,000 clusters settled in 2 runs of 4.
With 50,000, the steady state triggers no collection at all, 2,000 clusters settled in 6 runs of
6, and garbage (a failure path's exception and traceback, a closed connection) is still collected.
"""

from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "freeze_long_lived_objects", "tune_collector"]

# (young generation, collections of the young before the middle one, of the middle before a full one)
THRESHOLDS = (50_000, 20, 20)


def tune_collector() -> None:
    """Apply ``THRESHOLDS``; call it once, at the start of the operator process."""
    gc.set_threshold(*THRESHOLDS)


def freeze_long_lived_objects() -> None:
    """Move every object alive now out of the cyclic collector's sight (``gc.freeze()``).

    The objects alive after start-up are mostly long-lived ones (modules, kopf's registry, the
    Kubernetes client, the zeep schema, each cluster's engine). A full (gen-2) collection scans
    every tracked object, and bench/bench_operator.py measured those pauses at 60+ ms, which pushed
    the heartbeat p99 at 1,000 clusters from 46 ms to 360-450 ms. Frozen objects are never
    collected, so garbage is collected first and only what is alive is frozen; objects created
    later are collected as usual.
    """
    gc.collect()
    gc.freeze()
