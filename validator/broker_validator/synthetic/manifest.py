"""What a generated store is known to hold: the injectable classes and the manifest types.

The manifest (:class:`GeneratedStore`) is the test's and the benchmark's expected answer: records,
segments, per-cluster counts, the expected count of every anomaly class and where each injected
instance is, plus the state :func:`~broker_validator.synthetic.extend_store` continues from. It is
plain data with a JSON round trip and nothing else: the generator fills it, this module never
writes a segment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypedDict

from broker_validator.report_schema import Anomaly

INJECTABLE: Final = (
    Anomaly.LOST.value,
    Anomaly.DUPLICATE_DELIVERY.value,
    Anomaly.OUT_OF_ORDER.value,
    Anomaly.GAP.value,
    Anomaly.SPLIT_BRAIN.value,
    Anomaly.IN_FLIGHT.value,
    Anomaly.HELD.value,
    Anomaly.DISCARDED.value,
    Anomaly.MALFORMED.value,
)
"""What ``inject`` takes, and what one instance of each writes:

* ``lost``: a message accepted and forwarded, never delivered, long before the end;
* ``duplicate-delivery``: a second ``forwarded`` (attempt 2) and ``delivered`` of a delivered
  message, one tick after the first delivery, same term;
* ``out-of-order``: the first seq of a stream's run in a bundle is delivered one tick after the
  next three (a later tick, so no tie-break by position is needed);
* ``gap``: a seq the source skipped: never accepted, while the seqs around it are delivered;
* ``split-brain``: alternately, the old broker logs a ``confirmed`` after the next epoch's
  ``activated`` (a zombie), or another broker logs ``activated`` and ``deactivated`` for an epoch
  that is already active (one epoch, two brokers; needs two brokers); one instance per epoch;
* ``in-flight``: like ``lost``, in the very last burst (younger than the settle horizon);
* ``held``: forwarded with attempts 1 to 5, then ``held``;
* ``discarded``: forwarded with attempts 1 to 5, then ``discarded``. A broker holds a message
  before an operator discards it; the ``held`` record is left out here so that the instance is one
  finding (inject ``held`` too for both);
* ``malformed``: one extra line in a segment, each in a different segment (the validator counts
  them per segment): alternately a torn record (not JSON) and a record with an unknown event.
"""


class ClusterManifest(TypedDict):
    account: str
    company: str
    brokers: list[str]
    failovers: int
    crashes: int
    epoch: int  # the last epoch
    messages: dict[str, int]  # direction -> distinct messages with delivery evidence
    accepted: dict[str, int]  # direction -> distinct messages the source sent (seqs used)


@dataclass
class InjectedAnomaly:
    """Where one injected instance is: enough to find its record in the store or in a report."""

    anomaly: str
    cluster: str
    direction: str | None = None
    stream: str | None = None
    seq: int | None = None
    broker: str | None = None
    epoch: int | None = None
    segment: str | None = None  # malformed: the segment, relative to the store
    detail: str = ""


@dataclass
class GeneratedStore:
    """The manifest of a generated store (cumulative over :func:`extend_store` parts)."""

    root: Path
    records: int  # valid records written, every part
    malformed_lines: int
    segments: int
    bytes: int
    clusters: dict[str, ClusterManifest]
    expected: dict[str, int]  # every Anomaly value -> the count a correct validator reports
    injected: list[InjectedAnomaly]
    settle_seconds: float
    parameters: dict[str, Any]
    parts: int = 1
    part_records: int = 0  # valid records of the last part alone
    seconds: float = 0.0  # generation time of the last part
    first_ts: str = ""
    last_ts: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # where extend_store continues

    @property
    def failovers(self) -> int:
        return sum(c["failovers"] for c in self.clusters.values())

    @property
    def lines(self) -> int:
        return self.records + self.malformed_lines

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "records": self.records,
            "malformedLines": self.malformed_lines,
            "segments": self.segments,
            "bytes": self.bytes,
            "clusters": self.clusters,
            "expected": self.expected,
            "injected": [vars(item) for item in self.injected],
            "settleSeconds": self.settle_seconds,
            "parameters": self.parameters,
            "parts": self.parts,
            "partRecords": self.part_records,
            "seconds": self.seconds,
            "firstTs": self.first_ts,
            "lastTs": self.last_ts,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GeneratedStore:
        return cls(
            root=Path(data["root"]),
            records=data["records"],
            malformed_lines=data["malformedLines"],
            segments=data["segments"],
            bytes=data["bytes"],
            clusters=data["clusters"],
            expected=data["expected"],
            injected=[InjectedAnomaly(**item) for item in data["injected"]],
            settle_seconds=data["settleSeconds"],
            parameters=data["parameters"],
            parts=data["parts"],
            part_records=data["partRecords"],
            seconds=data["seconds"],
            first_ts=data["firstTs"],
            last_ts=data["lastTs"],
            state=data["state"],
        )

    def save(self, path: Path) -> None:
        """Write the manifest as JSON (atomically); keep it outside the store."""
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: Path) -> GeneratedStore:
        return cls.from_json(json.loads(path.read_text()))
