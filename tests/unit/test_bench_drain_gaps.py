"""bench-drain's switchover gaps from the brokers' own message logs (no cluster needed)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_drain import Switchover, _logged_events, logged_gaps


def _line(broker: str, event: str, ts: str) -> str:
    record = {
        "event": event,
        "ts": f"2026-11-27T08:00:{ts}Z",
        "cluster": "orders",
        "broker": broker,
        "epoch": 3,
        "direction": None,
        "account": "acme",
        "company": "1000",
        "stream": None,
        "seq": None,
        "msgId": None,
        "attempt": None,
    }
    if event == "accepted":
        seq = int(ts.replace(".", ""))
        record.update(direction="outbound", stream="orders-0000", seq=seq, msgId=f"orders-0000-{seq}")
    return json.dumps(record, separators=(",", ":"))


def test_gaps_come_from_the_old_actives_last_records_and_the_new_ones_first(tmp_path: Path) -> None:
    old = tmp_path / "orders" / "orders-0"
    new = tmp_path / "orders" / "orders-1"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    (old / "a-000000-orders-0.jsonl").write_text(
        "\n".join(
            [
                _line("orders-0", "accepted", "01.000000"),  # before the drain: not this switchover's
                _line("orders-0", "accepted", "05.000000"),
                _line("orders-0", "accepted", "05.020000"),
                _line("orders-0", "deactivated", "05.050000"),
            ]
        )
        + "\n"
    )
    # An open segment counts too, and its torn last line is left out.
    (new / "b-000000-orders-1.jsonl.open").write_text(
        _line("orders-1", "activated", "05.090000")
        + "\n"
        + _line("orders-1", "accepted", "05.140000")
        + "\n"
        + '{"event":"acc'
    )
    events = _logged_events(tmp_path)
    since = events[("orders-0", "accepted")][0] + 2000  # 08:00:03
    traffic, idle = logged_gaps(events, Switchover("orders-0", "orders-1", since)) or (0, 0)
    assert round(traffic) == 120  # 05.020 -> 05.140
    assert round(idle) == 40  # 05.050 -> 05.090
    # A switchover whose new active never logged an activation has no figure.
    assert logged_gaps(events, Switchover("orders-1", "orders-0", since)) is None
