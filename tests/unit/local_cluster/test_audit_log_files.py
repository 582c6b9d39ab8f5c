"""Every part of the API server's audit log is read: it rotates ``audit.log`` at 100 MB, and a
benchmark that read only the current part reported no operator request at all at 2,000 clusters."""

from __future__ import annotations

from pathlib import Path

from local_cluster.control_plane import audit_events, audit_log_files


def test_rotated_parts_come_first_oldest_first_then_the_current_file(tmp_path: Path) -> None:
    current = tmp_path / "audit.log"
    for name in ("audit-2026-11-27T10-49-09.404.log", "audit-2026-11-27T10-41-00.001.log", "audit.log"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "kube-apiserver.log").write_text("not an audit log\n")
    assert audit_log_files(current) == [
        tmp_path / "audit-2026-11-27T10-41-00.001.log",
        tmp_path / "audit-2026-11-27T10-49-09.404.log",
        current,
    ]


def test_without_any_part_there_is_nothing_to_read(tmp_path: Path) -> None:
    assert audit_log_files(tmp_path / "audit.log") == []


def test_events_come_from_every_part_in_order(tmp_path: Path) -> None:
    (tmp_path / "audit-2026-11-27T10-41-00.001.log").write_text('{"n": 1}\n{"n": 2}\n')
    (tmp_path / "audit.log").write_text('{"n": 3}\n')
    assert [event["n"] for event in audit_events(tmp_path / "audit.log")] == [1, 2, 3]
