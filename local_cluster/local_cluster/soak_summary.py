"""What each fault of the chaos soak cost: the pause in traffic and the time to full recovery.

Two figures per fault, because they answer different questions:

- **traffic pause**: the longest time the backend simulator saw no new confirmation, from the
  fault until the fault was recovered. A kill of the active pauses traffic until the failover has
  moved the ``-active`` Service (issue 23's figure); a kill of the standby should not pause it.
- **full recovery**: until the cluster is Healthy, every pod is Ready again and an operator
  heartbeats again; after a kill this includes the kubelet's restart back-off of the container.

``ConfirmationWatch`` samples the backend's confirmed count in the background; ``summary_lines``
prints median and max per kind of fault, and ``plot`` draws each fault's two figures per kind.

A fault that should not pause traffic (the operator's own, issue 40) still shows a "pause": the
longest gap between two confirmations the watch saw, which is never zero under a feeder that
produces every 100 ms and a watch that samples every 50 ms plus its call. The summary's last line
gives that normal gap over the whole run (the median gap between confirmations), so a kind's
pause is read against it: no pause means about as long as that, not 0. And the brokers' own
message logs say whether such a fault made a broker active again (``activations_by_kind``: a
lease that ran out, a new epoch), which the status, written later, may not show yet when the
fault counts as recovered.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_contracts.message_log import Event, MessageLogError, decode, parse_ts

SAMPLE_SECONDS = 0.05


@dataclass(frozen=True)
class FaultCost:
    kind: str
    pause_seconds: float
    recovery_seconds: float
    # Wall-clock seconds from the fault to its recovery: the brokers' message logs are stamped
    # with the (shared) wall clock, not this process's monotonic one.
    began_at: float = 0.0
    ended_at: float = 0.0


def logged_activations(store: Path) -> list[float]:
    """When a broker logged ``activated`` in the message-log store (closed and open segments), as
    wall seconds, sorted: each is a broker made active, the first time or at a new epoch."""
    found = []
    for segment in sorted(store.glob("*/*/*.jsonl*")):
        for line in segment.read_text(encoding="utf-8").splitlines():
            try:
                record = decode(line)
            except MessageLogError:
                continue  # a torn last line of an open segment
            if record["event"] == Event.ACTIVATED.value:
                found.append(parse_ts(record["ts"]).timestamp())
    return sorted(found)


def activations_by_kind(
    costs: Sequence[FaultCost], activated: Sequence[float], kinds: Sequence[str]
) -> dict[str, int]:
    """Per kind in ``kinds`` that occurred, how many of its faults saw a broker activated between
    the fault and its recovery. For the operator's own faults that is a lease that ran out (the
    active fenced itself and was activated again at a new epoch): issue 40's goal is none."""
    return {
        kind: sum(
            any(cost.began_at <= at <= cost.ended_at for at in activated)
            for cost in costs
            if cost.kind == kind
        )
        for kind in kinds
        if any(cost.kind == kind for cost in costs)
    }


def activations_line(costs: Sequence[FaultCost], counts: dict[str, int]) -> str:
    shown = ", ".join(f"{kind} {n} of {sum(c.kind == kind for c in costs)}" for kind, n in counts.items())
    return f"operator faults that activated a broker again (its lease ran out; goal 0): {shown}"


class ConfirmationWatch(threading.Thread):
    """Samples ``confirmed()`` every ``SAMPLE_SECONDS`` and keeps the instants it grew."""

    def __init__(self, confirmed: Callable[[], int]) -> None:
        super().__init__(name="confirmation-watch", daemon=True)
        self._confirmed = confirmed
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._grew: list[float] = []

    def run(self) -> None:
        last = -1
        while not self._stopping.wait(SAMPLE_SECONDS):
            try:
                count = self._confirmed()
            except Exception:  # a failed sample is a missed sample, not a failure
                continue
            if count > last:
                with self._lock:
                    self._grew.append(time.monotonic())
                last = count

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)

    def instants(self) -> list[float]:
        """When the count was seen to grow, oldest first."""
        with self._lock:
            return list(self._grew)

    def normal_gap(self) -> float | None:
        """The median gap between two confirmations seen over the whole run (most of it is
        traffic at its normal pace), or None before two were seen."""
        grew = self.instants()
        gaps = [later - earlier for earlier, later in itertools.pairwise(grew)]
        return statistics.median(gaps) if gaps else None

    def longest_pause(self, start: float, end: float) -> float:
        """The longest stretch in [start, end] with no new confirmation."""
        return longest_pause([instant for instant in self.instants() if start < instant <= end], start, end)


def longest_pause(grew: Sequence[float], start: float, end: float) -> float:
    """The longest gap from ``start`` through the instants in ``grew`` (sorted, inside the window),
    each gap ending at a new confirmation; with no instant, the whole window up to ``end``. The
    time after the last instant is not a pause: traffic was flowing again."""
    bounds = [start, *grew] if grew else [start, end]
    return max(later - earlier for earlier, later in itertools.pairwise(bounds))


def summary_lines(costs: Sequence[FaultCost], normal_gap: float | None = None) -> list[str]:
    """Median and max per kind, in the order the kinds first occurred; then, given, the normal gap
    between confirmations to read the pauses against."""
    lines = []
    for kind in dict.fromkeys(cost.kind for cost in costs):
        mine = [cost for cost in costs if cost.kind == kind]
        pauses = [cost.pause_seconds for cost in mine]
        full = [cost.recovery_seconds for cost in mine]
        lines.append(
            f"{kind:18} x{len(mine):<3} traffic pause median {statistics.median(pauses):5.1f}s "
            f"max {max(pauses):5.1f}s; full recovery median {statistics.median(full):5.1f}s "
            f"max {max(full):5.1f}s"
        )
    if normal_gap is not None:
        lines.append(
            f"{'(no fault)':18}      normal gap between confirmations median {normal_gap:5.2f}s "
            "(an operator fault's goal: no pause, a pause about this long)"
        )
    return lines


def plot(costs: Sequence[FaultCost], path: Path) -> None:
    """One row per kind of fault: each fault's traffic pause and full recovery as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(cost.kind for cost in costs))
    figure, axes = plt.subplots(figsize=(10, 0.6 * len(kinds) + 1.6))
    for row, kind in enumerate(kinds):
        mine = [cost for cost in costs if cost.kind == kind]
        axes.scatter([c.pause_seconds for c in mine], [row + 0.12] * len(mine), marker="|", s=160,
                     color="tab:red", label="traffic pause" if row == 0 else None)  # fmt: skip
        axes.scatter([c.recovery_seconds for c in mine], [row - 0.12] * len(mine), marker="|", s=160,
                     color="tab:blue", label="full recovery" if row == 0 else None)  # fmt: skip
    axes.set_yticks(range(len(kinds)), kinds)
    axes.set_xscale("symlog", linthresh=1)
    axes.set_xlim(left=0)  # durations: nothing left of the fault (symlog would show -1 s)
    axes.set_xlabel("seconds after the fault (log scale above 1 s)")
    axes.set_title(f"chaos soak: {len(costs)} faults")
    axes.grid(axis="x", alpha=0.3)
    # Above the rows, not over the dots of one of them.
    axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.04), ncol=2, frameon=False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
