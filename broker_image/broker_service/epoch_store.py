"""The broker's durably stored epoch: the fence that makes ``STALE_EPOCH`` survive restarts.

The heartbeat contract says a broker stores an accepted epoch durably before it
answers ``Active``; after a crash it must still refuse anything lower. We keep
it in one small text file in the data directory (the PVC), replaced atomically:
write a temporary file, fsync it, rename it over the old one, fsync the
directory. A crash leaves either the old or the new value, never a torn one.

This module does not decide whether an epoch is acceptable; the term rules do
(:mod:`broker_service.term`).
It is synchronous on purpose: a store is a few hundred microseconds and happens
only when the epoch moves, so it stays on the event loop where ordering with
the heartbeat's other steps is obvious.
"""

from __future__ import annotations

import os
from pathlib import Path


class EpochStoreError(RuntimeError):
    """The epoch file exists but cannot be read or written; the text says what to check."""


class EpochStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "epoch"
        self._value = self._load()

    @property
    def value(self) -> int:
        return self._value

    def _load(self) -> int:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        except OSError as error:
            raise EpochStoreError(f"cannot read the stored epoch at {self.path}: {error}") from error
        try:
            return int(text)
        except ValueError:
            raise EpochStoreError(
                f"stored epoch file {self.path} holds {text!r}, not an integer; it is only ever replaced "
                "atomically, so inspect the volume before deleting it"
            ) from None

    def store(self, epoch: int) -> None:
        """Make ``epoch`` the durable value (only ever called with a value above the current one)."""
        tmp = self.path.with_name("epoch.tmp")
        try:
            with open(tmp, "w", encoding="ascii") as handle:
                handle.write(f"{epoch}\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            raise EpochStoreError(f"cannot store epoch {epoch} at {self.path}: {error}") from error
        self._value = epoch
