"""The store scan: only regular files at ``<cluster>/<broker>/<name>.jsonl`` are segments; links,
FIFOs, directories and files too big to read are reported, never followed, opened or fatal."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from broker_contracts import message_log
from broker_validator.limits import ReadLimits
from broker_validator.store import scan_store

LINE = (
    b'{"event":"activated","ts":"2026-11-22T12:00:00.123456Z","cluster":"c1","broker":"b0","epoch":1,'
    b'"direction":null,"account":"a","company":"c","stream":null,"seq":null,"msgId":null,"attempt":null}\n'
)


def sealed(directory: Path, data: bytes = LINE, index: int = 0) -> Path:
    """A closed segment named as a broker names it: with the sha256 of its bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    name = message_log.sealed_segment_name(
        message_log.segment_stem(
            message_log.segment_name(
                directory.name, message_log.parse_ts("2026-11-22T12:00:00.000000Z"), index
            )
        ),
        hashlib.sha256(data).hexdigest(),
    )
    path = directory / name
    path.write_bytes(data)
    return path


def foreign(store: Path) -> dict[str, str]:
    return dict(scan_store(store).foreign)


def test_a_symlink_named_like_a_segment_is_foreign_and_not_a_segment(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(LINE)
    store = tmp_path / "store"
    (store / "c1" / "b0").mkdir(parents=True)
    (store / "c1" / "b0" / "20261122T120000000000Z-000000-b0.jsonl").symlink_to(outside)
    scan = scan_store(store)
    assert scan.segments == []
    assert "symbolic link" in foreign(store)["c1/b0/20261122T120000000000Z-000000-b0.jsonl"]


def test_a_symlinked_cluster_or_broker_directory_is_foreign_and_never_walked(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "c9"
    sealed(elsewhere / "b0")
    store = tmp_path / "store"
    sealed(store / "c1" / "b0")
    (store / "c2").symlink_to(elsewhere)
    (store / "c1" / "b1").symlink_to(elsewhere / "b0")
    scan = scan_store(store)
    assert [s.path.split("/")[:2] for s in scan.segments] == [["c1", "b0"]]
    assert set(foreign(store)) == {"c2", "c1/b1"}


def test_a_fifo_or_a_directory_named_like_a_segment_is_foreign(tmp_path: Path) -> None:
    store = tmp_path / "store"
    directory = store / "c1" / "b0"
    directory.mkdir(parents=True)
    os.mkfifo(directory / "20261122T120000000000Z-000000-b0.jsonl")
    (directory / "20261122T120001000000Z-000001-b0.jsonl").mkdir()
    found = foreign(store)
    assert "not a regular file" in found["c1/b0/20261122T120000000000Z-000000-b0.jsonl"]
    assert "directory" in found["c1/b0/20261122T120001000000Z-000001-b0.jsonl"]
    assert scan_store(store).segments == scan_store(store).empty == []


def test_a_segment_over_the_size_bound_is_reported_not_listed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    small = sealed(store / "c1" / "b0", LINE, 0)
    big = sealed(store / "c1" / "b0", LINE * 10, 1)
    scan = scan_store(store, ReadLimits(max_segment_bytes=len(LINE) * 5, max_record_bytes=1024))
    assert [s.path for s in scan.segments] == [small.relative_to(store).as_posix()]
    why = dict(scan.foreign)[big.relative_to(store).as_posix()]
    assert "--max-segment-bytes" in why and str(len(LINE) * 10) in why


def test_a_segment_name_carries_its_sha256(tmp_path: Path) -> None:
    store = tmp_path / "store"
    path = sealed(store / "c1" / "b0")
    (segment,) = scan_store(store).segments
    assert segment.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert message_log.segment_sha256(path.name) == segment.sha256
    assert message_log.segment_sha256("20261122T120000000000Z-000000-b0.jsonl") is None
