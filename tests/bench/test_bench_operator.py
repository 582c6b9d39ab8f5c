"""``make bench-operator`` in small: 10 clusters heartbeated at 1 Hz for a second."""

from __future__ import annotations

import re

from broker_simulators.local_processes import free_port
from tests.bench.support import assert_succeeded, counts, headline, run_bench

CLUSTERS = 10


def test_bench_operator_smoke() -> None:
    # One size, no every-cluster-unavailable run (--unavailable-clusters 0): the headline needs
    # neither; a free port, since 18080 may be taken by a full run beside this one.
    run = run_bench(
        "bench_operator.py",
        *("--sizes", str(CLUSTERS), "--runs", "1", "--warmup", "2", "--window", "1"),
        *("--unavailable-clusters", "0"),
        *("--port", str(free_port("127.1.1.1"))),
        timeout=120,
    )
    assert_succeeded(run)
    # The largest size that passed: 0 or CLUSTERS, depending on the p99 this machine gave now.
    assert headline(run, "operator_clusters_at_1hz") in (0, CLUSTERS)
    # Not a timing: every cluster has an active broker once the operator has run for 2 s.
    assert counts(run, rf"^N={CLUSTERS} median of 1: actives=(?P<actives>\d+) ") == {"actives": CLUSTERS}, (
        run.explain()
    )
    # The idle-writes figure is printed for the largest size that passed (its value is a timing
    # here: a cluster activated late in a 1 s window on a loaded machine writes its status then).
    if headline(run, "operator_clusters_at_1hz") == CLUSTERS:
        assert re.search(r"^operator_idle_api_writes_per_s=\d+\.\d$", run.stdout, re.MULTILINE), run.explain()


def test_a_size_that_does_not_settle_is_a_result_and_the_headline_is_printed() -> None:
    """``make bench-operator`` once died on subprocess.TimeoutExpired at 3,000 clusters without its
    headline. No settle time at all: the operator process cannot report within warmup + window
    (its start alone takes longer), so the size does not settle, every time."""
    run = run_bench(
        "bench_operator.py",
        *("--sizes", str(CLUSTERS), "--runs", "1", "--warmup", "1", "--window", "1", "--settle-seconds", "0"),
        *("--unavailable-clusters", "0"),
        *("--port", str(free_port("127.1.1.1"))),
        timeout=120,
    )
    assert_succeeded(run)
    assert re.search(
        rf"^N={CLUSTERS}: did not settle \(no report within 2 s\) -> FAIL$", run.stdout, re.MULTILINE
    ), run.explain()
    assert headline(run, "operator_clusters_at_1hz") == 0
