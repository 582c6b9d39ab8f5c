"""`make demo-local`: the failover engine end to end on this machine, with no Kubernetes.

It starts the backend and cloud simulators and three brokers as real processes
on loopback, runs the operator's failover engine through the local runner on a
BrokerCluster in ``endpoints`` mode, sends ordered traffic both ways, then
kill -9s the active broker mid-traffic, brings it back and lets automatic
failback return to it. At the end it checks what the targets received: every
stream complete, in ``seq`` order, nothing twice. It exits 0 only if that
holds; it prints what failed otherwise.

Why without Kubernetes: it shows the engine alone, in under a minute. `make demo`
(``demo/kubernetes.py``) runs the same engine inside the operator on the local
control plane, installed with helm.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from broker_simulators.local_processes import (
    DEFAULT_TOKEN,
    ProcessSet,
    RunningProcess,
    free_port,
    loopback_host,
    running,
)

BROKERS = ("broker-a", "broker-b", "broker-c")
LEASE_SECONDS = 3


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")


class RunnerOutput:
    """The local runner's stdout, echoed with a prefix and kept for the checks."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._process = process
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line.rstrip())
            print(f"[operator] {line.rstrip()}", flush=True)

    def active(self) -> str | None:
        for line in reversed(self.lines):
            if " status phase=" in line:
                return line.split(" active=", 1)[1].split(" ", 1)[0]
        return None


def manifest(brokers: dict[str, RunningProcess]) -> dict[str, object]:
    return {
        "apiVersion": "broker.failover.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "demo"},
        "spec": {
            "account": "acme",
            "company": "1000",
            "endpoints": [
                {"name": name, "url": broker.soap_url, "priority": priority}
                for priority, (name, broker) in enumerate(brokers.items())
            ],
            "heartbeat": {
                "intervalSeconds": 0.5,
                "timeoutSeconds": 0.5,
                "failureThreshold": 2,
                "leaseSeconds": LEASE_SECONDS,
                "standbyProbeSeconds": 1,
            },
            "failback": "Automatic",
            "failbackStableSeconds": 3,
        },
    }


def check_received(name: str, order: dict[str, list[int]], per_stream: int, streams: int) -> list[str]:
    """What is wrong with what a target received: missing streams, gaps, reordering, duplicates."""
    problems = []
    if len(order) != streams:
        problems.append(f"{name}: {len(order)} streams arrived, {streams} were sent")
    for stream, seqs in sorted(order.items()):
        if seqs != list(range(1, per_stream + 1)):
            problems.append(f"{name}: stream {stream} arrived as {seqs[:5]}... ({len(seqs)} messages)")
    return problems


def run(workdir: Path, streams: int, per_stream: int) -> int:
    with running(workdir) as processes:
        return scenario(processes, workdir, streams, per_stream)


def scenario(processes: ProcessSet, workdir: Path, streams: int, per_stream: int) -> int:
    log_store = workdir / "message-log"
    say(f"working in {workdir}")
    cloud = processes.start_cloud_simulator(
        workdir, inbound_streams=streams // 2, inbound_messages_per_stream=per_stream
    )
    # The backend needs the brokers' URLs and the brokers need the backend's: pick the brokers'
    # loopback addresses first.
    addresses = {name: (host, free_port(host)) for name in BROKERS for host in [loopback_host()]}
    backend = processes.start_backend_simulator(
        workdir,
        broker_urls=[f"http://{host}:{port}" for host, port in addresses.values()],
        streams=streams,
        messages_per_stream=per_stream,
        bundle_size=100,
        per_stream_in_bundle=10,
        payload_bytes=500,
        lanes=4,
    )
    brokers = {
        name: processes.start_broker(
            workdir,
            name=name,
            host=host,
            port=port,
            backend_url=backend.url,
            cloud_url=cloud.url,
            lease_seconds=LEASE_SECONDS,
            cluster="demo",
            message_log_dir=log_store,
        )
        for name, (host, port) in addresses.items()
    }
    say(f"simulators and {len(brokers)} brokers are up; starting the failover engine (local runner)")

    manifest_path = workdir / "brokercluster.yaml"
    manifest_path.write_text(yaml.safe_dump(manifest(brokers), sort_keys=False))
    token_file = workdir / "operator-token"
    token_file.write_text(DEFAULT_TOKEN)
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker_operator.local_runner",
            str(manifest_path),
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        stderr=open(workdir / "local-runner.log", "w"),  # noqa: SIM115 - handed to the child
        text=True,
        start_new_session=True,
    )
    output = RunnerOutput(runner)
    try:
        wait_until("broker-a to become active", lambda: output.active() == "broker-a", 30)
        say(f"broker-a is active; sending {streams} x {per_stream} messages outbound and inbound")
        post(f"{backend.url}/sim/start")
        wait_until(
            "a third of the traffic",
            lambda: int(get_json(f"{backend.url}/sim/status")["confirmed"]) > streams * per_stream // 3,
            120,
        )  # type: ignore[call-overload]

        say("kill -9 broker-a mid-traffic")
        killed_at = time.monotonic()
        brokers["broker-a"].kill(signal.SIGKILL)
        wait_until("a failover to broker-b", lambda: output.active() == "broker-b", 30)
        say(
            f"broker-b took over {time.monotonic() - killed_at:.2f}s after the kill: in endpoints mode no"
            f" kubelet confirms a death, so the engine waits out broker-a's {LEASE_SECONDS}s lease first"
        )

        say("restarting broker-a; Automatic failback returns to it once it has been healthy for 3s")
        brokers["broker-a"].restart()
        wait_until("the failback to broker-a", lambda: output.active() == "broker-a", 60)

        def everything_confirmed() -> bool:
            return bool(get_json(f"{backend.url}/sim/status")["allConfirmed"]) and bool(
                get_json(f"{cloud.url}/sim/status")["inboundAllConfirmed"]
            )

        wait_until("every message to be confirmed both ways", everything_confirmed, 180)
    finally:
        runner.send_signal(signal.SIGTERM)
        try:
            runner.wait(timeout=15)
        except subprocess.TimeoutExpired:
            runner.kill()

    problems = check_received("cloud", get_json(f"{cloud.url}/sim/received"), per_stream, streams)  # type: ignore[arg-type]
    problems += check_received(
        "backend",
        get_json(f"{backend.url}/sim/received"),
        per_stream,
        streams // 2,  # type: ignore[arg-type]
    )
    segments = sorted(log_store.glob("*/*/*.jsonl"))
    cloud_status = get_json(f"{cloud.url}/sim/status")
    say(
        f"cloud took {cloud_status['outboundTaken']} messages ({cloud_status['outboundDuplicates']} duplicate"
        f" deliveries dropped by (stream, seq)); {len(segments)} message-log segments in {log_store}"
    )
    if problems:
        for problem in problems:
            say(f"FAILED: {problem}")
        return 1
    say(f"PASSED: {streams} outbound and {streams // 2} inbound streams complete, in order, none twice")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="make demo-local", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--messages-per-stream", type=int, default=2000)
    parser.add_argument(
        "--workdir", type=Path, help="default: a new temporary directory, kept for inspection"
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="broker-failover-demo-"))
    try:
        return run(workdir, args.streams, args.messages_per_stream)
    except (TimeoutError, RuntimeError) as error:
        say(f"FAILED: {error}; logs are in {workdir}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
