"""The validator's bounds on what it reads from the store, one typed object handed down to every task.

Every broker of every cluster writes the store, so the validator reads it as hostile input: a file is
bounded before it is read and a line before it is parsed (issue 39). A module of its own so that the
CLI and the store scan can name the settings without importing the reader's pyarrow and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ReadLimits:
    """The validator's bounds on what it reads (``--max-segment-bytes``, ``--max-record-bytes``).

    Brokers close a segment at 32 MiB (``--segment-max-bytes``) plus at most one event-loop batch,
    and a record is a few hundred bytes; the defaults leave room for both many times over while
    keeping a hostile file from costing a task more than one bounded read.
    """

    max_segment_bytes: int = 256 << 20
    max_record_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        if self.max_segment_bytes < 1 or self.max_record_bytes < 1:
            raise ValueError(f"read limits must be positive, got {self}")


DEFAULT_LIMITS: Final = ReadLimits()
