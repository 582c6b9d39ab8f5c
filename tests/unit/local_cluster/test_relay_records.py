"""Relay.record_violations: the judgement over the simulators' records, on canned records.

The simulators' /sim API is replaced by fixed answers here (a boundary: the real one needs the
sealed cluster, where tests/e2e and the soak call it); what is tested is the counting alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from local_cluster.relay import Relay


class CannedRelay(Relay):
    def __init__(self, answers: dict[str, Any], streams: int = 2) -> None:
        super().__init__(None, "ns", "release", "http://backend", "http://cloud", streams)  # type: ignore[arg-type]
        self.answers = answers

    def backend(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.answers["backend" + path]

    def cloud(self, path: str, payload: dict[str, Any] | None = None) -> Any:
        return self.answers["cloud" + path]


def answers(
    outbound: dict[str, list[int]], inbound: dict[str, list[int]], cursors: dict[str, int]
) -> dict[str, Any]:
    return {
        "backend/sim/status": {"cursors": cursors},
        "cloud/sim/status": {"inboundTotal": 6},  # 3 per stream
        "cloud/sim/received": outbound,
        "backend/sim/received": inbound,
    }


CLEAN_INBOUND = {"in-a": [1, 2, 3], "in-b": [1, 2, 3]}


def test_clean_records_while_traffic_flows() -> None:
    # The cloud already took seq 4 of stream a, beyond the confirmed cursor: not a violation.
    relay = CannedRelay(answers({"a": [1, 2, 3, 4], "b": [1, 2]}, CLEAN_INBOUND, {"a": 4, "b": 3}))
    assert relay.record_violations() == {"lost": 0, "twice": 0, "out-of-order": 0}


@pytest.mark.parametrize(
    ("outbound", "inbound", "expected"),
    [
        ({"a": [1, 3], "b": [1, 2]}, CLEAN_INBOUND, {"lost": 1, "twice": 0, "out-of-order": 0}),
        ({"b": [1, 2]}, CLEAN_INBOUND, {"lost": 3, "twice": 0, "out-of-order": 0}),  # stream a never arrived
        ({"a": [1, 2, 2, 3], "b": [1, 2]}, CLEAN_INBOUND, {"lost": 0, "twice": 1, "out-of-order": 1}),
        ({"a": [1, 3, 2], "b": [1, 2]}, CLEAN_INBOUND, {"lost": 0, "twice": 0, "out-of-order": 1}),
        ({"a": [1, 2, 3], "b": [1, 2]}, {"in-a": [1, 2, 3]}, {"lost": 3, "twice": 0, "out-of-order": 0}),
        (
            {"a": [1, 2, 3], "b": [1, 2]},
            {"in-a": [1, 3], "in-b": [1, 2, 3]},
            {"lost": 1, "twice": 0, "out-of-order": 0},
        ),
    ],
)
def test_each_violation_is_counted(
    outbound: dict[str, list[int]], inbound: dict[str, list[int]], expected: dict[str, int]
) -> None:
    relay = CannedRelay(answers(outbound, inbound, {"a": 4, "b": 3}))
    assert relay.record_violations() == expected
