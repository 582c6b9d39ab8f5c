"""The message-log writer on real files: valid records, closed segments, crash leftovers closed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from broker_contracts import message_log
from broker_contracts.message_log import Direction, Event
from broker_service.message_log_writer import MessageLogWriter, now_ts


def writer(store: Path, max_bytes: int = 1 << 20) -> MessageLogWriter:
    log = MessageLogWriter(
        store, cluster="acme-1000", broker="acme-1000-0", account="acme", company="1000",
        max_bytes=max_bytes, max_seconds=3600,
    )  # fmt: skip
    log.start()
    return log


def records(store: Path) -> list[message_log.MessageLogRecord]:
    found = []
    for segment in sorted(store.glob(message_log.CLOSED_SEGMENT_GLOB)):
        found += [message_log.decode(line) for line in segment.read_bytes().splitlines()]
    return found


def test_records_follow_the_schema_and_segments_close_on_size(tmp_path: Path) -> None:
    log = writer(tmp_path, max_bytes=2000)
    log.lifecycle(Event.ACTIVATED, 3)
    messages = [(f'str"eam\\{i % 3}', i, f"m-{i}", "payload") for i in range(1, 40)]
    for message in messages:  # the size bound is checked after each write (batch)
        log.messages(Event.FORWARDED, 3, Direction.OUTBOUND, [message], attempt=2)
    log.close_segment()

    found = records(tmp_path)
    assert len(list(tmp_path.glob(message_log.CLOSED_SEGMENT_GLOB))) > 1  # the size bound closed some
    assert not list(tmp_path.rglob("*" + message_log.OPEN_SEGMENT_SUFFIX))
    assert found[0]["event"] == "activated" and found[0]["stream"] is None
    assert [(r["stream"], r["seq"], r["attempt"]) for r in found[1:]] == [(m[0], m[1], 2) for m in messages]


def test_a_segment_left_open_by_a_crash_is_closed_with_its_torn_line_cut(tmp_path: Path) -> None:
    first = writer(tmp_path)
    first.messages(Event.ACCEPTED, 1, Direction.OUTBOUND, [("s", 1, "m1", "p"), ("s", 2, "m2", "p")])
    first.flush()
    (left_open,) = tmp_path.rglob("*" + message_log.OPEN_SEGMENT_SUFFIX)
    with left_open.open("ab") as handle:
        handle.write(b'{"event":"accepted","ts":"2026-')  # the crash tore this line

    second = writer(tmp_path)
    second.lifecycle(Event.ACTIVATED, 2)
    second.close_segment()

    assert [(r["event"], r["seq"]) for r in records(tmp_path)] == [
        ("accepted", 1),
        ("accepted", 2),
        ("activated", None),
    ]


def test_every_event_path_writes_the_same_records_as_json(tmp_path: Path) -> None:
    """First event, cached later events, a cache miss in the middle of a batch, and the final pop."""
    log = writer(tmp_path)
    batch = [(f"s\u00e9-{i % 2}", i, f'id"{i}', "p") for i in range(1, 7)]
    log.messages(Event.ACCEPTED, 4, Direction.OUTBOUND, batch[:4], first=True)  # the last two never cached
    log.messages(Event.FORWARDED, 4, Direction.OUTBOUND, batch, attempt=1)  # misses 5 and 6: slow path
    log.messages(Event.DELIVERED, 4, Direction.OUTBOUND, batch)
    log.messages(Event.CONFIRMED, 4, Direction.OUTBOUND, batch, final=True)
    log.messages(Event.CONFIRMED, 4, Direction.OUTBOUND, batch[:1], final=True)  # already forgotten
    log.messages(Event.DELIVERED, 4, Direction.OUTBOUND, [])  # an empty batch writes nothing
    log.close_segment()

    found = records(tmp_path)
    expected = (
        [("accepted", m, None) for m in batch[:4]]
        + [("forwarded", m, 1) for m in batch]
        + [("delivered", m, None) for m in batch]
        + [("confirmed", m, None) for m in batch]
        + [("confirmed", batch[0], None)]
    )
    assert [(r["event"], r["stream"], r["seq"], r["msgId"], r["attempt"]) for r in found] == [
        (event, m[0], m[1], m[2], attempt) for event, m, attempt in expected
    ]
    assert all(r["epoch"] == 4 and r["direction"] == "outbound" for r in found)


def test_now_ts_is_the_schemas_timestamp() -> None:
    before = message_log.parse_ts(message_log.format_ts())
    stamp = now_ts()
    after = message_log.parse_ts(message_log.format_ts())
    assert before <= message_log.parse_ts(stamp) <= after
    assert len(stamp) == len("2026-11-22T12:00:00.123456Z")


# -- the writer's root and checksums (issue 39) --------------------------------------------------


def test_every_closed_segment_is_named_with_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    log = writer(tmp_path, max_bytes=600)
    for seq in range(1, 12):
        log.messages(Event.ACCEPTED, 1, Direction.OUTBOUND, [("s", seq, f"m{seq}", "p")])
    log.flush()  # the last segment stays open: a crash leaves it to the next start
    log.wait_sealed()  # the size bound's closes run on the sealing thread
    closed = sorted(tmp_path.glob(message_log.CLOSED_SEGMENT_GLOB))
    assert len(closed) > 1
    writer(tmp_path).close_segment()  # the next start closes the leftover, with its checksum too
    after = sorted(tmp_path.glob(message_log.CLOSED_SEGMENT_GLOB))
    assert len(after) == len(closed) + 1
    for segment in after:
        assert message_log.segment_sha256(segment.name) == hashlib.sha256(segment.read_bytes()).hexdigest()
    assert [r["seq"] for r in records(tmp_path)] == list(range(1, 12))


@pytest.mark.parametrize(
    ("cluster", "broker"),
    [("../other", "b0"), ("acme-1000", "../../other/b0"), ("acme-1000", "a/b"), ("..", "b0"), ("", "b0")],
)
def test_a_cluster_or_broker_name_that_leaves_the_root_is_refused(
    tmp_path: Path, cluster: str, broker: str
) -> None:
    with pytest.raises(ValueError, match="path component"):
        MessageLogWriter(
            tmp_path / "store", cluster=cluster, broker=broker, account="a", company="c",
            max_bytes=1 << 20, max_seconds=60,
        )  # fmt: skip
    assert not (tmp_path / "other").exists()


def test_a_broker_directory_that_is_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    """Another broker of the cluster (it shares the mount) plants a link to somewhere else."""
    store = tmp_path / "store"
    elsewhere = tmp_path / "other-cluster" / "acme-1000-0"
    elsewhere.mkdir(parents=True)
    (store / "acme-1000").mkdir(parents=True)
    (store / "acme-1000" / "acme-1000-0").symlink_to(elsewhere)
    log = MessageLogWriter(
        store, cluster="acme-1000", broker="acme-1000-0", account="acme", company="1000",
        max_bytes=1 << 20, max_seconds=60,
    )  # fmt: skip
    with pytest.raises(OSError, match="not a directory of its own"):
        log.start()
    assert list(elsewhere.iterdir()) == []


def test_a_leftover_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_bytes(b'{"keep":"me"}\n{"torn')
    directory = tmp_path / "acme-1000" / "acme-1000-0"
    directory.mkdir(parents=True)
    (directory / ("20261122T120000000000Z-000000-acme-1000-0" + message_log.OPEN_SEGMENT_SUFFIX)).symlink_to(
        target
    )
    writer(tmp_path)
    assert target.read_bytes() == b'{"keep":"me"}\n{"torn'  # neither truncated nor moved
    assert not list(tmp_path.glob(message_log.CLOSED_SEGMENT_GLOB))
