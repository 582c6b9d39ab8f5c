"""A parsed segment as numpy columns, and the copy of them pass 1 keeps for pass 2.

Strings become small integer codes once per segment (events by their place in the contract's
:class:`~broker_contracts.message_log.Event`, brokers, stream keys and terms by first appearance),
so every check in :mod:`broker_validator.segment_pass` is integer work on arrays. The copy is an
uncompressed ``.npz`` in the task's scratch directory (arrays as they are, names as JSON: nothing
is unpickled); pass 2 reads it where pass 1 ran, and parses the segment again anywhere else.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker_contracts.message_log import Event
from broker_validator.segment_reader import SegmentSource, read_source

StreamKey = tuple[str, str, str]  # (cluster, direction, stream)
TermKey = tuple[str, str, int]  # (cluster, broker, epoch)

EVENTS: Final = tuple(e.value for e in Event)
_CODE: Final = {name: i for i, name in enumerate(EVENTS)}
ACCEPTED, DELIVERED, DEDUPLICATED = (
    _CODE[e.value] for e in (Event.ACCEPTED, Event.DELIVERED, Event.DEDUPLICATED)
)
ACTIVATED, DEACTIVATED = _CODE[Event.ACTIVATED.value], _CODE[Event.DEACTIVATED.value]
EFFECTFUL: Final = (ACCEPTED, DELIVERED, DEDUPLICATED, _CODE[Event.CONFIRMED.value])
SIDE: Final = tuple(_CODE[e.value] for e in (Event.HELD, Event.DISCARDED, Event.REPLAYED))
POS_SHIFT: Final = 32
"""A record's position in the batch: segment index << 32 | line (unique, and ordered within a file)."""


class Columns:
    """A parsed segment as numpy arrays, strings as small integer codes (``broker`` into
    ``brokers``, ``key`` into ``keys``: stream keys, ``term`` into ``terms``)."""

    ARRAYS: Final = ("event", "ts", "epoch", "seq", "pos", "broker", "key", "term")

    def __init__(
        self, arrays: dict[str, np.ndarray], brokers: list[str], keys: list[StreamKey], terms: list[TermKey]
    ) -> None:
        self.event, self.ts, self.epoch, self.seq = (
            arrays["event"],
            arrays["ts"],
            arrays["epoch"],
            arrays["seq"],
        )
        self.pos, self.broker, self.key, self.term = (
            arrays["pos"],
            arrays["broker"],
            arrays["key"],
            arrays["term"],
        )
        self.brokers, self.keys, self.terms = brokers, keys, terms
        self.evidence = (self.event == DELIVERED) | (self.event == DEDUPLICATED)
        self.message = self.evidence | (self.event == ACCEPTED)

    @classmethod
    def of(cls, table: pa.Table, index: int) -> Columns:
        arrays = {
            "event": pc.index_in(table["event"], value_set=pa.array(EVENTS)).to_numpy(zero_copy_only=False),
            "ts": table["ts_us"].to_numpy(),
            "epoch": table["epoch"].to_numpy(),
            "seq": pc.fill_null(table["seq"], 0).to_numpy(),
            "pos": (np.int64(index) << POS_SHIFT) | table["line"].to_numpy(),
        }
        clusters, cluster = _codes(table["cluster"])
        brokers, arrays["broker"] = _codes(table["broker"])
        directions, direction = _codes(table["direction"])
        streams, stream = _codes(table["stream"])
        # Stream key and term key as dense ids, their tuples decoded once per distinct value.
        key_code = (cluster * (len(directions) + 1) + direction) * (len(streams) + 1) + stream
        key_values, arrays["key"] = np.unique(key_code, return_inverse=True)
        keys: list[StreamKey] = []
        for code in key_values.tolist():
            rest, s = divmod(code, len(streams) + 1)
            c, d = divmod(rest, len(directions) + 1)
            keys.append((clusters[c], _at(directions, d), _at(streams, s)))
        epochs, epoch_rank = np.unique(arrays["epoch"], return_inverse=True)
        term_code = (cluster * len(brokers) + arrays["broker"]) * len(epochs) + epoch_rank
        term_values, arrays["term"] = np.unique(term_code, return_inverse=True)
        terms: list[TermKey] = []
        for code in term_values.tolist():
            rest, e = divmod(code, len(epochs))
            c, b = divmod(rest, len(brokers))
            terms.append((clusters[c], brokers[b], int(epochs[e])))
        return cls(arrays, brokers, keys, terms)

    def save(self, path: Path) -> None:
        """An uncompressed ``.npz``: arrays as they are, the names as JSON (no pickle either way)."""
        names = json.dumps({"brokers": self.brokers, "keys": self.keys, "terms": self.terms})
        with path.open("wb") as sink:
            np.savez(sink, names=np.array(names), **{name: getattr(self, name) for name in self.ARRAYS})

    @classmethod
    def load(cls, path: Path) -> Columns:
        with np.load(path, allow_pickle=False) as saved:
            names = json.loads(str(saved["names"]))
            keys = [(c, d, s) for c, d, s in names["keys"]]
            terms = [(c, b, int(e)) for c, b, e in names["terms"]]
            return cls({name: saved[name] for name in cls.ARRAYS}, names["brokers"], keys, terms)


def _codes(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    """Dictionary codes of a string column; null (a lifecycle record's stream) is the last code."""
    encoded = column.combine_chunks().dictionary_encode()
    values = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, len(values)).to_numpy().astype(np.int64)
    return values, codes


def _at(values: list[str], code: int) -> str:
    return values[code] if code < len(values) else ""


def scratch_path(scratch: str, index: int) -> Path:
    return Path(scratch) / f"{index}.npz"


def load(index: int, source: SegmentSource, scratch: str) -> Columns:
    """Pass 2's columns: the copy pass 1 left in this machine's scratch directory, or (another
    executor ran pass 1, or the copy could not be written) a fresh parse."""
    try:
        return Columns.load(scratch_path(scratch, index))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # missing, or cut short (a full /tmp)
        return Columns.of(read_source(source).table, index)


def keep(cols: Columns, scratch: str, index: int) -> None:
    """Pass 1's copy of the parsed columns for pass 2; without one pass 2 parses again (slower, same)."""
    try:
        os.makedirs(scratch, exist_ok=True)
        temporary = scratch_path(scratch, index).with_suffix(".tmp")
        cols.save(temporary)
        temporary.rename(scratch_path(scratch, index))
    except OSError:
        pass
