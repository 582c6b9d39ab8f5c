"""The journal on real files: group commit, recovery, torn tails, real damage refused, rotation, flushed(),
and the hold records (held, released) with the same torn-tail and damage rules."""

from __future__ import annotations

import asyncio
import struct
import zlib
from pathlib import Path

import pytest

from broker_contracts.message_log import Direction
from broker_service.holds import HeldEntry, Release
from broker_service.journal import (
    FILE_HEADER,
    KIND_BUNDLE,
    KIND_HELD,
    Journal,
    JournalCorruptError,
    JournalError,
    accepted_frame,
    confirmed_frame,
    frame,
    held_frame,
    recover,
    released_frame,
)
from tests.unit.broker.gated_disk import GatedDisk


def messages(stream: str, first: int, count: int) -> list[tuple[str, int, str, str]]:
    return [(stream, seq, f"{stream}-{seq}", f"payload {seq}") for seq in range(first, first + count)]


def append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def journal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal-*.log"))


async def write(directory: Path, *frames: bytes, rotate_bytes: int = 1 << 30) -> Journal:
    _, last = recover(directory)
    journal = Journal(directory, rotate_bytes=rotate_bytes, snapshot=list)
    journal.open(last)
    await asyncio.gather(*(journal.append(frame) for frame in frames))
    await journal.close()
    return journal


async def test_group_commit_and_recovery(tmp_path: Path) -> None:
    frames = [accepted_frame(messages("s", 1 + 10 * i, 10)) for i in range(20)]
    journal = await write(tmp_path, *frames, confirmed_frame({"s": 150}))
    assert journal.fsyncs < 21  # concurrent appends shared fsyncs

    recovered, _ = recover(tmp_path)
    assert sorted(recovered.pending["s"]) == list(range(151, 201))
    assert recovered.last_accepted == {"s": 200}
    assert recovered.confirmed == {"s": 150}
    assert recovered.torn_bytes == 0


@pytest.mark.parametrize("cut", [1, 5, 8, 9, 20])
async def test_torn_tail_is_cut_without_losing_earlier_records(tmp_path: Path, cut: int) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 5)), accepted_frame(messages("s", 6, 5)))
    path = journal_files(tmp_path)[0]
    append_bytes(path, accepted_frame(messages("s", 11, 5))[:cut])  # the crash tore the third write

    recovered, _ = recover(tmp_path)

    assert sorted(recovered.pending["s"]) == list(range(1, 11))
    assert recovered.torn_bytes == cut
    assert recovered.records == 2


async def test_corrupt_last_record_and_zero_padding_count_as_torn(tmp_path: Path) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 3)))
    bad = bytearray(accepted_frame(messages("s", 4, 3)))
    bad[-2] ^= 0x01
    append_bytes(journal_files(tmp_path)[0], bytes(bad) + b"\x00" * 64)

    recovered, _ = recover(tmp_path)

    assert sorted(recovered.pending["s"]) == [1, 2, 3]


async def test_damage_followed_by_good_records_is_refused(tmp_path: Path) -> None:
    await write(tmp_path, *(accepted_frame(messages("s", 1 + 3 * i, 3)) for i in range(3)))
    path = journal_files(tmp_path)[0]
    first = path.read_bytes().find(accepted_frame(messages("s", 1, 3)))
    flip_byte(path, first + 20)  # inside the first record's body

    with pytest.raises(JournalCorruptError, match=f"frame 1 at offset {first}"):
        recover(tmp_path)


async def test_rotation_keeps_the_snapshot_and_drops_old_files(tmp_path: Path) -> None:
    live = messages("s", 1, 3)
    _, last = recover(tmp_path)
    journal = Journal(tmp_path, rotate_bytes=200, snapshot=lambda: [accepted_frame(live)])
    journal.open(last)
    for i in range(5):
        await journal.append(accepted_frame(messages("t", 1 + 10 * i, 10)))
    await journal.close()

    files = journal_files(tmp_path)
    assert len(files) == 1 and files[0].name != "journal-000000000001.log"
    recovered, _ = recover(tmp_path)
    assert sorted(recovered.pending["s"]) == [1, 2, 3]


async def test_reopen_compacts_to_the_callers_snapshot(tmp_path: Path) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 50)), confirmed_frame({"s": 48}))
    recovered, last = recover(tmp_path)
    journal = Journal(
        tmp_path,
        rotate_bytes=1 << 30,
        snapshot=lambda: [accepted_frame(list(recovered.pending["s"].values())), confirmed_frame({"s": 48})],
    )
    journal.open(last)
    await journal.close()
    again, _ = recover(tmp_path)
    assert sorted(again.pending["s"]) == [49, 50]
    assert again.last_accepted == {"s": 50}


def test_a_frame_of_several_parts_is_the_frame_of_their_concatenation() -> None:
    # frame() chains the CRC over its parts instead of concatenating them first; the bytes must not change.
    body = [b"[0,2]", b"\n", b"<soap:Envelope/>" * 100]
    joined = b"".join(body)
    payload = KIND_BUNDLE + joined
    fields = struct.pack("<II", len(payload), zlib.crc32(payload))
    assert frame(KIND_BUNDLE, *body) == fields + struct.pack("<I", zlib.crc32(fields)) + payload
    assert frame(KIND_BUNDLE, *body) == frame(KIND_BUNDLE, joined)


async def gated_journal(directory: Path) -> tuple[Journal, GatedDisk]:
    _, last = recover(directory)
    journal = Journal(directory, rotate_bytes=1 << 30, snapshot=list)
    journal.open(last)
    return journal, GatedDisk.install(journal)


async def test_flushed_waits_for_the_write_in_progress_and_adds_nothing(tmp_path: Path) -> None:
    journal, disk = await gated_journal(tmp_path)
    append = asyncio.create_task(journal.append(accepted_frame(messages("s", 1, 3))))
    await asyncio.to_thread(disk.started.wait, 10)  # the write is under way
    flushed = asyncio.create_task(journal.flushed())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not flushed.done()  # nothing it waits for is on disk yet

    disk.gate.set()
    await asyncio.wait_for(asyncio.gather(append, flushed), timeout=10)
    await asyncio.wait_for(journal.flushed(), timeout=10)  # nothing queued: returns at once
    await journal.close()
    assert disk.writes == 1  # flushed() never caused a write of its own
    recovered, _ = recover(tmp_path)
    assert sorted(recovered.pending["s"]) == [1, 2, 3]


async def test_flushed_fails_with_the_write_it_waits_for(tmp_path: Path) -> None:
    journal, disk = await gated_journal(tmp_path)
    append = asyncio.create_task(journal.append(accepted_frame(messages("s", 1, 3))))
    await asyncio.to_thread(disk.started.wait, 10)
    flushed = asyncio.create_task(journal.flushed())
    disk.fail = True
    disk.gate.set()
    for waiter in (append, flushed):
        with pytest.raises(JournalError, match="injected"):
            await asyncio.wait_for(waiter, timeout=10)
    with pytest.raises(JournalError):
        await journal.flushed()  # a failed journal fails at once
    await journal.close()


def held(direction: Direction, stream: str, seq: int, *, blocks: bool = True) -> HeldEntry:
    return HeldEntry(
        direction, (stream, seq, f"{stream}-{seq}", ""), 5, "refused", "2026-11-22T12:00:00.000001Z", blocks
    )


async def test_holds_and_their_releases_are_recovered(tmp_path: Path) -> None:
    out, inb = Direction.OUTBOUND, Direction.INBOUND
    await write(
        tmp_path,
        accepted_frame(messages("s", 1, 9)),
        held_frame(held(out, "s", 2)),
        held_frame(held(out, "s", 4, blocks=False)),
        held_frame(held(out, "s", 6, blocks=False)),
        held_frame(held(out, "s", 8, blocks=False)),
        held_frame(held(inb, "i", 3)),
        held_frame(held(inb, "j", 7)),
        released_frame(out, "s", 4, Release.REPLAYED),
        released_frame(out, "s", 6, Release.DISCARDED),
        released_frame(inb, "j", 7, Release.RESOLVED),
        confirmed_frame({"s": 2}),  # another broker resolved seq 2: the backend confirmed past it
    )

    recovered, _ = recover(tmp_path)

    assert sorted(recovered.holds) == [(inb, "i", 3), (out, "s", 8)]
    assert recovered.holds[(inb, "i", 3)] == held(inb, "i", 3)
    assert recovered.holds[(out, "s", 8)].blocks_stream is False
    assert recovered.discarded == {"s": {6}}


async def test_a_torn_hold_record_is_cut_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 3)), held_frame(held(Direction.OUTBOUND, "s", 2)))
    path = journal_files(tmp_path)[0]
    append_bytes(path, released_frame(Direction.OUTBOUND, "s", 2, Release.REPLAYED)[:-3])

    recovered, _ = recover(tmp_path)  # the release never reached the disk: still held
    assert list(recovered.holds) == [(Direction.OUTBOUND, "s", 2)]
    assert recovered.torn_bytes > 0

    append_bytes(path, frame(KIND_HELD, b'{"direction": "sideways"}') + accepted_frame(messages("s", 4, 1)))
    with pytest.raises(JournalCorruptError, match="record cannot be read"):
        recover(tmp_path)  # a checksummed record that makes no sense is damage, not a torn write


# ---- corruption in the middle versus a torn tail (issue 39) -------------------------------------


async def one_file_of_five_frames(directory: Path) -> tuple[Path, list[bytes], list[int]]:
    frames = [accepted_frame(messages("s", 1 + 3 * i, 3)) for i in range(5)]
    await write(directory, *frames)
    path = journal_files(directory)[0]
    data = path.read_bytes()
    offsets = [data.find(one) for one in frames]
    assert all(offset >= 0 for offset in offsets) and offsets == sorted(offsets)
    return path, frames, offsets


async def test_a_flipped_length_byte_mid_file_is_refused_not_cut_as_a_torn_tail(tmp_path: Path) -> None:
    path, _, offsets = await one_file_of_five_frames(tmp_path)
    # The length field opens the frame; its second byte flipped makes frame 2 claim ~64 KB.
    # Before issue 39 the length was outside the CRC, so recovery took this for a torn tail
    # and silently dropped frames 2 to 5, all fsynced and acknowledged.
    flip_byte(path, offsets[1] + 1)

    with pytest.raises(JournalCorruptError) as raised:
        recover(tmp_path)

    text = str(raised.value)
    assert path.name in text and f"offset {offsets[1]}" in text and "frame 2" in text
    assert path.stat().st_size == offsets[-1] + len(accepted_frame(messages("s", 13, 3)))  # nothing cut


async def test_a_flipped_payload_byte_mid_file_is_refused_naming_the_frame(tmp_path: Path) -> None:
    path, frames, offsets = await one_file_of_five_frames(tmp_path)
    flip_byte(path, offsets[2] + len(frames[2]) - 5)  # inside frame 3's JSON body

    with pytest.raises(JournalCorruptError) as raised:
        recover(tmp_path)

    text = str(raised.value)
    assert path.name in text and f"offset {offsets[2]}" in text and "frame 3" in text


async def test_a_damaged_last_frame_with_nothing_after_it_is_a_torn_tail(tmp_path: Path) -> None:
    path, frames, offsets = await one_file_of_five_frames(tmp_path)
    flip_byte(path, offsets[4] + len(frames[4]) - 2)  # the last frame's body: never fsynced whole

    recovered, _ = recover(tmp_path)

    assert sorted(recovered.pending["s"]) == list(range(1, 13))
    assert recovered.torn_bytes == len(frames[4])
    assert path.stat().st_size == offsets[4]


async def test_a_damaged_header_followed_only_by_zeros_is_a_torn_tail(tmp_path: Path) -> None:
    path, _, offsets = await one_file_of_five_frames(tmp_path)
    # The filesystem kept the file's new size but not the last write's blocks: zeros.
    data = path.read_bytes()[: offsets[4]] + b"\x00" * 4096
    path.write_bytes(data)

    recovered, _ = recover(tmp_path)

    assert sorted(recovered.pending["s"]) == list(range(1, 13))
    assert path.stat().st_size == offsets[4]


async def test_an_unreadable_checksummed_body_is_refused_without_echoing_it(tmp_path: Path) -> None:
    secret = "s3cr3t-payload-text"
    await write(
        tmp_path,
        frame(KIND_HELD, f'{{"direction": "{secret}"}}'.encode()),
        accepted_frame(messages("s", 1, 1)),
    )

    with pytest.raises(JournalCorruptError) as raised:
        recover(tmp_path)

    # The error reaches logs and the heartbeat's unavailabilityMessage: where, never what.
    assert "frame 1" in str(raised.value) and secret not in str(raised.value)


async def test_a_journal_file_of_the_old_format_is_refused_with_the_fix(tmp_path: Path) -> None:
    # Format 1 (before issue 39): <u32 length><u32 crc32 of kind+body><kind><body>, no file header.
    body = b'A[["s",1,"s-1","p"]]'
    (tmp_path / "journal-000000000001.log").write_bytes(
        struct.pack("<II", len(body), zlib.crc32(body)) + body
    )

    with pytest.raises(JournalError, match="format") as raised:
        recover(tmp_path)

    assert "journal-000000000001.log" in str(raised.value) and "move" in str(raised.value)


async def test_a_checksummed_last_frame_of_an_unknown_kind_is_refused_not_cut(tmp_path: Path) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 3)), frame(b"Z", b"{}"))

    with pytest.raises(JournalCorruptError, match=r"frame 2 at offset .*unknown record kind"):
        recover(tmp_path)  # written whole, by something this broker does not understand


async def test_a_torn_looking_frame_in_a_file_that_newer_files_follow_is_refused(tmp_path: Path) -> None:
    await write(tmp_path, accepted_frame(messages("s", 1, 3)))
    older = journal_files(tmp_path)[0]
    append_bytes(older, accepted_frame(messages("s", 4, 3))[:20])
    (tmp_path / "journal-000000000009.log").write_bytes(FILE_HEADER)

    with pytest.raises(JournalCorruptError, match=rf"{older.name}: frame 2 at offset .*newer journal files"):
        recover(tmp_path)


async def test_an_empty_or_headerless_file_before_a_newer_one_holds_nothing_and_is_no_damage(
    tmp_path: Path,
) -> None:
    # A crash after a rotation created its file but before the header was written, then another
    # crash after the next rotation's file was durable but before the old files were deleted.
    await write(tmp_path, accepted_frame(messages("s", 1, 3)))
    (tmp_path / "journal-000000000002.log").write_bytes(b"")
    (tmp_path / "journal-000000000003.log").write_bytes(FILE_HEADER[:5])
    (tmp_path / "journal-000000000004.log").write_bytes(FILE_HEADER + accepted_frame(messages("s", 4, 2)))

    recovered, last = recover(tmp_path)

    assert sorted(recovered.pending["s"]) == [1, 2, 3, 4, 5] and last == 4
