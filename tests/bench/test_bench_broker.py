"""``make bench-broker`` in small: 4 streams of 100 messages through one Active broker."""

from __future__ import annotations

from tests.bench.support import assert_succeeded, counts, headline, run_bench

STREAMS, PER_STREAM = 4, 100


def test_bench_broker_smoke() -> None:
    run = run_bench(
        "bench_broker.py",
        *("--streams", str(STREAMS), "--messages-per-stream", str(PER_STREAM), "--lanes", "2"),
        timeout=120,
    )
    assert_succeeded(run)
    assert headline(run, "broker_throughput_msgs_per_s") > 0
    cloud = counts(run, r"^cloud_taken=(?P<taken>\d+) cloud_duplicates=(?P<duplicates>\d+)$")
    assert cloud == {"taken": STREAMS * PER_STREAM, "duplicates": 0}, run.explain()
    assert counts(run, r"^messages lost=(?P<lost>\d+) misordered=(?P<misordered>\d+)") == {
        "lost": 0,
        "misordered": 0,
    }, run.explain()
