"""The per-cluster history generator: a plan turned into the records its brokers would log.

A burst is a pipeline of bundles per direction: at each tick the broker logs ``accepted`` for
bundle *k*, ``forwarded`` for *k-1*, ``delivered`` for *k-2* and ``confirmed`` for *k-3*, one
timestamp per logged bundle (a broker writes a bundle's records in one call), ticks milliseconds
apart; every broker's file is in time order. A planned failover drains the pipeline, logs
``deactivated``, and the next broker logs ``activated`` with the next epoch. A crash stops a burst
in the middle without ``deactivated``: the bundle the broker had forwarded (the target took it, the
``delivered`` record never made it to the log) and the unconfirmed ones are resent to the next
active, which accepts them again; the target answers ``duplicate`` for what it already had, logged
as ``deduplicated``, and takes the rest. Injected instances are written where the plan's marks say,
and the expected counts of the non-violations this produces (``crashed-term``, ``deduplicated``)
are added as they happen.

What it deliberately does not model: payloads (the log has none), retries other than a poison
message's, replays of held messages, and clock skew between brokers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from broker_contracts.message_log import Direction, Event
from broker_validator.report_schema import Anomaly
from broker_validator.synthetic.placement import Injections
from broker_validator.synthetic.plan import (
    DIRECTIONS,
    MAX_DELIVERIES,
    PER_STREAM,
    BatchPlan,
    BurstPlan,
    ClusterPlan,
    ClusterState,
)
from broker_validator.synthetic.segments import SegmentWriter, StoreWriter

_STREAM_PREFIX: Final = {Direction.OUTBOUND.value: "orders-", Direction.INBOUND.value: "invoices-"}
_FRAGMENT_SEQ = re.compile(r'^"(?P<stream>[^"]*)","seq":(?P<seq>\d+),')

Group = tuple[str, int | None, list[str]]
"""(event, attempt, message fragments): the records one logging call writes, sharing one ts."""


@dataclass
class Batch:
    """A built bundle: per pipeline stage (accepted, forwarded, delivered, confirmed) its groups."""

    stages: tuple[list[Group], list[Group], list[Group], list[Group]]
    fragments: list[str]  # every message it carries, in order: what a crash leaves to resend


class ClusterGenerator:
    """Writes one cluster's part of the history from its plan."""

    def __init__(
        self,
        store: StoreWriter,
        plan: ClusterPlan,
        state: ClusterState,
        *,
        injections: Injections,
        expected: dict[str, int],
        streams: int,
        rng: random.Random,
    ) -> None:
        self.store = store
        self.plan = plan
        self.state = state
        self.injections = injections
        self.expected = expected
        self.rng = rng
        self.writers = [
            SegmentWriter(store, plan.name, broker, plan.account, plan.company) for broker in plan.brokers
        ]
        for writer, index in zip(self.writers, state.segment_index, strict=True):
            writer.index = index
        self.names = [[f"{_STREAM_PREFIX[d]}{i:04d}" for i in range(streams)] for d in DIRECTIONS]
        self.prefixes = [
            [(f'"{name}","seq":', f',"msgId":"{name}-') for name in names] for names in self.names
        ]
        self.last_confirmed: list[str] = ["", ""]  # per direction: a zombie record's message

    # -- lifecycle --

    @property
    def writer(self) -> SegmentWriter:
        return self.writers[self.state.active]

    def activate(self, micros: int) -> None:
        """The next broker (another one where there is one) activates with the next epoch."""
        state = self.state
        brokers = len(self.writers)
        if state.epoch > 0 and brokers > 1:
            state.active = (state.active + self.rng.randrange(1, brokers)) % brokers
        state.epoch += 1
        state.now = micros
        self.writer.lifecycle(Event.ACTIVATED.value, micros, state.epoch)
        item = self.injections.second_activations.get((self.plan.name, state.epoch))
        if item is not None:  # another broker claims the same epoch and gives it up again
            other = self.writers[(state.active + 1) % brokers]
            other.lifecycle(Event.ACTIVATED.value, micros + 1_000, state.epoch)
            other.lifecycle(Event.DEACTIVATED.value, micros + 2_000, state.epoch)
            other.close()
            self._located(item, broker=other.broker, epoch=state.epoch, detail="a second activated record")
        state.now = micros + 3_000

    def fail_over(self, number: int, *, crashed: bool) -> None:
        state, writer = self.state, self.writer
        if not crashed:
            state.now += self.rng.randint(1_000, 5_000)
            writer.lifecycle(Event.DEACTIVATED.value, state.now, state.epoch)
        # Kill detection takes a heartbeat or two; a planned move is a drain and one call.
        delay = self.rng.randint(400_000, 1_500_000) if crashed else self.rng.randint(50_000, 150_000)
        activated_at = state.now + delay
        item = self.injections.zombies.get((self.plan.name, number))
        if item is not None:
            d = 0 if self.last_confirmed[0] else 1
            fragment = self.last_confirmed[d]
            writer.messages(
                Event.CONFIRMED.value,
                activated_at + 5_000,
                state.epoch,
                DIRECTIONS[d],
                attempt=None,
                frags=[fragment],
            )
            match = _FRAGMENT_SEQ.match(fragment)
            assert match is not None
            self._located(
                item,
                direction=DIRECTIONS[d],
                stream=match["stream"],
                seq=int(match["seq"]),
                broker=writer.broker,
                epoch=state.epoch,
                detail="a confirmed record after the next epoch was activated",
            )
        writer.close()
        state.failovers += 1
        if crashed:
            state.crashes += 1
            self.expected[Anomaly.CRASHED_TERM.value] += 1
        self.activate(activated_at)

    def _located(self, item: int, **where: Any) -> None:
        for key, value in where.items():
            setattr(self.injections.items[item], key, value)

    # -- bundles --

    def build(self, d: int, plan: BatchPlan, tick: int, extras: dict[int, list[Group]]) -> Batch:
        """The bundle's fragments (advancing each stream's seq), with its injected changes."""
        names, prefixes, next_seq = self.names[d], self.prefixes[d], self.state.next_seq[d]
        count = len(names)
        fragments: list[str] = []
        for j in range(plan.streams):
            s = (plan.cursor + j) % count
            first = next_seq[s]
            next_seq[s] = first + PER_STREAM
            before, after = prefixes[s]
            fragments += [f'{before}{q}{after}{q}"' for q in range(first, first + PER_STREAM)]
        self.state.accepted[d] += len(fragments)
        self.state.messages[d] += len(fragments)
        accepted = forwarded = delivered = confirmed = fragments
        direction = DIRECTIONS[d]
        for kind, slot, item in plan.marks:
            s = (plan.cursor + slot) % count
            position = 0 if kind == Anomaly.OUT_OF_ORDER.value else 1
            index = slot * PER_STREAM + position
            seq = next_seq[s] - PER_STREAM + position
            fragment = fragments[index]
            later: list[Group] = []
            if kind == Anomaly.GAP.value:
                accepted, forwarded = _without(accepted, fragment), _without(forwarded, fragment)
                self.state.accepted[d] -= 1
            if kind != Anomaly.DUPLICATE_DELIVERY.value:
                delivered, confirmed = _without(delivered, fragment), _without(confirmed, fragment)
                self.state.messages[d] -= 1
            if kind == Anomaly.DUPLICATE_DELIVERY.value:
                later = [(Event.FORWARDED.value, 2, [fragment]), (Event.DELIVERED.value, None, [fragment])]
                extras.setdefault(tick + 3, []).extend(later)
            elif kind == Anomaly.OUT_OF_ORDER.value:
                later = [(Event.DELIVERED.value, None, [fragment]), (Event.CONFIRMED.value, None, [fragment])]
                extras.setdefault(tick + 3, []).extend(later)
                self.state.messages[d] += 1
            elif kind in (Anomaly.HELD.value, Anomaly.DISCARDED.value):
                retries: list[Group] = [
                    (Event.FORWARDED.value, n, [fragment]) for n in range(2, MAX_DELIVERIES + 1)
                ]
                final: Group = (Event.HELD.value, MAX_DELIVERIES, [fragment])
                if kind == Anomaly.DISCARDED.value:
                    final = (Event.DISCARDED.value, None, [fragment])
                extras.setdefault(tick + 2, []).extend([*retries, final])
            self._located(
                item,
                direction=direction,
                stream=names[s],
                seq=seq,
                broker=self.writer.broker,
                epoch=self.state.epoch,
            )
        return Batch(
            (
                [(Event.ACCEPTED.value, None, accepted)],
                [(Event.FORWARDED.value, 1, forwarded)],
                [(Event.DELIVERED.value, None, delivered)],
                [(Event.CONFIRMED.value, None, confirmed)],
            ),
            fragments,
        )

    def run(
        self,
        burst: BurstPlan,
        queues: tuple[list[Batch | BatchPlan], list[Batch | BatchPlan]],
        crash_after: int | None,
    ) -> tuple[list[tuple[int, Batch]], list[tuple[int, Batch]]]:
        """Run the pipeline over the bundles of both directions. On a crash, stop after that tick
        and return per direction the bundles still in the pipeline with the stage each reached:
        2 delivered (not confirmed), 1 forwarded (the target took it; its delivered record was
        lost with the broker), 0 accepted."""
        rng, state = self.rng, self.state
        built: tuple[list[Batch], list[Batch]] = ([], [])
        extras: tuple[dict[int, list[Group]], dict[int, list[Group]]] = ({}, {})
        ticks = max(len(queues[0]), len(queues[1])) + 3
        start = state.now
        for t in range(ticks):
            state.now = max(state.now, start + t * burst.tick)
            writer = self.writer
            for d in (0, 1):
                queue, done = queues[d], built[d]
                if t < len(queue):
                    item = queue[t]
                    done.append(item if isinstance(item, Batch) else self.build(d, item, t, extras[d]))
                direction = DIRECTIONS[d]
                for stage in range(4):
                    k = t - stage
                    if not 0 <= k < len(done):
                        continue
                    for event, attempt, frags in done[k].stages[stage]:
                        if frags:
                            state.now += rng.randint(10, 200)
                            writer.messages(
                                event, state.now, state.epoch, direction, attempt=attempt, frags=frags
                            )
                            if stage == 3:
                                self.last_confirmed[d] = frags[-1]
                for event, attempt, frags in extras[d].pop(t, ()):
                    state.now += rng.randint(10, 200)
                    writer.messages(event, state.now, state.epoch, direction, attempt=attempt, frags=frags)
            writer.close_if_full()
            if crash_after is not None and t == crash_after:
                return (
                    [(t - k, b) for k, b in enumerate(built[0]) if t - k < 3],
                    [(t - k, b) for k, b in enumerate(built[1]) if t - k < 3],
                )
        return [], []

    def resend(self, leftover: list[tuple[int, Batch]]) -> Batch:
        """What the next active gets again: every unconfirmed message of the dead term, in order;
        the target answers duplicate for what it took, so those are logged ``deduplicated``."""
        taken: list[str] = []
        fresh: list[str] = []
        for stage, batch in leftover:
            (taken if stage >= 1 else fresh).extend(batch.fragments)
            if stage == 1:  # evidence only from the target's duplicate answer
                self.expected[Anomaly.DEDUPLICATED.value] += len(batch.fragments)
        everything = taken + fresh
        return Batch(
            (
                [(Event.ACCEPTED.value, None, everything)],
                [(Event.FORWARDED.value, 1, everything)],
                [(Event.DEDUPLICATED.value, None, taken), (Event.DELIVERED.value, None, fresh)],
                [(Event.CONFIRMED.value, None, everything)],
            ),
            everything,
        )

    def generate(self, progress: Callable[[int], None]) -> None:
        state = self.state
        if state.epoch == 0:
            self.activate(self.plan.bursts[0].start - 10_000)
        for burst in self.plan.bursts:
            if burst.planned_failover_before is not None:
                self.fail_over(burst.planned_failover_before, crashed=False)
            state.now = max(state.now, burst.start)
            queues: tuple[list[Batch | BatchPlan], list[Batch | BatchPlan]] = (
                list(burst.batches[0]),
                list(burst.batches[1]),
            )
            if burst.crash is None:
                self.run(burst, queues, None)
            else:
                number, crash_tick = burst.crash
                leftovers = self.run(burst, queues, crash_tick)
                self.fail_over(number, crashed=True)
                state.now += self.rng.randint(5_000, 20_000)  # the resend request and the resend
                requeued: tuple[list[Batch | BatchPlan], list[Batch | BatchPlan]] = ([], [])
                for d in (0, 1):
                    if leftovers[d]:
                        requeued[d].append(self.resend(leftovers[d]))
                    requeued[d].extend(burst.batches[d][crash_tick + 1 :])
                self.run(burst, requeued, None)
            progress(self.store.records)
        for writer in self.writers:
            writer.close()
        state.segment_index = [writer.index for writer in self.writers]


def _without(fragments: list[str], fragment: str) -> list[str]:
    return [f for f in fragments if f is not fragment]
