"""``make bench-broker`` in small: our broker alone (400 messages), and one round against RabbitMQ
(4,000 messages each side: Debian's rabbitmq-server on loopback, loaded by PerfTest). Each runs
ours twice, over plain HTTP and with TLS on every leg, and RabbitMQ's accept phase over AMQPS too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.support import BenchRun, assert_succeeded, counts, headline, run_bench

pytestmark = pytest.mark.needs("bench")  # rabbitmq-server and PerfTest

STREAMS, PER_STREAM = 4, 100
RABBIT_STREAMS, RABBIT_PER_STREAM = 4, 1000
NUMBER = r"(\d+(?:\.\d+)?)"


def test_bench_broker_smoke() -> None:
    run = run_bench(
        "bench_broker.py",
        *("--streams", str(STREAMS), "--messages-per-stream", str(PER_STREAM), "--lanes", "2"),
        *("--rounds", "1", "--no-rabbitmq"),
        timeout=120,
    )
    assert_succeeded(run)
    assert headline(run, "broker_throughput_msgs_per_s") > 0
    assert_ours_delivered(run, STREAMS * PER_STREAM)
    assert_ours_with_tls(run, STREAMS * PER_STREAM)


def test_bench_broker_against_rabbitmq_smoke() -> None:
    total = RABBIT_STREAMS * RABBIT_PER_STREAM
    run = run_bench(
        "bench_broker.py",
        *("--streams", str(RABBIT_STREAMS), "--messages-per-stream", str(RABBIT_PER_STREAM)),
        *("--lanes", "2", "--rounds", "1"),
        # The first run fetches PerfTest (~1 min); RabbitMQ boots twice (10-30 s each when busy).
        timeout=420,
    )
    assert_succeeded(run)
    ratio = headline(run, "broker_vs_rabbitmq_accept")
    assert ratio > 0, run.explain()
    assert figure(run, r"^round_1 broker_vs_rabbitmq_accept=") == ratio
    assert figure(run, r"^broker_throughput_msgs_per_s=") > 0
    assert_ours_delivered(run, total)
    assert_ours_with_tls(run, total)
    for phase, left in (("accept", total), ("relay", 0), ("accept_tls", total)):
        assert figure(run, rf"^rabbitmq_{phase}_msgs_per_s=") > 0
        assert figure(run, rf"^rabbitmq_{phase}_msgs_per_s=\d+ confirm_p99_ms=") > 0
        assert figure(run, rf"^rabbitmq_{phase}_cpu_us_per_msg beam=") > 0
        line = re.search(
            rf"^rabbitmq_{phase} queued_after=(\d+) \(must be (\d+)\) node=(\S+) listening=(\S+)$",
            run.stdout,
            re.MULTILINE,
        )
        assert line, run.explain()
        assert (int(line[1]), int(line[2])) == (left, left), run.explain()
        addresses = line[4].split(",")
        assert all(a.startswith(("127.0.0.1:", "[::1]:")) for a in addresses), addresses
        assert not processes_naming(line[3]), f"still running after the bench: {processes_naming(line[3])}"
    assert figure(run, r"^rabbitmq_relay_msgs_per_s=\d+ confirm_p99_ms=\S+ consumer_p99_ms=") > 0
    tls_ratio = figure(run, r"^rabbitmq_tls_accept_ratio=")
    assert tls_ratio > 0 and figure(run, r"^round_1 rabbitmq_tls_accept_ratio=") == tls_ratio
    assert figure(run, r"^broker_vs_rabbitmq_tls_accept=") > 0


def assert_ours_with_tls(run: BenchRun, total: int) -> None:
    """The TLS run of ours: on every leg, every message once and in order, and its ratio printed."""
    channels = (
        r"^tls channels bench-broker=https cloud=https backend=https \(the backend's client certificate"
    )
    assert re.search(channels, run.stdout, re.MULTILINE), run.explain()
    cloud = counts(run, r"^tls cloud_taken=(?P<taken>\d+) cloud_duplicates=(?P<duplicates>\d+)$")
    assert cloud == {"taken": total, "duplicates": 0}, run.explain()
    assert counts(run, r"^tls messages lost=(?P<lost>\d+) misordered=(?P<misordered>\d+)") == {
        "lost": 0,
        "misordered": 0,
    }, run.explain()
    ratio = figure(run, r"^broker_tls_accept_ratio=")
    assert ratio > 0 and figure(run, r"^round_1 broker_tls_accept_ratio=") == ratio
    assert figure(run, r"^broker_tls_cpu_per_msg_ratio=") > 0


def assert_ours_delivered(run: BenchRun, total: int) -> None:
    channels = r"^channels bench-broker=http cloud=http backend=http$"
    assert re.search(channels, run.stdout, re.MULTILINE), run.explain()
    cloud = counts(run, r"^cloud_taken=(?P<taken>\d+) cloud_duplicates=(?P<duplicates>\d+)$")
    assert cloud == {"taken": total, "duplicates": 0}, run.explain()
    assert counts(run, r"^messages lost=(?P<lost>\d+) misordered=(?P<misordered>\d+)") == {
        "lost": 0,
        "misordered": 0,
    }, run.explain()


def figure(run: BenchRun, prefix: str) -> float:
    """The number right after ``prefix`` (a regex anchored at a line's start) in stdout."""
    match = re.search(prefix + NUMBER, run.stdout, re.MULTILINE)
    assert match, f"no line matching {prefix!r}\n{run.explain()}"
    return float(match.group(1))


def processes_naming(nodename: str) -> list[str]:
    """Live processes started with ``RABBITMQ_NODENAME=<nodename>`` in their environment: the
    bench gives it to the node's epmd and to the node, whose beam.smp and helpers inherit it."""
    wanted = f"RABBITMQ_NODENAME={nodename}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted in environ.read_bytes().split(b"\0"):
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" ")[:200].decode())
        except OSError:
            continue  # gone meanwhile
    return found
