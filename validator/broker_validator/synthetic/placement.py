"""Where each injected anomaly goes: marks on planned bundles, zombie records, second activations.

Each instance must produce exactly one finding of its class and nothing else, so instances sit on
distinct streams while there are enough, on distinct stream runs always, never in a crashed burst
(its resend would mix with the instance), and split-brain instances each on an epoch of their own.
``lost`` and the other message classes go well before the settle horizon, ``in-flight`` into the
last burst. What it deliberately does not do: write anything. The history generator reads the
marks while it builds bundles and fills in each instance's stream, seq, broker and epoch.
``malformed`` lines are placed after writing, by :mod:`.generate`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from broker_validator.report_schema import Anomaly
from broker_validator.synthetic.manifest import INJECTABLE, InjectedAnomaly
from broker_validator.synthetic.plan import DIRECTIONS, MAX_DELIVERIES, ClusterPlan

_DETAILS: Final = {
    Anomaly.LOST.value: "accepted and forwarded, never delivered",
    Anomaly.DUPLICATE_DELIVERY.value: "delivered again (forwarded attempt 2) one tick after its delivery",
    Anomaly.OUT_OF_ORDER.value: "delivered one tick after the next three seqs of its stream",
    Anomaly.GAP.value: "never accepted: the source skipped this seq",
    Anomaly.IN_FLIGHT.value: "accepted and forwarded in the last burst, not delivered yet",
    Anomaly.HELD.value: f"forwarded {MAX_DELIVERIES} times, then held",
    Anomaly.DISCARDED.value: f"forwarded {MAX_DELIVERIES} times, then discarded (no held record)",
}
_MESSAGE_KINDS: Final = (
    Anomaly.LOST.value,
    Anomaly.DUPLICATE_DELIVERY.value,
    Anomaly.OUT_OF_ORDER.value,
    Anomaly.GAP.value,
    Anomaly.IN_FLIGHT.value,
    Anomaly.HELD.value,
    Anomaly.DISCARDED.value,
)


@dataclass
class Injections:
    """Injected instances in generation order; marks on bundles point into ``items``."""

    items: list[InjectedAnomaly] = field(default_factory=list)
    zombies: dict[tuple[str, int], int] = field(default_factory=dict)  # (cluster, failover no.) -> item
    second_activations: dict[tuple[str, int], int] = field(default_factory=dict)  # (cluster, epoch) -> item


def place_injections(
    plans: list[ClusterPlan],
    inject: Mapping[str, int],
    *,
    streams: int,
    settle_seconds: float,
    epochs: list[int],
    rng: random.Random,
) -> Injections:
    """Choose where each instance goes; ``epochs[c]`` is cluster c's epoch before this part (0: none)."""
    unknown = set(inject) - set(INJECTABLE)
    if unknown:
        raise ValueError(f"cannot inject {sorted(unknown)}; injectable classes are {list(INJECTABLE)}")
    negative = {kind: n for kind, n in inject.items() if n < 0}
    if negative:
        raise ValueError(f"injection counts must not be negative: {negative}")
    found = Injections()
    used_streams: set[tuple[int, int, int]] = set()  # (cluster, direction, stream)
    used_slots: set[tuple[int, int, int, int, int]] = set()  # (cluster, direction, burst, bundle, run)
    for kind in _MESSAGE_KINDS:
        wanted = inject.get(kind, 0)
        candidates = _candidates(plans, kind, settle_seconds) if wanted else []
        for _ in range(wanted):
            _place_message(
                found,
                plans,
                kind,
                candidates,
                streams=streams,
                used_streams=used_streams,
                used_slots=used_slots,
                rng=rng,
            )
    _place_split_brain(found, plans, inject.get(Anomaly.SPLIT_BRAIN.value, 0), epochs, rng)
    return found


def _candidates(plans: list[ClusterPlan], kind: str, settle_seconds: float) -> list[tuple[int, int]]:
    """(cluster, burst) pairs that can take an instance of ``kind``: never a crashed burst (its
    resend would mix with the instance); in-flight in the last burst, everything else well before
    the settle horizon, with room for the drift failovers add to the clock."""
    candidates: list[tuple[int, int]] = []
    for c, plan in enumerate(plans):
        last = len(plan.bursts) - 1
        if kind == Anomaly.IN_FLIGHT.value:
            candidates.append((c, last))
            continue
        latest = plan.bursts[last].start - int((settle_seconds + 120 + 5 * plan.failovers) * 1e6)
        candidates += [
            (c, b)
            for b, burst in enumerate(plan.bursts[:last])
            if burst.crash is None and burst.start < latest
        ]
    if not candidates:
        raise ValueError(f"no burst can take a {kind!r} instance: the history is too short or too crowded")
    return candidates


def _place_message(
    found: Injections,
    plans: list[ClusterPlan],
    kind: str,
    candidates: list[tuple[int, int]],
    *,
    streams: int,
    used_streams: set[tuple[int, int, int]],
    used_slots: set[tuple[int, int, int, int, int]],
    rng: random.Random,
) -> None:
    """Mark one stream run of one bundle; a stream no other instance uses, while there are such."""
    for attempt in range(2000):
        c, b = rng.choice(candidates)
        d = rng.randrange(2)
        batches = plans[c].bursts[b].batches[d]
        if not batches:
            continue
        i = rng.randrange(len(batches))
        slot = rng.randrange(batches[i].streams)
        stream = (batches[i].cursor + slot) % streams
        if (c, d, b, i, slot) in used_slots or (attempt < 1000 and (c, d, stream) in used_streams):
            continue
        used_slots.add((c, d, b, i, slot))
        used_streams.add((c, d, stream))
        batches[i].marks.append((kind, slot, len(found.items)))
        found.items.append(InjectedAnomaly(kind, plans[c].name, DIRECTIONS[d], detail=_DETAILS[kind]))
        return
    raise ValueError(f"could not place every {kind!r} instance: too few messages")


def _place_split_brain(
    found: Injections, plans: list[ClusterPlan], wanted: int, epochs: list[int], rng: random.Random
) -> None:
    """Zombie records (after failover n of this part, which ends epoch base + n - 1) and second
    activations, alternately, each on an epoch of its own: a zombie of epoch e and a second
    activation of e would both be findings of epoch e. Second activations take the top epoch
    first, which no zombie can use, so every epoch can carry one instance."""
    if not wanted:
        return
    zombies = [
        (c, number, max(epochs[c], 1) + number - 1)
        for c, plan in enumerate(plans)
        for number in range(1, plan.failovers + 1)
    ]
    rng.shuffle(zombies)
    doubles: list[tuple[int, int]] = []
    for c, plan in enumerate(plans):
        if len(plan.brokers) > 1:
            top = max(epochs[c], 1) + plan.failovers
            others = list(range(epochs[c] + 1, top))
            rng.shuffle(others)
            doubles += [(c, top), *((c, epoch) for epoch in others)]
    taken: set[tuple[int, int]] = set()
    for index in range(wanted):
        zombie = next(((c, n, e) for c, n, e in zombies if (c, e) not in taken), None)
        double = next(((c, e) for c, e in doubles if (c, e) not in taken), None)
        if zombie is not None and (double is None or index % 2 == 0):
            c, number, epoch = zombie
            found.zombies[(plans[c].name, number)] = len(found.items)
        elif double is not None:
            c, epoch = double
            found.second_activations[(plans[c].name, epoch)] = len(found.items)
        else:
            raise ValueError(
                f"cannot inject {wanted} split-brain instances: at most one per epoch (a zombie record "
                f"after a failover, or a second activation with two or more brokers); room for {index}"
            )
        taken.add((c, epoch))
        found.items.append(InjectedAnomaly(Anomaly.SPLIT_BRAIN.value, plans[c].name))
