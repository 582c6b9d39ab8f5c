"""``broker-local-runner``: the failover engine against a BrokerCluster YAML file, no Kubernetes at all.

It reads a BrokerCluster manifest in ``endpoints`` mode, runs the very same
:class:`~broker_operator.engine.ClusterLoop` the operator runs, and prints every
status change and event as one line on stdout. The demo fallback and the
benchmarks use it; so can a person with a laptop and two brokers.

Where the operator keeps the epoch in the BrokerCluster status (optimistic
concurrency through the API server), the runner keeps it in a small JSON state
file next to the manifest, written atomically (temp file, fsync, rename) and
never backwards: an allocation whose ``current`` is below the stored epoch is
refused with :class:`~broker_operator.engine.EpochConflict`, as the API server
would refuse a stale resourceVersion. The last status is kept there too, so a
restarted runner resumes with the same active broker instead of starting over.

Edits to the manifest (``preferredActive``, heartbeat settings, endpoints) are
picked up within a second; the annotation ``broker.failover.dev/pause-reconciliation: "true"``
pauses the cluster as in the operator (``core/pause.py``), and the other edits wait until it
is removed. Not supported: ``replicas`` (pods need Kubernetes),
several clusters per process, or more than one runner per state file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import yaml

from broker_contracts import environment
from broker_contracts.logs import add_log_arguments, configure_logging, log_settings_from
from broker_operator.core.pause import pause_requested
from broker_operator.core.status import ClusterStatus
from broker_operator.engine import (
    BrokerTarget,
    ClusterLoop,
    EpochConflict,
    HeartbeatClient,
    HeartbeatSettings,
    PodFacts,
    SettingsError,
)

logger = logging.getLogger(__name__)


class ManifestError(ValueError):
    """A BrokerCluster file the runner cannot use; the message names the field."""


@dataclass(frozen=True)
class EndpointsCluster:
    """The parts of a BrokerCluster manifest the runner needs."""

    name: str
    targets: tuple[BrokerTarget, ...]
    settings: HeartbeatSettings
    preferred_active: str | None
    paused: bool = False  # the pause annotation (core/pause.py)


def read_manifest(path: Path) -> EndpointsCluster:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ManifestError(f"cannot read BrokerCluster manifest {path}: {error}") from error
    return parse_manifest(document, source=str(path))


def parse_manifest(document: object, source: str = "manifest") -> EndpointsCluster:
    if not isinstance(document, Mapping) or document.get("kind") != "BrokerCluster":
        raise ManifestError(f"{source}: expected a YAML object with kind: BrokerCluster")
    name = (document.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{source}: metadata.name is required")
    spec = document.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{source}: spec must be an object")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        raise ManifestError(
            f"{source}: spec.endpoints must list the brokers as {{name, url, priority}};"
            " the local runner cannot manage pods (spec.replicas)"
        )
    targets: list[BrokerTarget] = []
    for index, entry in enumerate(endpoints):
        where = f"{source}: spec.endpoints[{index}]"
        if not isinstance(entry, Mapping):
            raise ManifestError(f"{where} must be an object with name, url and priority")
        broker, url, priority = entry.get("name"), entry.get("url"), entry.get("priority", index)
        if not isinstance(broker, str) or not broker:
            raise ManifestError(f"{where}.name is required")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ManifestError(f"{where}.url ({url!r}) must be the broker's http(s)://host:port/soap URL")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ManifestError(f"{where}.priority ({priority!r}) must be an integer")
        targets.append(BrokerTarget(broker, url, priority))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ManifestError(f"{source}: spec.endpoints names must be unique, got {names}")
    preferred = spec.get("preferredActive") or None
    if preferred is not None and preferred not in names:
        raise ManifestError(f"{source}: spec.preferredActive ({preferred}) must be one of {names}")
    try:
        settings = HeartbeatSettings.from_spec(spec)
    except SettingsError as error:
        raise ManifestError(f"{source}: {error}") from error
    paused = pause_requested((document.get("metadata") or {}).get("annotations"))
    return EndpointsCluster(name, tuple(targets), settings, preferred, paused)


class StateFile:
    """The epoch and last status of one cluster, in a JSON file replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[int, ClusterStatus | None]:
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0, None
        except (OSError, ValueError) as error:
            raise ManifestError(
                f"state file {self.path} is unreadable ({error}); move it away only if no broker"
                " is active, since it holds the cluster's epoch"
            ) from error
        epoch = document.get("epoch", 0)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ManifestError(f"state file {self.path}: epoch ({epoch!r}) must be a non-negative integer")
        status = ClusterStatus.from_status(document.get("status"))
        # The status part carries no epoch (allocate_epoch is its only writer): the file's epoch is it.
        return epoch, dataclasses.replace(status, epoch=epoch) if status else None

    def save(self, epoch: int, status: ClusterStatus | None) -> None:
        stored, _ = self.load()
        if epoch < stored:
            raise EpochConflict(
                f"state file {self.path} holds epoch {stored}; refusing to write {epoch}", stored
            )
        document = {"epoch": epoch, "status": status.to_status_patch() if status else None}
        fd, temp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself must survive a power cut
        finally:
            os.close(directory)


class LocalShell:
    """A :class:`~broker_operator.engine.ClusterShell` on a state file and stdout."""

    def __init__(self, state: StateFile, out: TextIO) -> None:
        self._state = state
        self._out = out
        self._status: ClusterStatus | None = None

    def _line(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        print(f"{stamp} {text}", file=self._out, flush=True)

    async def allocate_epoch(self, current: int, epoch: int) -> int:
        stored, _ = self._state.load()
        if current < stored:
            raise EpochConflict(f"epoch {current} is behind the state file's {stored}", stored)
        granted = epoch
        self._state.save(granted, self._status)
        self._line(f"epoch granted={granted}")
        return granted

    async def point_active(self, active: str | None, epoch: int, url: str | None) -> None:
        self._line(f"service active={active} epoch={epoch}")

    async def record_status(self, status: ClusterStatus) -> None:
        self._status = status
        # The epoch in the file is allocate_epoch's alone, as status.epoch is on Kubernetes.
        stored, _ = self._state.load()
        self._state.save(stored, status)
        brokers = " ".join(
            f"{b.name}={b.state}" + (f"({b.unavailability_code})" if b.unavailability_code else "")
            for b in status.brokers
        )
        self._line(f"status phase={status.phase} active={status.active} epoch={status.epoch} {brokers}")

    async def record_event(self, reason: str, message: str, warning: bool) -> None:
        self._line(f"event {'Warning' if warning else 'Normal'} {reason}: {message}")

    def pod_facts(self) -> Mapping[str, PodFacts]:
        return {}  # endpoints mode: no pods, only heartbeats and leases


async def run_cluster(
    manifest: Path,
    state_path: Path,
    token: str,
    out: TextIO,
    metrics_port: int | None,
    *,
    token_file: Path | None = None,
) -> None:
    """Run one cluster until cancelled; with ``token_file``, a broker refusing the token makes the
    client read that file again (a rotated token is used without a restart)."""
    cluster = read_manifest(manifest)
    state = StateFile(state_path)
    stored_epoch, last_status = state.load()
    initial = last_status or (ClusterStatus(epoch=stored_epoch) if stored_epoch else None)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")

    async def read_token() -> str | None:
        if token_file is None:
            return None
        return (await asyncio.to_thread(token_file.read_text, encoding="utf-8")).strip()

    heartbeats = HeartbeatClient(
        token, f"local-runner@{socket.gethostname()}", cluster.settings.timeout_seconds, refresh=read_token
    )
    shell = LocalShell(state, out)
    loop = ClusterLoop(
        cluster.name,
        cluster.targets,
        cluster.settings,
        shell,
        heartbeats,
        initial,
        cluster.preferred_active,
        paused=cluster.paused,
    )
    engine = asyncio.create_task(loop.run(), name=f"cluster {cluster.name}")
    try:
        await _follow_manifest(manifest, loop, engine, cluster)
    finally:
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine
        await heartbeats.close()


async def _follow_manifest(
    manifest: Path, loop: ClusterLoop, engine: asyncio.Task[None], applied: EndpointsCluster
) -> None:
    """Re-read the manifest when it changes; a broken edit is reported and ignored. While the
    manifest asks for a pause, its other edits wait for the pause's end, as in the operator."""
    seen = _mtime(manifest)
    while not engine.done():
        await asyncio.wait({engine}, timeout=1.0)
        mtime = _mtime(manifest)
        if mtime is None or mtime == seen:
            continue
        seen = mtime
        try:
            cluster = read_manifest(manifest)
        except ManifestError as error:
            logger.error("ignoring the edited manifest: %s", error)
            continue
        if cluster.paused != applied.paused:
            logger.warning("reconciliation %s", "paused" if cluster.paused else "resumed")
        applied = dataclasses.replace(applied, paused=True) if cluster.paused else cluster
        loop.update(applied.targets, applied.settings, applied.preferred_active, paused=applied.paused)
    engine.result()  # the engine never ends by itself: surface its exception


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        return Path(args.token_file).read_text(encoding="utf-8").strip()
    return os.environ.get(environment.BROKER_TOKEN, "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="broker-local-runner",
        description="Run the failover engine on a BrokerCluster manifest (endpoints), without Kubernetes.",
    )
    parser.add_argument("manifest", type=Path, help="BrokerCluster YAML with spec.endpoints")
    parser.add_argument("--token-file", help="file with the operator's token (default: $BROKER_TOKEN)")
    parser.add_argument(
        "--state-file", type=Path, help="epoch and status file (default: <manifest>.state.json)"
    )
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on 127.0.0.1:PORT")
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(log_settings_from(parser, args, os.environ))
    token = _token(args)
    if not token:
        parser.error(
            "no token: pass --token-file or set BROKER_TOKEN (brokers refuse unauthenticated heartbeats)"
        )
    state_path = args.state_file or args.manifest.with_name(args.manifest.name + ".state.json")
    try:
        token_file = Path(args.token_file) if args.token_file else None
        return asyncio.run(_main_async(args.manifest, state_path, token, args.metrics_port, token_file))
    except ManifestError as error:
        print(f"broker-local-runner: {error}", file=sys.stderr)
        return 2


async def _main_async(
    manifest: Path, state_path: Path, token: str, metrics_port: int | None, token_file: Path | None
) -> int:
    runner = asyncio.create_task(
        run_cluster(manifest, state_path, token, sys.stdout, metrics_port, token_file=token_file)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if runner.done():
        runner.result()  # raises the runner's error (e.g. ManifestError)
        return 1
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    return 0


if __name__ == "__main__":
    sys.exit(main())
