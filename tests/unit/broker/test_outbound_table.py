"""The outbound stream table's rules, without I/O: seq cursor, bundling, settling, holds, watermarks."""

from __future__ import annotations

from collections.abc import Callable

from broker_contracts.soap import AcceptStatus
from broker_service.journal import FILE_HEADER, RecoveredJournal, scan
from broker_service.outbound import OutboundTable
from broker_service.settings import PoisonPolicy


class ManualClock:
    """Collects ``call_later`` callbacks so a test fires them when it wants (no sleeping)."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.pending.append(callback)

    def fire_all(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback()


def table(
    policy: PoisonPolicy = PoisonPolicy.BLOCK_STREAM, max_deliveries: int = 2
) -> tuple[OutboundTable, ManualClock]:
    clock = ManualClock()
    return (
        OutboundTable(
            max_deliveries=max_deliveries,
            on_poison=policy,
            retry_base_seconds=0.01,
            retry_max_seconds=0.1,
            schedule=clock.call_later,
            on_ready=lambda: None,
        ),
        clock,
    )


def accept(t: OutboundTable, stream: str, seqs: list[int]) -> list[tuple[str, int, AcceptStatus, int | None]]:
    results, accepted, _, _ = t.reserve(
        [stream] * len(seqs), seqs, [f"m{s}" for s in seqs], ["p"] * len(seqs)
    )
    t.commit(accepted)
    return results


def test_seq_rule() -> None:
    t, _ = table()
    assert [r[2] for r in accept(t, "s", [1, 2, 2, 1, 3])] == [
        "Accepted",
        "Accepted",
        "Duplicate",
        "Duplicate",
        "Accepted",
    ]
    assert accept(t, "s", [5]) == [("s", 5, AcceptStatus.GAP, 4)]
    assert [m[1] for m in t.streams["s"].queue] == [1, 2, 3]


def test_a_stream_is_in_one_bundle_at_a_time_and_order_is_kept() -> None:
    t, _ = table()
    accept(t, "a", [1, 2, 3])
    accept(t, "b", [1])
    first = t.take_bundle(limit=2)
    assert [(s.name, [m[1] for m in ms]) for s, ms in first] == [("a", [1, 2])]
    second = t.take_bundle(limit=10)
    assert [(s.name, [m[1] for m in ms]) for s, ms in second] == [("b", [1])]  # a is in flight
    t.settle(first, ["ok", "ok"], {})
    assert [m[1] for _, ms in t.take_bundle(limit=10) for m in ms] == [3]


def test_rejection_retries_then_blocks_the_stream_and_replay_releases_it() -> None:
    t, clock = table(PoisonPolicy.BLOCK_STREAM, max_deliveries=2)
    accept(t, "s", [1, 2, 3])
    bundle = t.take_bundle(10)
    outcome = t.settle(bundle, ["ok", "rejected", "skipped"], {"1": "bad"})
    assert outcome.rejected == 1 and not outcome.held
    assert t.take_bundle(10) == []  # waiting for its retry
    clock.fire_all()
    bundle = t.take_bundle(10)
    assert [m[1] for _, ms in bundle for m in ms] == [2, 3]
    outcome = t.settle(bundle, ["rejected", "skipped"], {})
    assert [(e.seq, e.attempts) for e in outcome.held] == [(2, 2)]
    assert t.take_bundle(10) == []  # blocked
    assert t.watermarks() == {"s": 1}

    t.replay("s", 2)
    bundle = t.take_bundle(10)
    t.settle(bundle, ["ok", "ok"], {})
    assert t.watermarks() == {"s": 3}


def test_hold_policy_goes_on_and_the_watermark_waits_for_the_discard() -> None:
    t, _ = table(PoisonPolicy.HOLD, max_deliveries=1)
    accept(t, "s", [1, 2, 3])
    t.settle(t.take_bundle(10), ["ok", "rejected", "skipped"], {})
    assert [e.seq for e in t.holds.entries()] == [2]
    t.settle(t.take_bundle(10), ["ok"], {})  # seq 3 went on
    assert t.watermarks() == {"s": 1}
    t.discard("s", 2)
    assert t.watermarks() == {"s": 3}
    done = t.confirmed({"s": 3})
    assert [m[1] for m in done] == [1, 2, 3]


def test_resend_cursors_drop_what_another_broker_delivered() -> None:
    t, _ = table()
    recovered = RecoveredJournal()
    for seq in range(1, 11):
        recovered.pending.setdefault("s", {})[seq] = ("s", seq, f"m{seq}", "p")
    recovered.last_accepted["s"] = 10
    t.load(recovered)
    moved = t.apply_resend_cursors({"s": 8, "fresh": 40})
    assert moved == {"s": 7, "fresh": 39}
    assert [m[1] for m in t.streams["s"].queue] == [8, 9, 10]
    assert t.streams["s"].expected == 11
    assert accept(t, "fresh", [40]) == [("fresh", 40, AcceptStatus.ACCEPTED, None)]


def read_back(frames: list[bytes]) -> RecoveredJournal:
    """What recovery makes of ``frames`` as a journal file (the same scan)."""
    recovered = RecoveredJournal()
    scan(FILE_HEADER + b"".join(frames), recovered.apply, source="snapshot", last_file=True)
    return recovered


def test_snapshot_reproduces_unconfirmed_messages() -> None:
    from broker_service.journal import recover

    t, _ = table()
    accept(t, "s", [1, 2, 3])
    t.settle(t.take_bundle(10), ["ok", "ok", "ok"], {})
    t.confirmed({"s": 2})
    recovered = read_back(t.snapshot_frames())
    assert sorted(recovered.pending["s"]) == [3]
    assert recovered.confirmed == {"s": 2}
    assert callable(recover)  # imported for the reader: recovery uses the same scan


def test_a_duplicate_of_a_seq_not_yet_journaled_is_flagged_until_it_is_committed() -> None:
    t, _ = table()
    names, seqs, ids, payloads = ["s"] * 3, [1, 2, 3], ["m1", "m2", "m3"], ["p"] * 3
    first = t.reserve(names, seqs, ids, payloads)
    assert [r[2] for r in first[0]] == ["Accepted"] * 3 and first[3] is False

    # The same bundle again while the first copy is still being journaled: acknowledging these
    # "Duplicate"s now would acknowledge messages that are not durable yet.
    retry = t.reserve(names, seqs, ids, payloads)
    assert [r[2] for r in retry[0]] == ["Duplicate"] * 3 and retry[1] == [] and retry[3] is True
    assert t.reserve(["s"], [4], ["m4"], ["p"])[3] is False  # an Accepted is never "unsettled"

    t.commit(first[1])  # the journal has seqs 1..3
    settled = t.reserve(names, seqs, ids, payloads)
    assert [r[2] for r in settled[0]] == ["Duplicate"] * 3 and settled[3] is False
    assert t.reserve(["s"], [4], ["m4"], ["p"])[3] is True  # seq 4 is reserved, not committed


def test_recovered_and_backend_confirmed_seqs_count_as_durable() -> None:
    t, _ = table()
    recovered = RecoveredJournal()
    recovered.pending["s"] = {seq: ("s", seq, f"m{seq}", "p") for seq in (1, 2, 3)}
    recovered.last_accepted["s"] = 3
    t.load(recovered)
    assert t.reserve(["s", "s"], [1, 3], ["m1", "m3"], ["p", "p"])[3] is False
    t.apply_resend_cursors({"fresh": 40})  # the backend had 1..39 of "fresh" confirmed elsewhere
    assert t.reserve(["fresh"], [39], ["m39"], ["p"])[3] is False


def test_a_duplicate_answer_is_settled_as_delivered_and_reported_as_deduplicated() -> None:
    t, _ = table()
    accept(t, "s", [1, 2, 3])
    outcome = t.settle(t.take_bundle(10), ["duplicate", "duplicate", "ok"], {})
    # The cloud had 1 and 2 (a delivery a crash kept out of the log): the message log proves them so.
    assert [m[1] for m in outcome.deduplicated] == [1, 2]
    assert [m[1] for m in outcome.delivered] == [3]
    assert not t.streams["s"].queue


def restarted(t: OutboundTable, policy: PoisonPolicy = PoisonPolicy.BLOCK_STREAM) -> OutboundTable:
    """A new table loaded from ``t``'s compaction snapshot, as a restarted broker's would be."""
    recovered = read_back(t.snapshot_frames())
    again, _ = table(policy)
    again.load(recovered)
    return again


def test_a_blocking_hold_is_restored_held_and_not_tried_again() -> None:
    t, clock = table(PoisonPolicy.BLOCK_STREAM, max_deliveries=2)
    accept(t, "s", [1, 2, 3, 4])
    t.settle(t.take_bundle(10), ["ok", "rejected", "skipped", "skipped"], {"1": "bad"})
    clock.fire_all()
    t.settle(t.take_bundle(10), ["rejected", "skipped", "skipped"], {"0": "still bad"})
    (held,) = t.holds.entries()

    # Under another policy after the restart: the hold keeps what was decided when it was made.
    again = restarted(t, PoisonPolicy.HOLD)

    (restored,) = again.holds.entries()
    assert restored.view() == held.view()  # same attempts, same heldSince, same error
    assert restored.blocks_stream
    assert again.take_bundle(10) == []  # blocked at seq 2: nothing is forwarded
    assert again.watermarks() == {"s": 1}  # seq 1 had reached the cloud before the stream stopped
    again.replay("s", 2)
    bundle = again.take_bundle(10)
    assert [m[1] for _, ms in bundle for m in ms] == [2, 3, 4]
    again.settle(bundle, ["ok", "ok", "ok"], {})
    assert again.watermarks() == {"s": 4}


def test_a_parked_hold_and_a_discard_are_restored_out_of_the_queue() -> None:
    t, _ = table(PoisonPolicy.HOLD, max_deliveries=1)
    accept(t, "s", [1, 2, 3, 4, 5])
    t.settle(t.take_bundle(10), ["ok", "rejected", "skipped", "skipped", "skipped"], {})
    t.settle(t.take_bundle(10), ["ok", "rejected", "skipped"], {})  # 3 ok, 4 held too
    t.discard("s", 4)
    assert [e.seq for e in t.holds.entries()] == [2]
    assert t.discarded == {"s": {4}}

    again = restarted(t)

    assert [(e.seq, e.blocks_stream) for e in again.holds.entries()] == [(2, False)]
    assert again.discarded == {"s": {4}}
    # Neither the parked nor the discarded message goes to the cloud again; the others are
    # unconfirmed, so they are resent (the cloud answers duplicate for 1 and 3).
    bundle = again.take_bundle(10)
    assert [m[1] for _, ms in bundle for m in ms] == [1, 3, 5]
    again.settle(bundle, ["duplicate", "duplicate", "ok"], {})
    assert again.watermarks() == {"s": 1}  # still below the held seq 2
    again.discard("s", 2)
    assert again.watermarks() == {"s": 5}
    assert [m[1] for m in again.confirmed({"s": 5})] == [1, 2, 3, 4, 5]
    assert again.discarded == {}  # confirmed: nothing left to remember


def test_the_backends_cursor_ends_holds_and_discards_another_broker_resolved() -> None:
    t, _ = table(PoisonPolicy.HOLD, max_deliveries=1)
    accept(t, "s", [1, 2, 3])
    t.settle(t.take_bundle(10), ["rejected", "skipped", "skipped"], {})
    t.settle(t.take_bundle(10), ["ok", "ok"], {})
    assert t.apply_resend_cursors({"s": 4}) == {"s": 3}  # the backend had it all confirmed elsewhere
    assert t.holds.entries() == []
    frames = t.snapshot_frames()
    recovered = read_back(frames)
    assert recovered.holds == {} and recovered.pending.get("s", {}) == {}
