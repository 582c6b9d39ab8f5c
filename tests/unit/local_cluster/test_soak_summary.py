"""The soak's per-fault figures: the longest pause in confirmations and the per-kind summary."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from pathlib import Path

from broker_contracts.message_log import encode, format_ts, validate
from local_cluster.soak_summary import (
    ConfirmationWatch,
    FaultCost,
    activations_by_kind,
    activations_line,
    logged_activations,
    longest_pause,
    plot,
    summary_lines,
)


def test_the_longest_pause_counts_from_the_fault_to_the_first_confirmation_after_it() -> None:
    # Fault at 10.0; confirmations went on at 10.05, stopped, came back at 11.3 and kept coming.
    assert longest_pause([10.05, 11.3, 11.4, 11.5], 10.0, 12.0) == 11.3 - 10.05
    # Nothing confirmed until 10.7: the pause starts at the fault.
    assert longest_pause([10.7, 10.8], 10.0, 11.0) == 10.7 - 10.0


def test_a_window_without_any_confirmation_is_one_pause_to_its_end() -> None:
    assert longest_pause([], 5.0, 8.5) == 3.5


def test_the_watch_keeps_the_instants_the_count_grew() -> None:
    counts = iter([1, 1, 2, 2, 2, 3])
    watch = ConfirmationWatch(lambda: next(counts, 3))
    watch.start()
    deadline = time.monotonic() + 30  # a failure limit; six samples take about 0.3 s
    while len(watch.instants()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert not watch.is_alive()
    grew = watch.instants()
    assert len(grew) == 3 and grew == sorted(grew), grew  # 1, then 2, then 3; never 3 again
    # The open tail after the last growth is not a pause: the longest one is between growths.
    assert watch.longest_pause(grew[0], grew[-1] + 10) == max(grew[1] - grew[0], grew[2] - grew[1])


def test_a_failing_sample_is_skipped_not_fatal() -> None:
    calls = {"n": 0}

    def flaky() -> int:
        calls["n"] += 1
        if calls["n"] % 2:
            raise OSError("connection refused")
        return calls["n"]

    watch = ConfirmationWatch(flaky)
    watch.start()
    deadline = time.monotonic() + 30
    while len(watch.instants()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert len(watch.instants()) >= 3  # the failed samples in between stopped nothing


def test_the_summary_gives_median_and_max_per_kind_in_order(tmp_path: Path) -> None:
    costs = [
        FaultCost("kill-active", 0.4, 20.0),
        FaultCost("kill-standby", 0.1, 15.0),
        FaultCost("kill-active", 0.6, 30.0),
        FaultCost("kill-active", 2.0, 25.0),
    ]
    lines = summary_lines(costs)
    assert [line.split()[0] for line in lines] == ["kill-active", "kill-standby"]
    assert "x3" in lines[0] and "pause median   0.6s max   2.0s" in lines[0], lines[0]
    assert "full recovery median  25.0s max  30.0s" in lines[0], lines[0]
    plot(costs, tmp_path / "recovery.png")
    assert (tmp_path / "recovery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_summary_ends_with_the_normal_gap_that_an_operator_faults_pause_is_read_against() -> None:
    costs = [FaultCost("kill-operator", 0.2, 12.0), FaultCost("upgrade-operator", 0.7, 9.0)]
    lines = summary_lines(costs, normal_gap=0.1)
    assert [line.split()[0] for line in lines] == ["kill-operator", "upgrade-operator", "(no"]
    assert "upgrade-operator   x1   traffic pause median   0.7s max   0.7s" in lines[1], lines[1]
    assert "normal gap between confirmations median  0.10s" in lines[2], lines[2]
    assert len(summary_lines(costs)) == 2  # without a normal gap, the kinds alone, as before


def test_the_normal_gap_is_the_median_gap_between_growths() -> None:
    counts = iter([1, 2, 3, 4])
    watch = ConfirmationWatch(lambda: next(counts, 4))
    assert watch.normal_gap() is None  # nothing seen yet
    watch.start()
    deadline = time.monotonic() + 30  # a failure limit; four samples take about 0.2 s
    while len(watch.instants()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    grew = watch.instants()
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(grew))
    assert len(grew) == 4 and watch.normal_gap() == gaps[1], (grew, watch.normal_gap())


def _line(event: str, at: float, **message: object) -> bytes:
    fields = {"direction": None, "stream": None, "seq": None, "msgId": None, "attempt": None, **message}
    ts = format_ts(datetime.fromtimestamp(at, UTC))
    return encode(validate({"event": event, "ts": ts, "cluster": "orders", "broker": "orders-0",
                            "epoch": 2, "account": "acme", "company": "1000", **fields}))  # fmt: skip


def test_an_operator_fault_counts_when_a_broker_logged_activated_between_it_and_its_recovery(
    tmp_path: Path,
) -> None:
    """The brokers' own message logs, closed and open segments, a torn last line skipped."""
    segments = tmp_path / "ns" / "orders-0"
    segments.mkdir(parents=True)
    delivered = {"direction": "outbound", "stream": "s1", "seq": 1, "msgId": "m1", "attempt": 1}
    (segments / "a.jsonl").write_bytes(_line("activated", 100.0) + _line("confirmed", 101.0, **delivered))
    (segments / "b.jsonl.open").write_bytes(_line("activated", 205.5) + b'{"event": "activ')
    activated = logged_activations(tmp_path)
    assert activated == [100.0, 205.5]
    costs = [
        FaultCost("upgrade-operator", 0.1, 9.0, began_at=95.0, ended_at=104.0),  # the first activation
        FaultCost("kill-operator", 0.1, 5.0, began_at=150.0, ended_at=155.0),  # nothing in it
        FaultCost("upgrade-operator", 0.8, 9.0, began_at=200.0, ended_at=209.0),  # the second
        FaultCost("kill-active", 0.4, 3.0, began_at=300.0, ended_at=303.0),  # not an operator fault
    ]
    counts = activations_by_kind(costs, activated, ("kill-operator", "upgrade-operator"))
    assert counts == {"kill-operator": 0, "upgrade-operator": 2}
    assert activations_line(costs, counts).endswith("kill-operator 0 of 1, upgrade-operator 2 of 2")
    assert activations_by_kind(costs[1:2], activated, ("upgrade-operator",)) == {}  # none of that kind ran
