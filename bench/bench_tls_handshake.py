"""CPU per heartbeat on a broker's admin port: a full mutual-TLS handshake each time, or a kept-alive
connection, with plain HTTP for reference.

Why: the operator heartbeats every broker every second (ARCHITECTURE.md), and with TLS on every
channel each heartbeat either reuses a connection or pays for a handshake. DAY2_FACTS.md measured
~4.1 ms of CPU for a new mutual-TLS connection against 0.22 ms over keep-alive, on a stand-in
server; this measures a real broker.

Setup, all real processes on loopback, stopped at the end: one run's PKI
(``local_cluster.run_pki``: one CA, RSA-2048), a cloud and a backend simulator (plain HTTP: the
upstream legs are not what is measured), and two brokers with an admin port each, both Active at
epoch 1: one serving TLS (its admin port requires the operator's client certificate, which this
process presents), one plain. Then, from this process, one after another, ``--handshakes``
Heartbeats (``active=true``, the renewal the operator sends to the active) in each of:

* ``tls_new``: a new connection for each (TCP, a full TLS handshake with client certificates:
  no session resumption, since ``http.client`` offers none), then closed;
* ``tls_keepalive``: ``--keepalive`` Heartbeats on one connection, after one handshake;
* ``http_new`` and ``http_keepalive``: the same to the plain broker.

Each mode's broker CPU comes from ``/proc/<pid>/stat`` (user + system, 10 ms ticks; the counts
are chosen so that a mode uses hundreds of ticks) less what the broker burns idle in the same
wall time (an active broker polls the cloud; its idle rate is measured over ``--idle-seconds``
before the modes); the client's is this process's ``time.process_time``. Printed per mode:
broker and client CPU in ms per heartbeat and the wall time per heartbeat; then the ratios of the
broker's CPU: ``tls_new_vs_http_new_cpu``, ``tls_keepalive_vs_http_keepalive_cpu`` and, last, the
headline ``tls_handshake_vs_keepalive_cpu`` (``tls_new`` over ``tls_keepalive``). A progress
line goes to stderr every few seconds.

Not measured: the operator's own client (zeep over httpx; its CPU is the client's here only in
kind), TLS session resumption, or ECDSA keys.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker_contracts import soap
from broker_simulators.local_processes import DEFAULT_TOKEN, ProcessSet, RunningProcess, free_port, running
from local_cluster.loopback_relay import start_broker
from local_cluster.run_pki import create_local_pki

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.soap_heartbeat import heartbeat_body  # noqa: E402  # the repository root is on the path now

PROGRESS_SECONDS = 3.0
HEADERS = {"Content-Type": "text/xml; charset=utf-8", soap.AUTH_HEADER: f"{soap.AUTH_SCHEME} {DEFAULT_TOKEN}"}
BODY = heartbeat_body(1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--handshakes", type=int, default=1000, help="heartbeats on new connections, per mode"
    )
    parser.add_argument("--keepalive", type=int, default=5000, help="heartbeats on one connection, per mode")
    parser.add_argument(
        "--idle-seconds", type=float, default=3.0, help="window for each broker's idle CPU rate"
    )
    return parser.parse_args()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Target:
    """One broker's admin port, and how to open a connection to it."""

    broker: RunningProcess
    context: ssl.SSLContext | None
    idle_cpu_per_s: float

    def connect(self) -> http.client.HTTPConnection:
        host, port = self.broker.host, self.broker.admin_port
        assert port is not None
        if self.context is None:
            return http.client.HTTPConnection(host, port, timeout=10)
        return http.client.HTTPSConnection(host, port, timeout=10, context=self.context)


def heartbeat(connection: http.client.HTTPConnection) -> None:
    connection.request("POST", soap.SOAP_PATH, body=BODY, headers=HEADERS)
    response = connection.getresponse()
    reply = response.read()
    if response.status != 200 or b"<tns:state>Active</tns:state>" not in reply:
        raise SystemExit(f"heartbeat answered {response.status}: {reply[:300]!r}")


@dataclass(frozen=True)
class Mode:
    name: str
    count: int
    broker_cpu_ms: float  # per heartbeat, the idle rate taken out
    client_cpu_ms: float
    wall_ms: float

    def line(self) -> str:
        return (
            f"{self.name} heartbeats={self.count} broker_cpu_ms_per_heartbeat={self.broker_cpu_ms:.3f} "
            f"client_cpu_ms_per_heartbeat={self.client_cpu_ms:.3f} wall_ms_per_heartbeat={self.wall_ms:.3f}"
        )


def measure(
    name: str, target: Target, count: int, send: Callable[[Target, int, Callable[[int], None]], None]
) -> Mode:
    """Run ``send`` (``count`` heartbeats) and charge the broker's CPU meanwhile, less its idle rate."""
    next_progress = time.monotonic() + PROGRESS_SECONDS

    def tick(done: int) -> None:
        nonlocal next_progress
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_SECONDS
            progress(f"{name}: {done}/{count}")

    broker_before, client_before, began = (
        cpu_seconds(target.broker.pid),
        time.process_time(),
        time.monotonic(),
    )
    send(target, count, tick)
    wall = time.monotonic() - began
    broker = cpu_seconds(target.broker.pid) - broker_before - target.idle_cpu_per_s * wall
    client = time.process_time() - client_before
    return Mode(name, count, broker / count * 1e3, client / count * 1e3, wall / count * 1e3)


def new_connections(target: Target, count: int, tick: Callable[[int], None]) -> None:
    for done in range(count):
        connection = target.connect()
        try:
            heartbeat(connection)
        finally:
            connection.close()
        tick(done + 1)


def one_connection(target: Target, count: int, tick: Callable[[int], None]) -> None:
    connection = target.connect()
    try:
        heartbeat(connection)  # the handshake, outside the count
        for done in range(count):
            heartbeat(connection)
            tick(done + 1)
    finally:
        connection.close()


def idle_rate(broker: RunningProcess, seconds: float) -> float:
    """The broker's CPU seconds per second while nobody calls it (it is Active: it polls the cloud)."""
    before, began = cpu_seconds(broker.pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(broker.pid) - before) / (time.monotonic() - began)


def start_targets(procs: ProcessSet, root: Path, idle_seconds: float) -> tuple[Target, Target]:
    """The TLS broker and the plain one, both Active, each with its idle CPU rate."""
    pki = create_local_pki(root / "pki")
    cloud = procs.start_cloud_simulator(root)
    backend = procs.start_backend_simulator(root, streams=0)
    tls_broker = start_broker(
        procs, root, pki, name="tls-broker", backend_url=backend.url, cloud_url=cloud.url, lease_seconds=600
    )
    plain_broker = procs.start_broker(
        root,
        name="plain-broker",
        host="127.0.0.1",
        admin_port=free_port(),
        backend_url=backend.url,
        cloud_url=cloud.url,
        lease_seconds=600,
    )
    assert tls_broker.caller_tls is not None and tls_broker.admin_url.startswith("https://")
    tls_context = tls_broker.caller_tls.context()
    targets = []
    for broker, context in ((tls_broker, tls_context), (plain_broker, None)):
        first = Target(broker, context, 0.0)
        connection = first.connect()
        try:
            heartbeat(connection)  # activates it (epoch 1)
        finally:
            connection.close()
        progress(
            f"{broker.name}: Active on {broker.admin_url}; measuring its idle CPU for {idle_seconds:.0f} s"
        )
        targets.append(Target(broker, context, idle_rate(broker, idle_seconds)))
    return targets[0], targets[1]


def main() -> int:
    args = parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-tls-handshake-") as scratch,
        running(Path(scratch)) as procs,
    ):
        tls, plain = start_targets(procs, Path(scratch), args.idle_seconds)
        idle = f"tls={tls.idle_cpu_per_s * 1e3:.2f} plain={plain.idle_cpu_per_s * 1e3:.2f}"
        print(f"broker_idle_cpu_ms_per_s {idle} (taken out of each mode below)", flush=True)
        modes = {}
        for name, target, count, send in (
            ("tls_new", tls, args.handshakes, new_connections),
            ("tls_keepalive", tls, args.keepalive, one_connection),
            ("http_new", plain, args.handshakes, new_connections),
            ("http_keepalive", plain, args.keepalive, one_connection),
        ):
            modes[name] = measure(name, target, count, send)
            print(modes[name].line(), flush=True)
    too_few = [mode.name for mode in modes.values() if mode.broker_cpu_ms <= 0 or mode.client_cpu_ms <= 0]
    if too_few:  # a mode shorter than a few clock ticks, or swamped by the idle rate
        raise SystemExit(f"no CPU measured for {too_few}: raise --handshakes and --keepalive")
    cpu = {name: mode.broker_cpu_ms for name, mode in modes.items()}
    client = {name: mode.client_cpu_ms for name, mode in modes.items()}
    print(f"client_tls_handshake_vs_keepalive_cpu={client['tls_new'] / client['tls_keepalive']:.1f}")
    print(f"tls_new_vs_http_new_cpu={cpu['tls_new'] / cpu['http_new']:.2f}")
    print(f"tls_keepalive_vs_http_keepalive_cpu={cpu['tls_keepalive'] / cpu['http_keepalive']:.2f}")
    print(f"tls_handshake_vs_keepalive_cpu={cpu['tls_new'] / cpu['tls_keepalive']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
