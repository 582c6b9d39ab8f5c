"""What one ``kubectl logs`` request gets: its options, the instance it names, and following it.

- The current instance is the file's last one; ``previous`` the one before it, or the last
  one while the container waits to be restarted (what the kubelet's
  ``lastState.terminated`` names then).
- ``follow`` polls the file (0.2 s) and ends when that instance exits, the client goes
  away, ``limitBytes`` is reached or the server stops.
- ``tailLines`` and ``limitBytes`` are exact; ``sinceSeconds``/``sinceTime`` are
  approximate: the file holds no per-line times, so an instance's log is returned
  whole if the file was written to within the window, and not at all otherwise (lines
  written while following are always new). ``timestamps=true`` is refused with 400
  for the same reason: a time made up at read time would be a lie.
- stdout and stderr are one file, so ``stream=Stdout``/``Stderr`` are refused (400).
- Errors use the kubelet's status codes and wording (400 ``previous terminated container
  "c" in pod "p" not found``, ``... is waiting to start: ...``; 422 for invalid values).
"""

from __future__ import annotations

import datetime
import select
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from local_cluster.container_logs import (
    READ_CHUNK_BYTES,
    START_MARKER,
    ContainerLogSource,
    LogLookup,
    LogRequestError,
    instance_spans,
    modified_at,
    read_from,
    safe_length,
    tail_lines,
)

FOLLOW_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_epoch: float | None = None  # from sinceSeconds or sinceTime

    @classmethod
    def from_query(cls, query: str, now: float) -> LogOptions:
        values = {key: items[-1] for key, items in parse_qs(query, keep_blank_values=True).items()}
        if "tail" in values:  # the kubelet's backwards-compatible spelling
            tail = values.pop("tail")
            if tail != "all":
                values["tailLines"] = tail
        try:
            follow, previous, timestamps = (
                _boolean(values.get(name)) for name in ("follow", "previous", "timestamps")
            )
            tail_count, limit, since_seconds = (
                _integer(values.get(name)) for name in ("tailLines", "limitBytes", "sinceSeconds")
            )
            since_time = _rfc3339(values["sinceTime"]) if values.get("sinceTime") else None
        except ValueError:
            raise LogRequestError(400, '{"message": "Unable to decode query."}') from None
        if (
            (tail_count is not None and tail_count < 0)
            or (limit is not None and limit < 1)
            or (since_seconds is not None and since_seconds < 1)
            or (since_seconds is not None and since_time is not None)
        ):
            raise LogRequestError(422, '{"message": "Invalid request."}')
        if timestamps:
            raise LogRequestError(
                400,
                "timestamps are not available from the local node agent: "
                "its container log files carry no per-line times",
            )
        stream = values.get("stream") or "All"
        if stream != "All":
            raise LogRequestError(
                400, f"unable to return the given log stream: {stream!r}: stdout and stderr are one file here"
            )
        since = now - since_seconds if since_seconds is not None else since_time
        return cls(follow, previous, tail_count, limit, since)


def _boolean(value: str | None) -> bool:
    if value is None or value == "":
        return False
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError(value)


def _integer(value: str | None) -> int | None:
    return None if value is None or value == "" else int(value)


def _rfc3339(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class LogSelection:
    """The part of the file a request gets at once, and what following it continues from."""

    content: bytes
    end: int  # the file offset where ``content``'s instance ends so far
    follow_pgid: int | None  # the running instance to follow, if the request follows


def select_log(pod: str, container: str, source: ContainerLogSource, options: LogOptions) -> LogSelection:
    """The instance ``options`` names (current or previous), trimmed by since and tail."""
    data = source.path.read_bytes() if source.path.is_file() else b""
    spans = instance_spans(data)
    follow_pgid = None
    if options.previous:
        index = len(spans) - 1 if source.waiting_to_restart else len(spans) - 2
        if index < 0:
            raise LogRequestError(
                400, f'previous terminated container "{container}" in pod "{pod}" not found'
            )
    else:
        if not spans:
            reason = source.waiting_reason
            if reason == "ErrImagePull":
                reason = "image can't be pulled"
            raise LogRequestError(
                400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}'
            )
        index = len(spans) - 1
        if options.follow and source.running_pgid is not None:
            follow_pgid = source.running_pgid
    start, end = spans[index]
    content = data[start:end]
    if options.since_epoch is not None and modified_at(source.path) < options.since_epoch:
        content = b""
    if options.tail_lines is not None:
        content = tail_lines(content, options.tail_lines)
    return LogSelection(content=content, end=end, follow_pgid=follow_pgid)


class LogStream:
    """Writes a log to one client connection, within a byte budget, and follows a running instance."""

    def __init__(
        self,
        write: Callable[[bytes], object],
        connection: socket.socket,
        *,
        lookup: LogLookup,
        stopping: threading.Event,
        connection_timeout: float,
    ) -> None:
        self.write = write
        self.connection = connection
        self.lookup = lookup
        self.stopping = stopping
        self.connection_timeout = connection_timeout

    def emit(self, data: bytes, budget: int | None) -> int | None:
        """Write ``data`` within ``budget`` bytes (None: no limit); returns what is left of it."""
        if budget is not None:
            data = data[:budget]
            budget -= len(data)
        if data:
            self.write(data)
        return budget

    def follow(
        self, target: tuple[str, str, str], path: Path, offset: int, pgid: int, budget: int | None
    ) -> None:
        """Stream what instance ``pgid`` of container ``target`` (namespace, pod, name) appends."""
        pending = b""
        while not self.stopping.is_set():
            ended = not self._still_running(target, pgid)
            chunk = read_from(path, offset)  # read after the check: nothing the instance wrote is lost
            offset += len(chunk)
            pending += chunk
            marker = START_MARKER.search(pending)
            if marker is not None:  # the container restarted: this instance is over
                self.emit(pending[: marker.start()], budget)
                return
            shown = safe_length(pending)
            budget = self.emit(pending[:shown], budget)
            pending = pending[shown:]
            if budget == 0 or ended or self._client_gone():
                return
            if len(chunk) < READ_CHUNK_BYTES:
                self.stopping.wait(FOLLOW_POLL_SECONDS)

    def _still_running(self, target: tuple[str, str, str], pgid: int) -> bool:
        try:
            return self.lookup(*target).running_pgid == pgid
        except LogRequestError:
            return False

    def _client_gone(self) -> bool:
        """True once the client closed its side (kubectl -f interrupted): readable with nothing to read."""
        connection = self.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            if not readable:
                return False
            connection.settimeout(0.05)
            try:
                return connection.recv(1) == b""
            finally:
                connection.settimeout(self.connection_timeout)
        except (ssl.SSLWantReadError, TimeoutError):
            return False  # a partial TLS record: still there
        except (OSError, ValueError):
            return True
