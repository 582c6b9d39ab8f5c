"""The RabbitMQ side of ``bench-broker``: our load, put through RabbitMQ by PerfTest.

The mapping from the backend simulator's settings (see docs/benchmarks.md for why):

* one producer (one AMQP connection and channel) per backend lane, so as many connections as
  the backend opens to our broker;
* one durable classic queue per producer: a lane carries its streams in order over one
  connection, and a queue keeps them in that order (PerfTest's messages carry no stream id);
* persistent messages (delivery mode 2) of ``payload_bytes``, publisher confirms with at most
  ``bundle_size`` unconfirmed per producer, as a lane has one bundle in flight;
* *accept*: producers only; every message must then be in the queues (``rabbitmqctl
  list_queues``) or the run counts as failed;
* *relay*: one consumer per queue acking with ``multiple`` every ``bundle_size`` messages,
  prefetch twice that; every queue must be empty at the end.

* *accept over TLS* (``tls``): the accept phase again, PerfTest connecting to the node's AMQPS
  listener with a client certificate (``rabbitmq_tls.py``), for the cost of TLS on their side.

Each phase runs on a node of its own (a fresh data directory, started and stopped here), so
the relay does not start with the accept phase's million messages on disk. The node's CPU is
read from ``/proc/<beam pid>/stat`` around the PerfTest run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bench import perf_test
from bench.rabbitmq_peer import RabbitNode
from bench.rabbitmq_tls import RabbitTls


@dataclass(frozen=True)
class Load:
    lanes: int
    messages_per_lane: int
    payload_bytes: int
    bundle_size: int

    @property
    def total(self) -> int:
        return self.lanes * self.messages_per_lane


@dataclass(frozen=True)
class Phase:
    """One PerfTest run against a fresh node."""

    name: str
    msgs_per_s: float
    confirm_p99_ms: float  # publish to confirm, per message: the accept latency
    consumer_p99_ms: float  # publish to delivery at a consumer (relay only)
    server_cpu_s: float
    client_cpu_s: float
    queued_after: int
    listening: list[str]
    nodename: str
    stop_reason: str


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def options(load: Load, relay: bool) -> list[str]:
    common = [
        *("--producers", str(load.lanes), "--pmessages", str(load.messages_per_lane)),
        *("--queue-pattern", "bench-%d", "--queue-pattern-from", "1", "--queue-pattern-to", str(load.lanes)),
        *("--flag", "persistent", "--auto-delete", "false", "--size", str(load.payload_bytes)),
        *("--confirm", str(load.bundle_size), "--confirm-timeout", "120"),
        *("--id", "relay" if relay else "accept"),
    ]
    if not relay:
        return [*common, "--consumers", "0"]
    return [
        *common,
        *("--consumers", str(load.lanes), "--cmessages", str(load.messages_per_lane)),
        *("--qos", str(2 * load.bundle_size), "--multi-ack-every", str(load.bundle_size)),
    ]


def phase(name: str, load: Load, workdir: Path, cp: str, tls: RabbitTls | None = None) -> Phase:
    """``accept`` or ``relay`` (``tls``: over the node's AMQPS listener; name it apart, ``accept_tls``)."""
    relay = name == "relay"
    with RabbitNode(workdir / name, tls=tls) as node:
        listening = node.check_loopback_only()
        before = cpu_seconds(node.beam_pid)
        timeout = 120 + load.total / 500  # bounded even at 500 msg/s
        summary, client_cpu = perf_test.run(
            cp,
            node.uri,
            options(load, relay),
            workdir / f"perf-test-{name}.log",
            timeout,
            java_options=() if tls is None else tls.java_options,
        )
        server_cpu = cpu_seconds(node.beam_pid) - before
        queued = sum(node.queue_counts().values())
    return Phase(
        name=name,
        msgs_per_s=summary.receiving_rate if relay else summary.sending_rate,
        confirm_p99_ms=summary.confirm_latency_us.get("p99", float("nan")) / 1000,
        consumer_p99_ms=summary.consumer_latency_us.get("p99", float("nan")) / 1000,
        server_cpu_s=server_cpu,
        client_cpu_s=client_cpu,
        queued_after=queued,
        listening=listening,
        nodename=node.nodename,
        stop_reason=summary.stop_reason,
    )


def report(phase_: Phase, load: Load) -> list[str]:
    relay = phase_.name == "relay"
    expected = 0 if relay else load.total
    consumer = f" consumer_p99_ms={phase_.consumer_p99_ms:.1f}" if relay else ""
    return [
        f"rabbitmq_{phase_.name}_msgs_per_s={phase_.msgs_per_s:.0f} "
        f"confirm_p99_ms={phase_.confirm_p99_ms:.1f}{consumer} ({phase_.stop_reason})",
        f"rabbitmq_{phase_.name}_cpu_us_per_msg beam={phase_.server_cpu_s / load.total * 1e6:.1f} "
        f"perf_test={phase_.client_cpu_s / load.total * 1e6:.1f}",
        f"rabbitmq_{phase_.name} queued_after={phase_.queued_after} (must be {expected}) "
        f"node={phase_.nodename} listening={','.join(phase_.listening)}",
    ]
