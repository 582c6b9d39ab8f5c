"""The message-log store as the validator sees it: closed segments, everything else, its checkpoint.

The layout is the contract of :mod:`broker_contracts.message_log`:
``<store>/<cluster>/<broker>/<segment>.jsonl``. A scan sorts every file into closed segments (the
input), open segments (a broker is still writing them: skipped without a word), and problems
(foreign and empty files), so a stray file is reported, never fatal.

The validator keeps its own files under ``<store>/.validator/``: the checkpoint (what earlier runs
processed and the state they carried forward) and, by default, the reports. The checkpoint is
replaced with one atomic rename, and only after the report is written, so a run that dies
anywhere leaves the previous checkpoint as it was and the next run simply does the work again.

What this module does not do: read records (Spark does) or decide anything about them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker_contracts.message_log import CLOSED_SEGMENT_SUFFIX, OPEN_SEGMENT_SUFFIX

VALIDATOR_DIR: Final = ".validator"
CHECKPOINT_FILE: Final = "checkpoint.json"
CHECKPOINT_VERSION: Final = 1


class StoreUnreadableError(RuntimeError):
    """The store cannot be validated at all (missing, not a directory, unreadable)."""


@dataclass(frozen=True)
class Segment:
    path: str  # relative to the store, with forward slashes
    size: int

    @property
    def cluster(self) -> str:
        return self.path.split("/", 1)[0]


@dataclass
class StoreScan:
    segments: list[Segment] = field(default_factory=list)  # closed, non-empty, sorted by path
    empty: list[str] = field(default_factory=list)
    foreign: list[tuple[str, str]] = field(default_factory=list)  # (path, why it is not a segment)
    open_segments: int = 0


def scan_store(store: Path) -> StoreScan:
    """Every file under ``store`` except the validator's own, sorted into what it is."""
    if not store.exists():
        raise StoreUnreadableError(
            f"message-log store {store} does not exist; pass the mounted store with --store"
        )
    if not store.is_dir():
        raise StoreUnreadableError(f"message-log store {store} is not a directory")
    if not os.access(store, os.R_OK | os.X_OK):
        raise StoreUnreadableError(f"message-log store {store} is not readable by uid {os.getuid()}")
    scan = StoreScan()

    def refuse(error: OSError) -> None:
        raise StoreUnreadableError(f"cannot read the message-log store: {error}") from error

    for directory, subdirs, files in os.walk(store, onerror=refuse):
        relative_dir = Path(directory).relative_to(store)
        depth = len(relative_dir.parts)
        if depth == 0:
            subdirs[:] = sorted(d for d in subdirs if d != VALIDATOR_DIR)
        else:
            subdirs.sort()
        for name in sorted(files):
            relative = (relative_dir / name).as_posix()
            if name.endswith(OPEN_SEGMENT_SUFFIX):
                scan.open_segments += 1
                continue
            if depth != 2 or not name.endswith(CLOSED_SEGMENT_SUFFIX):
                why = (
                    f"not a closed segment (<cluster>/<broker>/<name>{CLOSED_SEGMENT_SUFFIX})"
                    if depth != 2
                    else f"name does not end in {CLOSED_SEGMENT_SUFFIX}"
                )
                scan.foreign.append((relative, why))
                continue
            try:
                size = (Path(directory) / name).stat().st_size
            except OSError as error:
                scan.foreign.append((relative, f"cannot stat: {error.strerror}"))
                continue
            if size == 0:
                scan.empty.append(relative)
            else:
                scan.segments.append(Segment(relative, size))
    return scan


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
