"""The message-log store as the validator sees it: closed segments, everything else, its checkpoint.

The layout is the contract of :mod:`broker_contracts.message_log`:
``<store>/<cluster>/<broker>/<segment>.jsonl``. A scan sorts every entry into closed segments (the
input), open segments (a broker is still writing them: skipped without a word), and problems
(foreign and empty files), so a stray file is reported, never fatal.

The store is written by every cluster's brokers, so nothing in it is trusted (issue 39): the scan
walks exactly three levels with ``lstat`` semantics and follows no symbolic link, a segment is a
regular file (not a link, directory, FIFO, socket or device) of at most ``max_segment_bytes``, and
a directory it cannot list is a problem of that directory, not of the run. Only the store's root
itself being unusable stops a run.

The validator keeps its own files under ``<store>/.validator/``: the checkpoint (what earlier runs
processed and the state they carried forward) and, by default, the reports. No broker reaches it:
a broker's pod mounts only its own cluster's directory of the store (``subPath``), and a cluster's
name, a Kubernetes name, never starts with a dot. The checkpoint is
replaced with one atomic rename, and only after the report is written, so a run that dies
anywhere leaves the previous checkpoint as it was and the next run simply does the work again.

What this module does not do: read records (Spark does) or decide anything about them.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker_contracts.message_log import CLOSED_SEGMENT_SUFFIX, OPEN_SEGMENT_SUFFIX, segment_sha256
from broker_validator.limits import DEFAULT_LIMITS, ReadLimits

VALIDATOR_DIR: Final = ".validator"
CHECKPOINT_FILE: Final = "checkpoint.json"
CHECKPOINT_VERSION: Final = 1


class StoreUnreadableError(RuntimeError):
    """The store cannot be validated at all (missing, not a directory, unreadable)."""


@dataclass(frozen=True)
class Segment:
    path: str  # relative to the store, with forward slashes
    size: int
    sha256: str | None = None  # from its name; None for a segment named before checksums

    @property
    def cluster(self) -> str:
        return self.path.split("/", 1)[0]


@dataclass
class StoreScan:
    segments: list[Segment] = field(default_factory=list)  # closed, non-empty, sorted by path
    empty: list[str] = field(default_factory=list)
    foreign: list[tuple[str, str]] = field(default_factory=list)  # (path, why it is not a segment)
    open_segments: int = 0


def scan_store(store: Path, limits: ReadLimits = DEFAULT_LIMITS) -> StoreScan:
    """Every entry under ``store`` except the validator's own, sorted into what it is."""
    if not store.exists():
        raise StoreUnreadableError(
            f"message-log store {store} does not exist; pass the mounted store with --store"
        )
    if not store.is_dir():
        raise StoreUnreadableError(f"message-log store {store} is not a directory")
    if not os.access(store, os.R_OK | os.X_OK):
        raise StoreUnreadableError(f"message-log store {store} is not readable by uid {os.getuid()}")
    scan = StoreScan()
    try:
        clusters = _entries(store)
    except OSError as error:
        raise StoreUnreadableError(f"cannot read the message-log store: {error}") from error
    for cluster in clusters:
        if cluster.name == VALIDATOR_DIR:
            continue
        for broker in _directories(cluster, cluster.name, scan):
            for entry in _directories(broker, f"{cluster.name}/{broker.name}", scan):
                _sort_file(entry, f"{cluster.name}/{broker.name}/{entry.name}", limits, scan)
    return scan


def _entries(directory: str | os.DirEntry[str] | Path) -> list[os.DirEntry[str]]:
    with os.scandir(directory) as listing:
        return sorted(listing, key=lambda entry: entry.name)


def _directories(entry: os.DirEntry[str], relative: str, scan: StoreScan) -> list[os.DirEntry[str]]:
    """The entries of ``entry`` if it is a real directory we can list; else it is foreign."""
    if not entry.is_dir(follow_symlinks=False):
        scan.foreign.append((relative, f"{_kind(entry)} where a directory belongs (<cluster>/<broker>/)"))
        return []
    try:
        return _entries(entry.path)
    except OSError as error:
        scan.foreign.append((relative, f"cannot list: {error.strerror}"))
        return []


def _sort_file(entry: os.DirEntry[str], relative: str, limits: ReadLimits, scan: StoreScan) -> None:
    name = entry.name
    if not name.endswith((OPEN_SEGMENT_SUFFIX, CLOSED_SEGMENT_SUFFIX)):
        scan.foreign.append((relative, f"name does not end in {CLOSED_SEGMENT_SUFFIX}"))
        return
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError as error:
        scan.foreign.append((relative, f"cannot stat: {error.strerror}"))
        return
    if not stat.S_ISREG(info.st_mode):
        scan.foreign.append((relative, f"{_kind(entry)}, not a regular file: not read"))
    elif name.endswith(OPEN_SEGMENT_SUFFIX):
        scan.open_segments += 1
    elif info.st_size == 0:
        scan.empty.append(relative)
    elif info.st_size > limits.max_segment_bytes:
        scan.foreign.append(
            (
                relative,
                f"{info.st_size} bytes, more than --max-segment-bytes ({limits.max_segment_bytes}): not read",
            )
        )
    else:
        scan.segments.append(Segment(relative, info.st_size, segment_sha256(name)))


def _kind(entry: os.DirEntry[str]) -> str:
    """What a store entry is, for people, without following it."""
    if entry.is_symlink():
        return "a symbolic link (never followed)"
    if entry.is_dir(follow_symlinks=False):
        return "a directory"
    if entry.is_file(follow_symlinks=False):
        return "a file"
    return "a FIFO, socket or device"


def checkpoint_path(store: Path) -> Path:
    return store / VALIDATOR_DIR / CHECKPOINT_FILE


def load_checkpoint(store: Path) -> dict[str, Any] | None:
    """The last run's checkpoint, or None when there is none (or it is from another version).

    A checkpoint that cannot be parsed is not trusted: the run validates everything again, as
    ``--full`` would, rather than guess (the caller says so in the report).
    """
    path = checkpoint_path(store)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CheckpointUnusableError(
            f"checkpoint {path} is unreadable ({error}); validating in full"
        ) from error
    if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointUnusableError(
            f"checkpoint {path} is not version {CHECKPOINT_VERSION}; validating in full"
        )
    return data


class CheckpointUnusableError(RuntimeError):
    """The checkpoint exists but cannot be used; the run falls back to a full validation."""


def save_checkpoint(store: Path, data: dict[str, Any]) -> None:
    """Replace the checkpoint atomically: write a temporary file, fsync it, rename it over."""
    path = checkpoint_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps({**data, "version": CHECKPOINT_VERSION}, separators=(",", ":")).encode()
    with open(temporary, "wb") as out:
        out.write(payload)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
