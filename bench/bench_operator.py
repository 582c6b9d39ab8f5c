"""Operator scale: how many endpoints-mode clusters one operator process heartbeats at 1 Hz.

For each N (500, 1000, 1500, 2000, 2500, 3000 by default) it starts:
- two *heartbeat stand-in* processes that together serve 2*N brokers, each on its
  own loopback address (127.1.x.y, 127.2.x.y) and one port. A stand-in answers
  only ``Heartbeat`` (active flag and epoch kept per address, stale epochs
  refused) with a fixed SOAP reply, over a minimal keep-alive HTTP/1.1 protocol
  (``bench/heartbeat_standin.py``, which says why not aiohttp): real brokers are full
  Python services and 2,000 of them would not fit on this machine. It is a
  benchmark-only stand-in; the engine's integration tests use real brokers;
- one operator process running N real ``ClusterLoop``s (two brokers each, the
  design's default settings: interval 1 s, timeout 1 s, standby probe 10 s) with
  one shared real ``HeartbeatClient`` (zeep messages over one aiohttp session).

After a warm-up, it measures in the operator process over a window: CPU seconds
per heartbeat and per wall second, the p99 heartbeat latency (send to parsed
reply), the achieved heartbeat rate per cluster, and peak RSS. N passes when
p99 < 100 ms, CPU < 1 core, and every cluster's active got >= 0.95 heartbeats/s.

Before the sizes, a run with every cluster unavailable (``--unavailable-clusters``, 1,000
by default, 0 to skip): the stand-ins store each activation's epoch and then refuse it
with ``BACKEND_UNREACHABLE``, as a broker does whose backend and cloud are unreachable.
The operator's shell counts what would be API writes on Kubernetes (epoch
compare-and-swaps, status patches, events) over a window that starts once the engines'
retry backoff has reached its cap (``--unavailable-warmup``, 70 s: the waits
1+2+4+8+16+30 s add up to 61 s), and prints ``operator_unavailable_api_writes_per_s``
(all clusters together) just before the headline.

The operator process uses the collector as the operator's main does
(``broker_operator.garbage_collection``): larger young generations from the start, and
``gc.freeze()`` once its clusters are up (``--default-gc`` to compare with Python's defaults:
at 2,000 clusters, collections then cost ~18% of a core and pause the loop for up to 136 ms).

Each size runs ``--runs`` times (3 by default) and is judged on the medians. The line before
the headline, ``operator_idle_api_writes_per_s``, is what would be API writes (epochs, status
patches, events) per second, all clusters together, at the largest size that passed, while
nothing changes (goal: 0). The last line is the headline ``operator_clusters_at_1hz=N``, the
largest N that passed. Every process it starts is stopped at the end of its round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.heartbeat_standin import TOKEN, address, serve_standin  # noqa: E402  # the root is on the path now

PORT = 18080  # every stand-in address listens on it (--port)
# -- the operator (a separate process) ------------------------------------------


def run_operator(clusters: int, warmup: float, window: float, tuned_gc: bool, port: int) -> None:
    # Every unavailable cluster logs a NoBrokerAvailable warning; the figures are what matters here.
    logging.getLogger("broker_operator").setLevel(logging.ERROR)
    from broker_operator.garbage_collection import freeze_long_lived_objects, tune_collector

    if tuned_gc:
        tune_collector()  # as the operator's main does, before anything else
    from broker_operator.core.status import ClusterStatus
    from broker_operator.engine import (
        BrokerTarget,
        ClusterLoop,
        HeartbeatClient,
        HeartbeatReply,
        HeartbeatSettings,
        PodFacts,
    )

    writes = {"epochs": 0, "statuses": 0, "events": 0}  # counted while Shell.counting

    class Shell:
        """Epochs in memory; counts the calls that are API writes on Kubernetes (see controller/shell.py)."""

        counting = False

        def __init__(self) -> None:
            self.epoch = 0

        def count(self, kind: str) -> None:
            if Shell.counting:
                writes[kind] += 1

        async def allocate_epoch(self, current: int, epoch: int) -> int:
            self.count("epochs")  # a read and a conditional status patch
            self.epoch = max(self.epoch + 1, epoch)
            return self.epoch

        async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
            return None  # endpoints mode: no -active Service

        async def record_status(self, status: ClusterStatus) -> None:
            self.count("statuses")

        async def record_event(self, reason: str, message: str, warning: bool) -> None:
            self.count("events")

        def pod_facts(self) -> Mapping[str, PodFacts]:
            return {}

    class TimedClient(HeartbeatClient):
        recording = False
        latencies: list[float] = []  # noqa: RUF012 - one instance per process
        active_calls = 0

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
            started = time.perf_counter()
            try:
                return await super().heartbeat(
                    target,
                    active,
                    epoch,
                    renew=renew,
                    lease_seconds=lease_seconds,
                    limit_seconds=limit_seconds,
                )
            finally:
                if self.recording:
                    self.latencies.append(time.perf_counter() - started)
                    self.active_calls += int(active)

    async def main() -> None:
        settings = HeartbeatSettings()  # the design's defaults
        client = TimedClient(TOKEN, "bench-operator", settings.timeout_seconds)
        loops = [
            ClusterLoop(
                f"c{i}",
                [
                    BrokerTarget("a", f"http://{address(1, i)}:{port}/soap", 0),
                    BrokerTarget("b", f"http://{address(2, i)}:{port}/soap", 1),
                ],
                settings,
                Shell(),
                client,
            )
            for i in range(clusters)
        ]
        tasks = [asyncio.create_task(loop.run()) for loop in loops]
        # As the operator does once its clusters' engines run: freeze, after a full collection
        # (~100 ms at 2,000 clusters, as in the operator, not part of what is measured).
        await asyncio.sleep(warmup * 0.75)
        if tuned_gc:
            freeze_long_lived_objects()
        await asyncio.sleep(warmup * 0.25)
        collections = [0, 0, 0]
        collecting = {"since": 0.0, "seconds": 0.0}

        def count_collection(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                collecting["since"] = time.perf_counter()
            else:
                collections[info["generation"]] += 1
                collecting["seconds"] += time.perf_counter() - collecting["since"]

        gc.callbacks.append(count_collection)
        actives = sum(1 for loop in loops if loop.status.active is not None)
        cpu_start = time.process_time()
        wall_start = time.perf_counter()
        client.recording = Shell.counting = True
        await asyncio.sleep(window)
        client.recording = Shell.counting = False
        gc.callbacks.remove(count_collection)
        cpu = time.process_time() - cpu_start
        wall = time.perf_counter() - wall_start
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        latencies = sorted(client.latencies)
        p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("inf")
        report = {
            "clusters": clusters,
            "actives": actives,
            "heartbeats": len(latencies),
            "active_rate_per_cluster": client.active_calls / wall / clusters,
            "cpu_cores": cpu / wall,
            "cpu_ms_per_heartbeat": 1000 * cpu / max(1, len(latencies)),
            "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1000 * p99,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "writes_per_s": sum(writes.values()) / wall,
            **{f"{kind}_per_s": count / wall for kind, count in writes.items()},
            "unavailable": sum(1 for loop in loops if loop.status.phase == "Unavailable"),
            "gc_collections": collections,
            "gc_cores": collecting["seconds"] / wall,
        }
        print(json.dumps(report), flush=True)

    asyncio.run(main())


# -- the driver --------------------------------------------------------------------


def describe(report: Mapping[str, Any]) -> str:
    young, middle, full = report["gc_collections"]
    return (
        f"actives={report['actives']} rate={report['active_rate_per_cluster']:.2f}/s"
        f" heartbeats={report['heartbeats']} p50={report['p50_ms']:.1f}ms p99={report['p99_ms']:.1f}ms"
        f" cpu={report['cpu_cores']:.2f} cores ({report['cpu_ms_per_heartbeat']:.3f} ms/heartbeat)"
        f" gc={report['gc_cores']:.3f} cores ({young}/{middle}/{full} collections)"
        f" writes={report['writes_per_s']:.1f}/s rss={report['rss_mb']:.0f}MB"
    )


def median_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs (the collection counts: the run with the median p99's)."""
    median: dict[str, Any] = {}
    for key, value in reports[0].items():
        if isinstance(value, int | float):
            median[key] = statistics.median(report[key] for report in reports)
    by_p99 = sorted(reports, key=lambda report: report["p99_ms"])
    median["gc_collections"] = by_p99[len(by_p99) // 2]["gc_collections"]
    median["actives"] = min(report["actives"] for report in reports)
    return median


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *argv], stdout=subprocess.PIPE, start_new_session=True, cwd=ROOT
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


class DidNotSettleError(Exception):
    """A size whose operator process gave no report in time: a result of the benchmark (that size
    is beyond this machine), never a reason for it to stop without its headline."""


def measure(
    clusters: int,
    warmup: float,
    window: float,
    tuned_gc: bool,
    port: int,
    *,
    unavailable: bool = False,
    settle: float = 120.0,
) -> dict[str, Any]:
    refuse = ["--refuse-activations"] if unavailable else []
    on_port = ["--port", str(port)]
    standins = [start(["--standin", str(group), str(clusters), *refuse, *on_port]) for group in (1, 2)]
    try:
        for standin in standins:
            assert standin.stdout is not None
            line = standin.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"heartbeat stand-in did not start (said {line!r})")
        flags = [] if tuned_gc else ["--default-gc"]
        operator = start(["--operator", str(clusters), str(warmup), str(window), *flags, *on_port])
        try:
            out, _ = operator.communicate(timeout=warmup + window + settle)
        except subprocess.TimeoutExpired:
            raise DidNotSettleError(f"no report within {warmup + window + settle:g} s") from None
        finally:
            stop(operator)
        lines = out.decode().strip().splitlines()
        if not lines:
            raise DidNotSettleError(f"the operator process printed no report (exit {operator.returncode})")
        return json.loads(lines[-1])
    finally:
        for standin in standins:
            stop(standin)


def unavailable_figure(args: argparse.Namespace) -> float | None:
    """API writes per second with every cluster's activations refused; None: skipped, or it did not settle."""
    down = args.unavailable_clusters  # 0: skip this figure
    report: dict[str, Any] | None = None
    if down > 0:
        warmup, window = args.unavailable_warmup, args.unavailable_window
        try:
            report = measure(
                down, warmup, window, args.tuned_gc, args.port, unavailable=True, settle=args.settle_seconds
            )
        except DidNotSettleError as reason:
            print(f"N={down} every activation refused: did not settle ({reason})", flush=True)
    if report is not None:
        print(
            f"N={down} every activation refused (BACKEND_UNREACHABLE): unavailable={report['unavailable']}"
            f" API writes {report['writes_per_s']:.1f}/s = epochs {report['epochs_per_s']:.1f}/s"
            f" + statuses {report['statuses_per_s']:.1f}/s + events {report['events_per_s']:.1f}/s"
            f" ({report['writes_per_s'] / down:.3f}/s per cluster, after {args.unavailable_warmup:g}s,"
            f" over {args.unavailable_window:g}s) cpu={report['cpu_cores']:.2f} cores",
            flush=True,
        )
        return float(report["writes_per_s"])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--standin", nargs=2, type=int, metavar=("GROUP", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--operator", nargs=3, type=float, metavar=("N", "WARMUP", "WINDOW"), help=argparse.SUPPRESS
    )
    parser.add_argument("--sizes", default="500,1000,1500,2000,2500,3000")
    parser.add_argument("--runs", type=int, default=3, help="runs per size; judged on the medians")
    parser.add_argument(
        "--port", type=int, default=PORT, help="the stand-ins' port on each of their 127.1/127.2 addresses"
    )
    parser.add_argument("--warmup", type=float, default=12.0)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--refuse-activations", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--unavailable-clusters", type=int, default=1000, help="0: skip that figure")
    parser.add_argument("--unavailable-warmup", type=float, default=70.0)
    parser.add_argument("--unavailable-window", type=float, default=60.0)
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=120.0,
        help="how long past warmup + window an operator process may take to report; then: did not settle",
    )
    parser.add_argument(
        "--default-gc",
        dest="tuned_gc",
        action="store_false",
        help="Python's default collector settings, not the operator's (broker_operator.garbage_collection)",
    )
    args = parser.parse_args()
    if args.standin:
        group, count = args.standin
        serve_standin(group, count, args.refuse_activations, args.port)
        return 0
    if args.operator:
        run_operator(int(args.operator[0]), args.operator[1], args.operator[2], args.tuned_gc, args.port)
        return 0
    best = 0
    print(
        "settings: interval=1s timeout=1s failureThreshold=2 lease=5s standbyProbe=10s, 2 brokers per cluster"
    )
    unavailable_writes = unavailable_figure(args)
    idle_writes: float | None = None
    for size in (int(s) for s in args.sizes.split(",") if s):
        try:
            reports = [
                measure(size, args.warmup, args.window, args.tuned_gc, args.port, settle=args.settle_seconds)
                for _ in range(args.runs)
            ]
        except DidNotSettleError as reason:
            print(f"N={size}: did not settle ({reason}) -> FAIL", flush=True)
            break
        for run, report in enumerate(reports, 1):
            print(f"N={size} run {run}/{len(reports)}: {describe(report)}", flush=True)
        median = median_report(reports)
        passed = (
            median["p99_ms"] < 100
            and median["cpu_cores"] < 1.0
            and median["active_rate_per_cluster"] >= 0.95
            and median["actives"] == size
        )
        print(
            f"N={size} median of {len(reports)}: {describe(median)} -> {'pass' if passed else 'FAIL'}",
            flush=True,
        )
        if not passed:
            break
        best, idle_writes = size, median["writes_per_s"]
    if unavailable_writes is not None:
        print(f"operator_unavailable_api_writes_per_s={unavailable_writes:.1f}")
    if idle_writes is not None:
        print(f"operator_idle_api_writes_per_s={idle_writes:.1f}")
    print(f"operator_clusters_at_1hz={best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
