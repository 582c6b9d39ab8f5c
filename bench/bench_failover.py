"""Failover latency under traffic: kill -9, SIGSTOP and planned switchover, with real processes.

Setup: the cloud and backend simulators and three real ``broker-service``
processes on loopback, the failover engine (the real ``ClusterLoop`` and SOAP
client) in this process, and 1,000 msg/s of outbound traffic (10 streams, 10
messages each per 100 ms, produced through the backend simulator's
``/sim/produce``). Failback is ``Manual`` so each measurement ends where the
failover put the active; switchovers are driven through ``preferredActive``.

How the backend finds the active (what is emulated): in Kubernetes the backend
sends to the ``<cluster>-active`` Service, whose endpoints the engine writes
(``point_active``). Here :class:`~bench.service_forwarder.ActiveService`
stands in for that Service as kube-proxy implements it, at layer 4: a TCP
forwarder on one loopback address, in a thread and event loop of its own, and
the backend simulator is given only its URL. Emulated:

- each new connection goes to the broker labelled active when it is accepted,
  and stays pinned to that broker for its life, as kube-proxy's conntrack entry
  pins it to one pod; bytes pass both ways unchanged (the backend's
  ``Authorization`` credential and every other header included);
- the label move re-points new connections at once (no EndpointSlice or
  kube-proxy propagation delay, typically tens of ms); open connections keep
  reaching the old broker, which closes them when it answers ``BROKER_INACTIVE``
  so the backend reconnects to the new active;
- no broker labelled yet, or a connect refused (the active was killed): the
  client's connection is reset at once, as a Service with no ready endpoint
  refuses it; a connection to a frozen broker hangs until the backend's own
  request timeout; a close or reset of either side closes or resets the other.

Not emulated: the client's connect succeeds at the forwarder before the broker's
connect is tried (with a real Service a refusal ends the connect itself; both
are fast failures to the backend), and the ICMP rate limit a pod sees from a
Service without endpoints (``make bench-failover-k8s`` has the real path).

Measured (wall clock, each from a 5 ms poll of the brokers' own
``broker_messages_accepted`` counters, so each figure carries up to ~10 ms of
polling error):
- crash: ``kill -9`` of the active -> first bundle accepted by the new active.
  Container death is reported to the engine the moment the process exits (a
  thread waits on it and calls ``ClusterLoop.wake()``), the way the kubelet
  reports a terminated container; in Kubernetes the watch adds its own delay.
- partition: ``SIGSTOP`` of the active -> first bundle accepted by another
  broker. The engine must wait out the lease (see docs/failover-engine.md), so
  the target is lease + 1,000 ms.
- switchover: last bundle accepted by the old active -> first accepted by the new.
- lost and misordered messages at the cloud, after every message is confirmed.

Each round begins once every broker's counter has been read by a poll sent after the
round was ready to begin: a broker resumed from SIGSTOP reports the bundles it took just
before the freeze only at its first answered poll, and seen inside the next round they
would count as that round's first bundle elsewhere.

Prints the heartbeat settings, what is emulated, and every figure; the last line
is the headline ``failover_p99_ms=N`` (crash failover p99). Stops every process
it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker_operator.core.model import FailbackMode
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import (
    BrokerTarget,
    ClusterLoop,
    HeartbeatClient,
    HeartbeatSettings,
    PodFacts,
)
from broker_simulators.local_processes import (
    DEFAULT_TOKEN,
    ProcessSet,
    RunningProcess,
    free_port,
    loopback_host,
    running,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.service_forwarder import ActiveService  # noqa: E402  # the root is on the path now

LEASE = 2.0
SETTINGS = HeartbeatSettings(
    interval_seconds=0.2,
    timeout_seconds=0.1,
    failure_threshold=2,
    lease_seconds=LEASE,
    standby_probe_seconds=0.5,
    failback=FailbackMode.MANUAL,
    failback_stable_seconds=30.0,
    lease_margin_seconds=0.25,
)
STREAMS = 10
BACKEND_TIMEOUT = 0.25  # the backend simulator's request timeout (its default is 10 s)
TICK = 0.1  # seconds between produce calls
PER_STREAM_PER_TICK = 10  # 10 streams x 10 / 0.1 s = 1,000 msg/s


def http_json(url: str, body: object | None = None, timeout: float = 2.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"{url} answered {error.code}: {error.read()[:500]!r}") from error


def accepted_count(broker: RunningProcess) -> float | None:
    try:
        with urllib.request.urlopen(broker.url + "/metrics", timeout=0.3) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(r"^broker_messages_accepted_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


class BenchShell:
    """The engine's shell for the benchmark: epoch in memory, pod facts from process exit, the label
    moved by re-pointing the :class:`ActiveService`."""

    def __init__(self, brokers: Mapping[str, RunningProcess], service: ActiveService) -> None:
        self.brokers = brokers
        self.service = service
        self.epoch = 0
        self.status: ClusterStatus | None = None
        self.label: str | None = None
        self.label_moved_at = 0.0  # time.monotonic() of the last label move

    async def allocate_epoch(self, current: int, epoch: int) -> int:
        self.epoch = max(self.epoch + 1, epoch)
        return self.epoch

    async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
        self.label = active
        self.label_moved_at = time.monotonic()
        broker = self.brokers[active] if active is not None else None
        self.service.point_to((broker.host, broker.port) if broker is not None else None)

    async def record_status(self, status: ClusterStatus) -> None:
        self.status = status

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        print(f"  event {reason}: {message}", flush=True)

    def pod_facts(self) -> Mapping[str, PodFacts]:
        return {n: PodFacts(exists=True, container_terminated=not p.alive) for n, p in self.brokers.items()}


class AcceptWatch:
    """Polls every broker's accepted counter, one thread per broker; remembers when each last went up.

    One thread each, not one for all: a poll of a frozen (SIGSTOPped) broker hangs until its
    timeout, and must not hold back the polls of the others that the partition figure is read from.
    """

    def __init__(self, brokers: Mapping[str, RunningProcess]) -> None:
        self.brokers = brokers
        self.counts: dict[str, float] = {}
        self.last_increase: dict[str, float] = {}
        self.asked: dict[str, float] = {}  # when the last answered poll was sent, per broker
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._poll, args=(name,), daemon=True, name=f"watch-{name}")
            for name in brokers
        ]
        for thread in self.threads:
            thread.start()

    def _poll(self, name: str) -> None:
        broker = self.brokers[name]
        while not self.stopping.is_set():
            asked = time.monotonic()
            count = accepted_count(broker) if broker.alive else None
            now = time.monotonic()
            with self.lock:
                if count is not None and count > self.counts.get(name, 0.0):
                    self.last_increase[name] = now
                if count is not None:
                    self.counts[name] = count
                    self.asked[name] = asked
            time.sleep(0.005)

    def all_read_since(self, since: float) -> bool:
        """Every broker's counter read by a poll sent after ``since``, so that an increase seen
        later happened later (a broker resumed from SIGSTOP shows its last bundles before the
        freeze only at its first answered poll, which can come after the next round began)."""
        with self.lock:
            return all(self.asked.get(name, 0.0) > since for name in self.brokers)

    def first_increase_after(self, names: set[str], since: float) -> float | None:
        with self.lock:
            times = [self.last_increase[n] for n in names if self.last_increase.get(n, 0.0) > since]
        return min(times) if times else None

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=2)


async def wait_until(check, within: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"benchmark gave up waiting {within}s for: {what}")


def watch_exit(process: RunningProcess, loop: asyncio.AbstractEventLoop, engine: ClusterLoop) -> None:
    """Like the kubelet: report the container's death to the engine the moment it happens."""
    popen = process.popen

    def waiter() -> None:
        popen.wait()
        with contextlib.suppress(RuntimeError):  # the benchmark may be over already
            loop.call_soon_threadsafe(engine.wake)

    threading.Thread(target=waiter, daemon=True).start()


async def produce_traffic(backend: RunningProcess, stop: asyncio.Event, produced: list[int]) -> None:
    """Add PER_STREAM_PER_TICK messages to every stream each TICK; ``produced[0]`` counts per stream."""
    next_tick = time.monotonic()
    while not stop.is_set():
        await asyncio.to_thread(http_json, backend.url + "/sim/produce", {"count": PER_STREAM_PER_TICK})
        produced[0] += PER_STREAM_PER_TICK
        next_tick += TICK
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: no samples"
    return (
        f"{name}: n={len(values)} p50={pct(values, 0.5):.0f}ms p99={pct(values, 0.99):.0f}ms"
        f" max={max(values):.0f}ms mean={statistics.mean(values):.0f}ms"
    )


class FailoverBench:
    """One benchmark run: the processes, the engine, the traffic and the figures."""

    def __init__(self, processes: ProcessSet) -> None:
        self.processes = processes
        self.crash_ms: list[float] = []
        self.partition_ms: list[float] = []
        self.switchover_ms: list[float] = []
        # Where the partition time goes: fault -> label moved (engine: detection, fence,
        # activation) and label moved -> first bundle (the backend finding the Service's new pod).
        self.partition_engine_ms: list[float] = []
        self.partition_backend_ms: list[float] = []
        # What start() got running, undone in reverse by stop(), also after a failure half-way.
        self.cleanup = contextlib.AsyncExitStack()

    async def start(self) -> None:
        processes = self.processes
        self.cloud = processes.start_cloud_simulator()
        hosts = {name: loopback_host() for name in ("b0", "b1", "b2")}
        addresses = {name: (host, free_port(host)) for name, host in hosts.items()}
        service_host = loopback_host()
        self.service = ActiveService(service_host, free_port(service_host))
        self.service.start()
        self.cleanup.callback(self.service.stop)
        self.backend = processes.start_backend_simulator(
            broker_urls=[self.service.url],  # only the Service; the simulator adds /soap
            streams=STREAMS,
            messages_per_stream=0,
            bundle_size=100,
            lanes=4,
            autostart=True,
            # The backend gives up on a silent broker after 0.5 s and retries through the
            # Service; with the simulator's default (10 s) a partition would measure it.
            extra_args=["--request-timeout-seconds", str(BACKEND_TIMEOUT)],
        )
        self.brokers = {
            name: processes.start_broker(
                name=name,
                backend_url=self.backend.url,
                cloud_url=self.cloud.url,
                lease_seconds=LEASE,
                host=host,
                port=port,
            )
            for name, (host, port) in addresses.items()
        }
        self.targets = [BrokerTarget(n, b.soap_url, i) for i, (n, b) in enumerate(self.brokers.items())]
        self.shell = BenchShell(self.brokers, self.service)
        self.client = HeartbeatClient(DEFAULT_TOKEN, "bench-failover", SETTINGS.timeout_seconds)
        self.cleanup.push_async_callback(self.client.close)
        self.engine = ClusterLoop("bench", self.targets, SETTINGS, self.shell, self.client)
        self.loop = asyncio.get_running_loop()
        for process in self.brokers.values():
            watch_exit(process, self.loop, self.engine)
        self.engine_task = asyncio.create_task(self.engine.run())
        self.cleanup.push_async_callback(cancel_and_wait, self.engine_task)
        self.watch = AcceptWatch(self.brokers)
        self.cleanup.callback(self.watch.stop)
        self.stop_traffic = asyncio.Event()
        self.produced = [0]
        self.traffic = asyncio.create_task(produce_traffic(self.backend, self.stop_traffic, self.produced))
        self.cleanup.push_async_callback(self.finish_producing)
        await wait_until(self.healthy, 30, "an active broker and two ready standbys")
        await asyncio.sleep(1.0)

    async def finish_producing(self) -> None:
        """The produce call in flight completes (each is bounded by its timeout), so it is counted."""
        self.stop_traffic.set()
        await asyncio.gather(self.traffic, return_exceptions=True)

    async def stop(self) -> None:
        """Traffic, the pollers, the engine, its client and the Service, in that order."""
        await self.cleanup.aclose()

    def active(self) -> str | None:
        return self.shell.status.active if self.shell.status else None

    def healthy(self) -> bool:
        return self.shell.status is not None and self.shell.status.phase == "Healthy"

    async def first_bundle(self, names: set[str], since: float, what: str) -> float:
        """Milliseconds from ``since`` to the first accepted bundle at one of ``names``."""
        await wait_until(lambda: self.watch.first_increase_after(names, since), 60, what)
        first = self.watch.first_increase_after(names, since)
        assert first is not None
        return (first - since) * 1000

    async def fresh_counts(self) -> None:
        marked = time.monotonic()
        await wait_until(lambda: self.watch.all_read_since(marked), 10, "every broker's counter read afresh")

    async def crash_round(self, number: int) -> None:
        old = self.active()
        assert old is not None
        await self.fresh_counts()
        started = time.monotonic()
        self.brokers[old].kill()
        elapsed = await self.first_bundle(set(self.brokers) - {old}, started, "a bundle at the new active")
        self.crash_ms.append(elapsed)
        # Traffic can reach the new active before the engine has written the status that names it.
        await wait_until(lambda: self.active() not in (None, old), 10, "the status naming the new active")
        print(f"kill -9 #{number}: {old} -> {self.active()} {elapsed:.0f} ms", flush=True)
        await asyncio.to_thread(self.brokers[old].restart)
        watch_exit(self.brokers[old], self.loop, self.engine)
        self.engine.wake()
        await wait_until(self.healthy, 30, "the restarted broker ready again")

    async def partition_round(self, number: int) -> None:
        old = self.active()
        assert old is not None
        await self.fresh_counts()
        started = time.monotonic()
        self.brokers[old].kill(signal.SIGSTOP)
        try:
            elapsed = await self.first_bundle(set(self.brokers) - {old}, started, "traffic at another broker")
        finally:
            self.brokers[old].kill(signal.SIGCONT)
        self.partition_ms.append(elapsed)
        # Traffic can reach the new active before the engine has written the status that names it.
        await wait_until(lambda: self.active() not in (None, old), 10, "the status naming the new active")
        engine_ms = (self.shell.label_moved_at - started) * 1000
        self.partition_engine_ms.append(engine_ms)
        self.partition_backend_ms.append(elapsed - engine_ms)
        print(
            f"SIGSTOP #{number}: {old} -> {self.active()} {elapsed:.0f} ms"
            f" (label moved after {engine_ms:.0f} ms)",
            flush=True,
        )
        await wait_until(self.healthy, 30, "the resumed broker fenced and ready again")

    async def switchover_round(self, number: int) -> None:
        old = self.active()
        assert old is not None
        names = list(self.brokers)
        goal = names[(names.index(old) + 1) % len(names)]
        await asyncio.sleep(0.3)  # let traffic flow at the old active
        await self.fresh_counts()
        started = time.monotonic()
        self.engine.update(self.targets, SETTINGS, preferred_active=goal)
        # Any broker but the old one: when the goal's activation does not succeed (on a busy
        # machine its answer can miss the 0.1 s timeout) the engine activates the next one, and
        # the gap is to that one.
        others = set(self.brokers) - {old}
        await self.first_bundle(
            others, started, f"a bundle at another broker than {old} after the switchover"
        )
        with self.watch.lock:
            first, new = min(
                (self.watch.last_increase.get(n, 0.0), n)
                for n in others
                if self.watch.last_increase.get(n, 0.0) > started
            )
            last_old = min(self.watch.last_increase.get(old, started), first)
        self.switchover_ms.append((first - last_old) * 1000)
        asked = "" if new == goal else f" (preferredActive was {goal})"
        print(f"switchover #{number}: {old} -> {new}{asked} gap {self.switchover_ms[-1]:.0f} ms", flush=True)
        await wait_until(self.healthy, 30, "standbys ready after the switchover")

    async def finish_traffic(self) -> None:
        self.stop_traffic.set()
        await self.traffic  # raises what the producer raised: a failed produce is a failed run

        def all_delivered() -> bool:
            received = http_json(self.cloud.url + "/sim/received")
            return len(received) == STREAMS and all(
                len(seqs) >= self.produced[0] for seqs in received.values()
            )

        await wait_until(all_delivered, 120, "every produced message at the cloud")

    def report(self) -> int:
        received: dict[str, list[int]] = http_json(self.cloud.url + "/sim/received")
        per_stream = self.produced[0]
        lost = sum(len(set(range(1, per_stream + 1)) - set(seqs)) for seqs in received.values())
        lost += per_stream * (STREAMS - len(received))
        misordered = sum(
            sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1) for seqs in received.values()
        )
        print()
        print(
            f"heartbeat settings: interval={SETTINGS.interval_seconds}s timeout={SETTINGS.timeout_seconds}s"
            f" failureThreshold={SETTINGS.failure_threshold} lease={SETTINGS.lease_seconds}s"
            f" (margin {SETTINGS.lease_margin_seconds}s) standbyProbe={SETTINGS.standby_probe_seconds}s"
            " failback=Manual"
        )
        print(
            f"backend simulator: request timeout {BACKEND_TIMEOUT}s, retried at once after a timeout,"
            " backoff 20-250 ms after a fast failure, sending only to an emulated <cluster>-active"
            " Service (a layer-4 TCP forwarder: each connection pinned to the broker labelled active"
            " when it opened, bytes unchanged; new connections follow the label the moment the engine"
            " moves it, no kube-proxy delay; reset at once while no broker is labelled or the"
            " labelled one refuses)"
        )
        rate = STREAMS * PER_STREAM_PER_TICK / TICK
        print(f"traffic: {STREAMS} streams, {rate:.0f} msg/s, {per_stream * STREAMS} messages in all")
        print(
            summary("crash failover (kill -9 -> first bundle at new active)", self.crash_ms),
            "target p99 <= 1000ms",
        )
        print(
            summary("partition failover (SIGSTOP -> first bundle elsewhere)", self.partition_ms),
            f"target p99 <= {LEASE * 1000 + 1000:.0f}ms",
        )
        print(" ", summary("of which SIGSTOP -> label moved (engine)", self.partition_engine_ms))
        print(" ", summary("and label moved -> first bundle (backend)", self.partition_backend_ms))
        print(summary("switchover outbound gap", self.switchover_ms), "target <= 300ms")
        print(f"messages lost={lost} misordered={misordered} (must be 0)")
        headline = pct(self.crash_ms, 0.99) if self.crash_ms else float("nan")
        print(f"failover_p99_ms={headline:.0f}")
        return 0 if lost == 0 and misordered == 0 else 1


async def bench(processes: ProcessSet, kills: int, stops: int, switchovers: int) -> int:
    run = FailoverBench(processes)
    try:
        await run.start()
        for number in range(1, kills + 1):
            await run.crash_round(number)
        for number in range(1, stops + 1):
            await run.partition_round(number)
        for number in range(1, switchovers + 1):
            await run.switchover_round(number)
        await run.finish_traffic()
    finally:
        await run.stop()
    return run.report()


def main() -> int:
    global BACKEND_TIMEOUT  # noqa: PLW0603 - one setting, printed and used by the whole run
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--switchovers", type=int, default=20)
    parser.add_argument(
        "--backend-timeout",
        type=float,
        default=BACKEND_TIMEOUT,
        help="the backend simulator's request timeout: after the label moves, a request hung on"
        " the frozen broker keeps the backend away from the new active for up to this long",
    )
    args = parser.parse_args()
    BACKEND_TIMEOUT = args.backend_timeout
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as root, running(Path(root)) as processes:
        return asyncio.run(bench(processes, args.kills, args.stops, args.switchovers))


if __name__ == "__main__":
    sys.exit(main())
