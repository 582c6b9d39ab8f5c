"""Container log files: how instances are marked in them, and which file a log request means.

Logs come from ``pods/<ns>_<name>_<uid>/logs/<container>.log``, one file per container that
every restart appends to after a marker line the runtime writes (``=== node agent: start #N
argv=[...]``, ``container_lifecycle``). The markers split the file into instances and are
never shown; a marker still being written at the end of the file is held back
(``safe_length``).

``PodLogFinder`` maps (namespace, pod, container) to a file and what the runtime knows of the
container now: running, waiting to restart, or waiting to start at all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from local_cluster.container_lifecycle import container_log_path
from local_cluster.pod_runtime import PodRuntime

# container_lifecycle writes one before each start of a container (even a failed one).
START_MARKER = re.compile(rb"=== node agent: start #\d+ argv=[^\n]*\n")
START_MARKER_PREFIX = b"=== node agent: start #"
DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # namespace and pod names
READ_CHUNK_BYTES = 1 << 20


class LogRequestError(Exception):
    """A request the kubelet would refuse: HTTP status and its message (plain text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ContainerLogSource:
    """One container's log file and what the runtime knows of it at this moment."""

    path: Path
    running_pgid: int | None = None  # the current instance's process group, if it runs
    waiting_to_restart: bool = False  # exited, and restartPolicy will start it again
    waiting_reason: str = ""  # why it has not started yet (no log instance at all)


LogLookup = Callable[[str, str, str], ContainerLogSource]


# ---- reading the log file ----------------------------------------------------------------


def safe_length(data: bytes) -> int:
    """How much of ``data`` may be shown: all but a start marker still being written at its end."""
    line_start = data.rfind(b"\n") + 1
    position = data.find(b"=", line_start)
    while position != -1:
        candidate = data[position:]
        if START_MARKER_PREFIX.startswith(candidate) or candidate.startswith(START_MARKER_PREFIX):
            return position
        position = data.find(b"=", position + 1)
    return len(data)


def instance_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each container instance's output, oldest first, markers left out."""
    markers = list(START_MARKER.finditer(data))
    spans = []
    for index, marker in enumerate(markers):
        end = markers[index + 1].start() if index + 1 < len(markers) else safe_length(data)
        spans.append((marker.end(), max(marker.end(), end)))
    return spans


def tail_lines(data: bytes, count: int) -> bytes:
    if count <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:])


def modified_at(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # removed meanwhile
        return 0.0


def read_from(path: Path, offset: int) -> bytes:
    """Up to ``READ_CHUNK_BYTES`` of the file from ``offset``; nothing if it is gone."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(READ_CHUNK_BYTES)
    except FileNotFoundError:
        return b""


# ---- mapping (namespace, pod, container) to a log file: the node agent's pods ---------------


class PodLogFinder:
    """Finds a container's log among the agent's pod runtimes, then among pod directories on disk.

    ``runtimes`` returns a snapshot of the agent's ``pods`` (the agent's loop thread owns
    them; this only reads). A pod that finished (a Job's Succeeded/Failed pod) keeps its
    runtime there until its object is deleted; a pod the agent no longer runs (finished
    before an agent restart) is found by its directory ``<ns>_<name>_<uid>``, the newest if
    several: the apiserver only asks for pods whose object exists.
    """

    def __init__(self, runtimes: Callable[[], Iterable[PodRuntime]], pods_dir: Path) -> None:
        self.runtimes = runtimes
        self.pods_dir = pods_dir

    def __call__(self, namespace: str, pod: str, container: str) -> ContainerLogSource:
        matches = [
            runtime
            for runtime in self._snapshot()
            if runtime.pod["metadata"]["namespace"] == namespace and runtime.pod["metadata"]["name"] == pod
        ]
        if matches:
            runtime = max(matches, key=lambda r: (r.terminating_deadline is None, r.start_time))
            return self._from_runtime(runtime, pod, container)
        if not (DNS_NAME.fullmatch(namespace) and DNS_NAME.fullmatch(pod)):  # no glob patterns below
            raise LogRequestError(404, f'pod "{pod}" does not exist')
        directories = sorted(
            (d for d in self.pods_dir.glob(f"{namespace}_{pod}_*") if d.name.count("_") == 2),
            key=modified_at,
        )
        if not directories:
            raise LogRequestError(404, f'pod "{pod}" does not exist')
        path = container_log_path(directories[-1], container)
        if not path.is_file():
            raise LogRequestError(404, f'container "{container}" not found in pod "{pod}"')
        return ContainerLogSource(path=path)

    def _snapshot(self) -> list[PodRuntime]:
        for _ in range(10):
            try:
                return list(self.runtimes())
            except RuntimeError:  # the dict changed while being copied; the loop thread owns it
                time.sleep(0.01)
        return list(self.runtimes())

    @staticmethod
    def _from_runtime(runtime: PodRuntime, pod: str, container: str) -> ContainerLogSource:
        for candidate in runtime.containers:
            if candidate.name != container:
                continue
            process = candidate.process
            return ContainerLogSource(
                path=container_log_path(runtime.sandbox.pod_dir, container),
                running_pgid=process.pid if process is not None else None,
                waiting_to_restart=(
                    process is None and candidate.current is not None and runtime.will_start(candidate)
                ),
                waiting_reason=candidate.waiting_reason or "ContainerCreating",
            )
        raise LogRequestError(404, f'container "{container}" not found in pod "{pod}"')
