"""``make bench-failover`` in small: one kill -9 of the active under traffic, through the emulated
``<cluster>-active`` Service (a TCP forwarder), then every message checked at the cloud."""

from __future__ import annotations

import re

from tests.bench.support import assert_succeeded, counts, headline, run_bench


def test_bench_failover_smoke() -> None:
    # One crash round makes the headline (the crash p99); partitions and switchovers are left to
    # the full run, each partition waiting out the 2 s lease.
    run = run_bench("bench_failover.py", "--kills", "1", "--stops", "0", "--switchovers", "0", timeout=180)
    assert_succeeded(run)
    assert headline(run, "failover_p99_ms") >= 0
    assert re.search(r"^kill -9 #1: b\d -> b\d \d+ ms$", run.stdout, re.MULTILINE), run.explain()
    assert counts(run, r"^messages lost=(?P<lost>\d+) misordered=(?P<misordered>\d+)") == {
        "lost": 0,
        "misordered": 0,
    }, run.explain()
