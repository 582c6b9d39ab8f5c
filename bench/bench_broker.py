"""Broker throughput: backend simulator to cloud simulator through one Active broker.

Setup (the issue's): 200 streams, bundles of 100 messages of about 500 bytes,
the durable journal on (group commit, fsync per batch), the message log on.
Three real processes on loopback, started and stopped here. The figures:

* ``msgs_per_s``: messages confirmed end to end (backend to broker to cloud
  and back to the backend) divided by the time from the first send to the last
  confirmation, as the backend simulator measures it;
* ``accept_p50_ms`` / ``accept_p99_ms``: SendMessages latency per bundle as
  the backend simulator sees it (request sent to response read);
* ``broker_peak_rss_mb``: the broker process's VmHWM;
* ``cpu_s`` and ``broker_cpu_us_per_msg``: CPU each process used during the
  run (``/proc/<pid>/stat``), the broker's per message and split into user
  and system time. On a shared machine these are the figures to compare, not
  the wall-clock throughput;
* ``lost`` / ``misordered``: from the cloud simulator's record of the seqs it took per stream,
  in order (both must be 0; the exit status is 1 otherwise);
* ``accept_msgs_per_s``: messages accepted (SendMessages answered, so in the
  fsync'd journal) divided by the time from the first send to the poll (every
  50 ms) that saw the last one accepted, on the backend's clock;
* with ``--profile``, the broker runs under cProfile and the top functions by
  own time are printed (``--profile-out FILE`` keeps the stats). cProfile
  inflates per-call costs several times over, so use it for where, not how much.

With TLS (issue 41; ``--no-tls`` leaves it out): each round also runs ours with TLS on every leg
(``local_cluster.loopback_relay``: the backend simulator calls the broker's main port over
``https://`` with a client certificate that the broker verifies and checks the subject of, the
broker calls both simulators over ``https://``; RSA-2048 from one local CA), the same load, the
plain and the TLS run in alternating order from round to round. Its report lines start with
``tls``; ``broker_tls_accept_ratio`` is the median over the rounds of TLS accept msg/s over
plain accept msg/s in the same round (the goal: at least 0.9), and
``broker_tls_cpu_per_msg_ratio`` the same for the broker's CPU per message. With RabbitMQ too,
its accept phase runs a third time over its AMQPS listener (``rabbitmq_tls.py``), and
``rabbitmq_tls_accept_ratio`` and ``broker_vs_rabbitmq_tls_accept`` follow. While a run of ours
goes on, a progress line goes to stderr every few seconds.

Against RabbitMQ (issue 25; ``--no-rabbitmq`` leaves it out): each of ``--rounds``
rounds runs ours, then the same load through Debian's RabbitMQ with its own load
generator, PerfTest (``rabbitmq_run.py``: the mapping and the two phases, accept
and relay; ``rabbitmq_peer.py``: the node on loopback; ``perf_test.py``: the
jar). The figures of each round, then the medians, then
``broker_throughput_msgs_per_s=N`` (ours, end to end, the median) and last the
headline ``broker_vs_rabbitmq_accept=R``: the median over the rounds of ours
accept msg/s over RabbitMQ's. Without RabbitMQ the last line is
``broker_throughput_msgs_per_s=N``.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import pstats
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from broker_simulators.local_processes import DEFAULT_TOKEN, PYTHON, ProcessSet, RunningProcess, running
from local_cluster.loopback_relay import start_relay
from local_cluster.run_pki import LocalPki, create_local_pki

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import perf_test, rabbitmq_run, rabbitmq_tls  # noqa: E402  # the repository root is on the path now
from bench.soap_heartbeat import heartbeat_body  # noqa: E402

PROGRESS_SECONDS = 5.0


def post_soap_heartbeat(broker: RunningProcess, epoch: int) -> bytes:
    """An ``active=true`` Heartbeat, where and as the operator sends it (its port, its certificate)."""
    body = heartbeat_body(epoch)
    request = urllib.request.Request(
        broker.admin_url + "/soap",
        data=body,
        headers={"Content-Type": "text/xml", "Authorization": f"Bearer {DEFAULT_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10, context=caller_context(broker)) as response:
        return bytes(response.read())


def caller_context(process: RunningProcess) -> ssl.SSLContext | None:
    return None if process.caller_tls is None else process.caller_tls.context()


def get_json(process: RunningProcess, path: str) -> dict[str, object]:
    with urllib.request.urlopen(process.url + path, timeout=10, context=caller_context(process)) as response:
        result: dict[str, object] = json.load(response)
        return result


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU time a process has used so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    return sum(cpu_times(pid))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--messages-per-stream", type=int, default=5000, help="200 x 5000 = 1,000,000")
    parser.add_argument("--bundle-size", type=int, default=100)
    parser.add_argument("--payload-bytes", type=int, default=500)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument(
        "--profile", action="store_true", help="run the broker under cProfile and print the top"
    )
    parser.add_argument("--profile-out", type=Path, default=None, help="also keep the cProfile stats here")
    parser.add_argument("--no-message-log", action="store_true", help="measure without the message log")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of ours then RabbitMQ; medians over them"
    )
    parser.add_argument("--no-rabbitmq", action="store_true", help="ours only (no RabbitMQ, no PerfTest)")
    parser.add_argument("--no-tls", action="store_true", help="no TLS runs (neither ours nor RabbitMQ's)")
    parser.add_argument("--perf-test-version", default=perf_test.VERSION)
    return parser.parse_args()


def lost_and_misordered(received: dict[str, object], streams: int, per_stream: int) -> tuple[int, int]:
    """From the cloud's record of seqs per stream in the order taken: seqs 1..per_stream never
    taken, and places where a stream's next seq is not the one after."""
    lost = per_stream * (streams - len(received))
    misordered = 0
    for value in received.values():
        seqs = [int(seq) for seq in value] if isinstance(value, list) else []
        lost += len(set(range(1, per_stream + 1)) - set(seqs))
        misordered += sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    return lost, misordered


@dataclass(frozen=True)
class Ours:
    lines: list[str]
    correct: bool  # every message arrived once and in order
    accept_msgs_per_s: float
    relay_msgs_per_s: float
    accept_p99_ms: float
    broker_cpu_us_per_msg: float


def run(args: argparse.Namespace, root: Path, procs: ProcessSet, pki: LocalPki | None = None) -> Ours:
    """Start the three processes, push every message through; the report lines and figures.
    With ``pki``, TLS on every leg."""
    relay = start_relay(
        procs,
        root,
        pki=pki,
        streams=args.streams,
        messages_per_stream=args.messages_per_stream,
        backend_args={
            "bundle_size": args.bundle_size,
            "per_stream_in_bundle": max(1, args.bundle_size * args.lanes // args.streams),
            "payload_bytes": args.payload_bytes,
            "lanes": args.lanes,
        },
        broker_args={
            "name": "bench-broker",
            "lease_seconds": 600,
            "message_log_dir": None if args.no_message_log else root / "store",
        },
    )
    broker, backend, cloud = relay.broker, relay.backend, relay.cloud
    label = "ours" if pki is None else "ours tls"
    profile_path = root / "broker.prof"
    if args.profile:  # the same command under cProfile with a CPU clock
        broker.stop()
        broker.argv = [PYTHON, str(ROOT / "bench" / "profile_broker.py"), str(profile_path), *broker.argv[3:]]
        broker.restart()
    processes = (broker, backend, cloud)
    cpu_before = {p.name: cpu_seconds(p.pid) for p in processes}
    broker_user_before, broker_sys_before = cpu_times(broker.pid)
    reply = post_soap_heartbeat(broker, 1)
    if b"<tns:state>Active</tns:state>" not in reply:
        raise SystemExit(f"broker did not activate: {reply[:400]!r}")
    start = urllib.request.Request(backend.url + "/sim/start", data=b"{}")
    urllib.request.urlopen(start, timeout=10, context=caller_context(backend)).close()

    total = args.streams * args.messages_per_stream
    status, accept_seconds = wait_all_confirmed(backend, total, label)
    taken = get_json(cloud, "/sim/status")
    lost, misordered = lost_and_misordered(
        get_json(cloud, "/sim/received"), args.streams, args.messages_per_stream
    )
    rss = peak_rss_mb(broker.pid)
    cpu = {p.name: cpu_seconds(p.pid) - cpu_before[p.name] for p in processes}
    broker_user, broker_sys = cpu_times(broker.pid)
    seconds = float(str(status["sendingSeconds"]))
    accept_seconds = accept_seconds or seconds  # all accepted and confirmed between two polls
    broker.stop()
    broker_us = cpu[broker.name] / total * 1e6
    accept_p99_ms = float(str(status["acceptP99"])) * 1000
    lines = [
        f"messages={total} streams={args.streams} bundle={args.bundle_size} "
        f"payload_bytes={args.payload_bytes}",
        # The schemes the processes serve (each serves only that one), i.e. what every leg spoke.
        " ".join(["channels", *(f"{p.name}={p.url.split(':', 1)[0]}" for p in (broker, cloud, backend))])
        + ("" if pki is None else " (the backend's client certificate, its subject allowed)"),
        f"journal=durable(fsync per group commit) message_log={'off' if args.no_message_log else 'on'}",
        f"elapsed_s={seconds:.2f}",
        f"cloud_taken={taken['outboundTaken']} cloud_duplicates={taken['outboundDuplicates']}",
        f"messages lost={lost} misordered={misordered} (must be 0)",
        f"bundles={status['bundles']} accept_p50_ms={float(str(status['acceptP50'])) * 1000:.1f}",
        f"accept_p99_ms={accept_p99_ms:.1f}",
        f"broker_peak_rss_mb={rss:.1f}",
        "cpu_s " + " ".join(f"{name}={value:.2f}" for name, value in cpu.items()) + " (2 cores shared)",
        f"broker_cpu_us_per_msg={broker_us:.1f} "
        f"(user {(broker_user - broker_user_before) / total * 1e6:.1f}, "
        f"system {(broker_sys - broker_sys_before) / total * 1e6:.1f})",
    ]
    if args.profile and profile_path.exists():
        lines.append("--- broker profile (CPU time), top 25 by own time ---")
        text = io.StringIO()
        pstats.Stats(str(profile_path), stream=text).sort_stats("tottime").print_stats(25)
        lines.append(text.getvalue())
        if args.profile_out is not None:
            args.profile_out.write_bytes(profile_path.read_bytes())
    lines.append(f"accept_msgs_per_s={total / accept_seconds:.0f} relay_msgs_per_s={total / seconds:.0f}")
    if pki is not None:  # told apart from the plain run's lines by their first word
        lines = [f"tls {line}" for line in lines]
    return Ours(
        lines=lines,
        correct=lost == 0 and misordered == 0,
        accept_msgs_per_s=total / accept_seconds,
        relay_msgs_per_s=total / seconds,
        accept_p99_ms=accept_p99_ms,
        broker_cpu_us_per_msg=broker_us,
    )


def wait_all_confirmed(
    backend: RunningProcess, total: int, label: str
) -> tuple[dict[str, object], float | None]:
    """Poll the backend every 50 ms until it has every message confirmed: its last status, and
    the seconds to the poll that first saw all ``total`` accepted (None if that was the last)."""
    began = time.monotonic()
    deadline = began + 120 + total / 500  # bounded even at 500 msg/s
    next_progress = began + PROGRESS_SECONDS
    status = get_json(backend, "/sim/status")
    accept_seconds = None
    while not status["allConfirmed"] and time.monotonic() < deadline:
        time.sleep(0.05)
        status = get_json(backend, "/sim/status")
        if accept_seconds is None and int(str(status["accepted"])) >= total:
            accept_seconds = float(str(status["sendingSeconds"]))
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_SECONDS
            progress(f"{label}: {status['accepted']}/{total} accepted, {status['confirmed']} confirmed")
    if not status["allConfirmed"]:
        raise SystemExit(
            f"{label}: not all confirmed in time: {status['confirmed']}/{total}: {status['faults']}"
        )
    return status, accept_seconds


def rabbitmq_load(args: argparse.Namespace) -> rabbitmq_run.Load:
    """Our load as PerfTest's: one producer per lane, the same total (rounded down to lanes)."""
    lanes = max(1, min(args.lanes, args.streams))
    return rabbitmq_run.Load(
        lanes=lanes,
        messages_per_lane=args.streams * args.messages_per_stream // lanes,
        payload_bytes=args.payload_bytes,
        bundle_size=args.bundle_size,
    )


def say(text: str) -> None:
    print(text, flush=True)


def progress(text: str) -> None:
    """For the person waiting; on stderr, so stdout stays the report."""
    print(f"  .. {text}", file=sys.stderr, flush=True)


def median_line(name: str, values: list[float], digits: int = 0) -> str:
    shown = " ".join(f"{v:.{digits}f}" for v in values)
    return f"{name}={statistics.median(values):.{digits}f} (rounds: {shown})"


@dataclass(frozen=True)
class Theirs:
    accept: rabbitmq_run.Phase
    relay: rabbitmq_run.Phase
    accept_tls: rabbitmq_run.Phase | None


def ours_round(args: argparse.Namespace, number: int, pki: LocalPki | None) -> tuple[Ours, Ours | None]:
    """Ours plain and (with ``pki``) with TLS, the plain run first in odd rounds, last in even ones."""
    kinds: list[LocalPki | None] = [None] if pki is None else [None, pki]
    if number % 2 == 0:
        kinds.reverse()
    results: dict[bool, Ours] = {}
    for kind in kinds:
        name = "ours" if kind is None else "ours, TLS on every leg"
        say(f"--- round {number}/{args.rounds}: {name} ---")
        with tempfile.TemporaryDirectory(prefix="bench-broker-") as scratch, running(Path(scratch)) as procs:
            result = run(args, Path(scratch), procs, kind)
        say("\n".join(result.lines))
        results[kind is not None] = result
    return results[False], results.get(True)


def rabbitmq_round(
    args: argparse.Namespace, number: int, load: rabbitmq_run.Load, cp: str, pki: LocalPki | None
) -> Theirs:
    say(f"--- round {number}/{args.rounds}: RabbitMQ, {load.lanes} producers, {load.total} messages ---")
    with tempfile.TemporaryDirectory(prefix="bench-rabbitmq-") as scratch:
        progress(f"RabbitMQ accept: a fresh node, then PerfTest ({load.total} messages)")
        accept = rabbitmq_run.phase("accept", load, Path(scratch), cp)
        say("\n".join(rabbitmq_run.report(accept, load)))
        progress(f"RabbitMQ relay: a fresh node, then PerfTest ({load.total} messages)")
        relay = rabbitmq_run.phase("relay", load, Path(scratch), cp)
        say("\n".join(rabbitmq_run.report(relay, load)))
        accept_tls = None
        if pki is not None:
            progress(f"RabbitMQ accept over TLS: a fresh node, then PerfTest ({load.total} messages)")
            tls = rabbitmq_tls.rabbit_tls(pki, Path(scratch) / "tls")
            accept_tls = rabbitmq_run.phase("accept_tls", load, Path(scratch), cp, tls)
            say("\n".join(rabbitmq_run.report(accept_tls, load)))
    return Theirs(accept=accept, relay=relay, accept_tls=accept_tls)


def tls_summary(ours: list[Ours], ours_tls: list[Ours], theirs: list[Theirs]) -> list[str]:
    """The TLS figures: each ratio taken within a round, then the median over the rounds."""
    pairs = list(zip(ours, ours_tls, strict=True))
    lines = [
        median_line("ours tls accept_msgs_per_s", [t.accept_msgs_per_s for t in ours_tls]),
        median_line("ours tls broker_cpu_us_per_msg", [t.broker_cpu_us_per_msg for t in ours_tls], 1),
        median_line(
            "broker_tls_cpu_per_msg_ratio",
            [t.broker_cpu_us_per_msg / o.broker_cpu_us_per_msg for o, t in pairs],
            2,
        ),
    ]
    with_tls = [(o, t, r) for (o, t), r in zip(pairs, theirs, strict=False) if r.accept_tls is not None]
    if with_tls:
        lines += [
            median_line(
                "rabbitmq accept_tls_msgs_per_s",
                [r.accept_tls.msgs_per_s for _, _, r in with_tls if r.accept_tls],
            ),
            median_line(
                "rabbitmq_tls_accept_ratio",
                [r.accept_tls.msgs_per_s / r.accept.msgs_per_s for _, _, r in with_tls if r.accept_tls],
                2,
            ),
            median_line(
                "broker_vs_rabbitmq_tls_accept",
                [t.accept_msgs_per_s / r.accept_tls.msgs_per_s for _, t, r in with_tls if r.accept_tls],
                2,
            ),
        ]
    lines.append(
        median_line(
            "broker_tls_accept_ratio", [t.accept_msgs_per_s / o.accept_msgs_per_s for o, t in pairs], 2
        )
    )
    return lines


def rabbitmq_summary(ours: list[Ours], theirs: list[Theirs], load: rabbitmq_run.Load) -> list[str]:
    pairs = list(zip(ours, theirs, strict=True))
    return [
        median_line("rabbitmq accept_msgs_per_s", [r.accept.msgs_per_s for r in theirs]),
        median_line("rabbitmq relay_msgs_per_s", [r.relay.msgs_per_s for r in theirs]),
        median_line("rabbitmq accept_confirm_p99_ms", [r.accept.confirm_p99_ms for r in theirs], 1),
        median_line(
            "rabbitmq accept_beam_cpu_us_per_msg",
            [r.accept.server_cpu_s / load.total * 1e6 for r in theirs],
            1,
        ),
        median_line(
            "rabbitmq relay_beam_cpu_us_per_msg", [r.relay.server_cpu_s / load.total * 1e6 for r in theirs], 1
        ),
        # CPU per message, theirs over ours: less at the mercy of the machine's load than msg/s
        # (ours includes relaying to the cloud, which runs during its accept phase too).
        median_line(
            "rabbitmq_vs_broker_cpu_per_msg accept",
            [r.accept.server_cpu_s / load.total * 1e6 / o.broker_cpu_us_per_msg for o, r in pairs],
            2,
        ),
        median_line(
            "broker_vs_rabbitmq_relay", [o.relay_msgs_per_s / r.relay.msgs_per_s for o, r in pairs], 2
        ),
    ]


def main() -> int:
    args = parse_args()
    cp = None if args.no_rabbitmq else perf_test.classpath(args.perf_test_version)
    load = rabbitmq_load(args)
    ours: list[Ours] = []
    ours_tls: list[Ours] = []
    theirs: list[Theirs] = []
    correct = True
    with tempfile.TemporaryDirectory(prefix="bench-broker-pki-") as pki_dir:
        pki = None if args.no_tls else create_local_pki(Path(pki_dir))
        for number in range(1, args.rounds + 1):
            plain, tls = ours_round(args, number, pki)
            ours.append(plain)
            correct = correct and plain.correct
            if tls is not None:
                ours_tls.append(tls)
                correct = correct and tls.correct
                ratio = tls.accept_msgs_per_s / plain.accept_msgs_per_s
                say(f"round_{number} broker_tls_accept_ratio={ratio:.2f}")
            if cp is None:
                continue
            result = rabbitmq_round(args, number, load, cp, pki)
            theirs.append(result)
            correct = correct and result.accept.queued_after == load.total and result.relay.queued_after == 0
            if result.accept_tls is not None:
                correct = correct and result.accept_tls.queued_after == load.total
                ratio = result.accept_tls.msgs_per_s / result.accept.msgs_per_s
                say(f"round_{number} rabbitmq_tls_accept_ratio={ratio:.2f}")
            ratio = plain.accept_msgs_per_s / result.accept.msgs_per_s
            say(f"round_{number} broker_vs_rabbitmq_accept={ratio:.2f}")
    say(f"--- medians over {args.rounds} round(s) ---")
    summary = [
        median_line("ours accept_msgs_per_s", [o.accept_msgs_per_s for o in ours]),
        median_line("ours relay_msgs_per_s", [o.relay_msgs_per_s for o in ours]),
        median_line("ours accept_p99_ms", [o.accept_p99_ms for o in ours], 1),
        median_line("ours broker_cpu_us_per_msg", [o.broker_cpu_us_per_msg for o in ours], 1),
    ]
    if theirs:
        summary += rabbitmq_summary(ours, theirs, load)
    if ours_tls:
        summary += tls_summary(ours, ours_tls, theirs)
    summary.append(f"broker_throughput_msgs_per_s={statistics.median(o.relay_msgs_per_s for o in ours):.0f}")
    if theirs:
        ratios = [o.accept_msgs_per_s / r.accept.msgs_per_s for o, r in zip(ours, theirs, strict=True)]
        summary.append(f"broker_vs_rabbitmq_accept={statistics.median(ratios):.2f}")
    say("\n".join(summary))
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
