"""The public entry points: :func:`generate_store`, :func:`extend_store`, and malformed lines.

A part (a new store, or one more stretch of an existing history) is planned for every cluster,
its anomalies are placed, each cluster's history is written, and the malformed lines go in last,
into segments already closed; the manifest is cumulative over parts. One seeded
:class:`random.Random` drives a part, each cluster drawing its own generator from it, so the same
arguments give the same bytes. What it deliberately does not do: keep the manifest inside the
store (the validator would report it as ``foreign-file``); callers save it beside the store.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from broker_validator.report_schema import Anomaly
from broker_validator.synthetic.history import ClusterGenerator
from broker_validator.synthetic.manifest import ClusterManifest, GeneratedStore, InjectedAnomaly
from broker_validator.synthetic.placement import place_injections
from broker_validator.synthetic.plan import DIRECTIONS, ClusterState, plan_cluster
from broker_validator.synthetic.segments import Clock, StoreWriter, reseal, to_micros

DEFAULT_START: Final = datetime(2026, 11, 22, tzinfo=UTC)  # fixed, so a seed gives the same bytes
SEGMENT_RECORDS: Final = 50_000


def generate_store(
    root: Path,
    *,
    records: int,
    streams: int = 200,
    brokers: int = 3,
    failovers: int = 6,
    crashes: int = 2,
    clusters: int = 1,
    inject: Mapping[str, int] | None = None,
    seed: int = 0,
    start: datetime | None = None,
    segment_records: int = SEGMENT_RECORDS,
    settle_seconds: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
) -> GeneratedStore:
    """Write a store of about ``records`` records under ``root`` and return its manifest.

    Per cluster (named ``bc-000``, ``bc-001``, ...): ``brokers`` brokers, ``failovers`` failovers
    of which ``crashes`` are crashes, ``streams`` streams in each direction (``orders-NNNN``
    outbound, ``invoices-NNNN`` inbound), messages split evenly between directions. ``inject`` maps
    :data:`INJECTABLE` classes to counts. ``settle_seconds`` only places ``lost`` (older than the
    horizon) and ``in-flight`` (younger) instances for a validator run with that setting.
    ``progress(records_written, records_planned)`` is called now and then. Same arguments, same
    bytes.
    """
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"store {root} is not empty; generate into a new directory (or use extend_store)")
    if not 0 <= crashes <= failovers:
        raise ValueError(f"crashes ({crashes}) must be between 0 and failovers ({failovers})")
    if min(records, streams, brokers, clusters, segment_records) < 1:
        raise ValueError("records, streams, brokers, clusters and segment_records must be at least 1")
    parameters: dict[str, Any] = {
        "records": records,
        "streams": streams,
        "brokers": brokers,
        "failovers": failovers,
        "crashes": crashes,
        "clusters": clusters,
        "inject": dict(inject or {}),
        "seed": seed,
        "start": (start or DEFAULT_START).isoformat(),
        "segmentRecords": segment_records,
        "settleSeconds": settle_seconds,
    }
    names = [f"bc-{index:03d}" for index in range(clusters)]
    states = {
        name: ClusterState(
            now=to_micros(start or DEFAULT_START),
            next_seq=[[1] * streams, [1] * streams],
            segment_index=[0] * brokers,
        )
        for name in names
    }
    identity = {name: ("acme", str(1000 + index)) for index, name in enumerate(names)}
    previous = GeneratedStore(
        root=root,
        records=0,
        malformed_lines=0,
        segments=0,
        bytes=0,
        clusters={},
        expected={anomaly.value: 0 for anomaly in Anomaly},
        injected=[],
        settle_seconds=settle_seconds,
        parameters={},
        parts=0,
    )
    return _write_part(
        root,
        previous,
        states,
        identity,
        brokers=brokers,
        streams=streams,
        records=records,
        failovers=failovers,
        crashes=crashes,
        inject=inject or {},
        seed=seed,
        segment_records=segment_records,
        parameters=parameters,
        progress=progress,
    )


def extend_store(
    root: Path,
    previous: GeneratedStore,
    *,
    records: int,
    failovers: int = 1,
    crashes: int = 0,
    inject: Mapping[str, int] | None = None,
    seed: int = 1,
    segment_records: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GeneratedStore:
    """Continue ``previous``'s history with about ``records`` more records, as new segments under
    ``root`` (``previous.root`` to grow the store in place, or another directory whose segments
    are later moved or linked into it): same clusters, brokers and streams, seqs and epochs go on,
    times after the previous part's end. Returns the cumulative manifest. Earlier ``in-flight``
    instances become ``lost``, since the new part is longer than the settle horizon."""
    if not previous.state:
        raise ValueError("the previous manifest has no continuation state")
    if not 0 <= crashes <= failovers:
        raise ValueError(f"crashes ({crashes}) must be between 0 and failovers ({failovers})")
    base = previous.parameters
    clusters = previous.state["clusters"]
    states: dict[str, ClusterState] = {}
    identity: dict[str, tuple[str, str]] = {}
    for name, saved in clusters.items():
        fields = {key: value for key, value in saved.items() if key not in ("account", "company")}
        states[name] = ClusterState(**fields)
        identity[name] = (saved["account"], saved["company"])
    parameters = dict(base)
    parameters.setdefault("parts", [])
    parameters["parts"] = [
        *parameters["parts"],
        {
            "records": records,
            "failovers": failovers,
            "crashes": crashes,
            "inject": dict(inject or {}),
            "seed": seed,
        },
    ]
    return _write_part(
        root,
        previous,
        states,
        identity,
        brokers=base["brokers"],
        streams=base["streams"],
        records=records,
        failovers=failovers,
        crashes=crashes,
        inject=inject or {},
        seed=seed,
        segment_records=segment_records or base["segmentRecords"],
        parameters=parameters,
        progress=progress,
    )


def _write_part(
    root: Path,
    previous: GeneratedStore,
    states: dict[str, ClusterState],
    identity: dict[str, tuple[str, str]],
    *,
    brokers: int,
    streams: int,
    records: int,
    failovers: int,
    crashes: int,
    inject: Mapping[str, int],
    seed: int,
    segment_records: int,
    parameters: dict[str, Any],
    progress: Callable[[int, int], None] | None,
) -> GeneratedStore:
    began = time.monotonic()
    rng = random.Random(seed)
    settle = previous.settle_seconds
    names = list(states)
    per_cluster = max(1, records // len(names))
    plans = [
        plan_cluster(
            name,
            *identity[name],
            [f"{name}-{index}" for index in range(brokers)],
            states[name],
            records=per_cluster,
            streams=streams,
            failovers=failovers,
            crashes=crashes,
            rng=rng,
        )
        for name in names
    ]
    injections = place_injections(
        plans,
        inject,
        streams=streams,
        settle_seconds=settle,
        epochs=[states[name].epoch for name in names],
        rng=rng,
    )
    expected = dict(previous.expected)
    earlier = [dataclasses.replace(item) for item in previous.injected]
    if previous.parts:  # what was in flight at the end of the last part is lost now
        expected[Anomaly.LOST.value] += expected[Anomaly.IN_FLIGHT.value]
        expected[Anomaly.IN_FLIGHT.value] = 0
        for item in earlier:
            if item.anomaly == Anomaly.IN_FLIGHT.value:
                item.anomaly = Anomaly.LOST.value
                item.detail = (item.detail + "; " if item.detail else "") + "in flight when injected"
    for kind, count in inject.items():
        expected[kind] += count
    writer = StoreWriter(root, segment_records)
    root.mkdir(parents=True, exist_ok=True)
    planned = per_cluster * len(names)
    for plan in plans:
        generator = ClusterGenerator(
            writer,
            plan,
            states[plan.name],
            injections=injections,
            expected=expected,
            streams=streams,
            rng=random.Random(rng.random()),
        )
        generator.generate(lambda written: progress(written, planned) if progress else None)
    malformed = _inject_malformed(writer.segments, inject.get(Anomaly.MALFORMED.value, 0), rng, root)
    injections.items += malformed
    cluster_manifests: dict[str, ClusterManifest] = {}
    for plan in plans:
        state = states[plan.name]
        cluster_manifests[plan.name] = ClusterManifest(
            account=plan.account,
            company=plan.company,
            brokers=plan.brokers,
            failovers=state.failovers,
            crashes=state.crashes,
            epoch=state.epoch,
            messages=dict(zip(DIRECTIONS, state.messages, strict=True)),
            accepted=dict(zip(DIRECTIONS, state.accepted, strict=True)),
        )
    clock = Clock()
    first_ts = previous.first_ts or clock.text(min(plan.bursts[0].start for plan in plans) - 10_000)
    return GeneratedStore(
        root=root,
        records=previous.records + writer.records,
        malformed_lines=previous.malformed_lines + len(malformed),
        segments=previous.segments + len(writer.segments),
        bytes=previous.bytes + sum(path.stat().st_size for path in writer.segments),
        clusters=cluster_manifests,
        expected=expected,
        injected=[*earlier, *injections.items],
        settle_seconds=settle,
        parameters=parameters,
        parts=previous.parts + 1,
        part_records=writer.records,
        seconds=round(time.monotonic() - began, 3),
        first_ts=first_ts,
        last_ts=clock.text(max(state.now for state in states.values())),
        state={
            "clusters": {
                name: {**state.to_json(), "account": identity[name][0], "company": identity[name][1]}
                for name, state in states.items()
            }
        },
    )


def _inject_malformed(
    segments: list[Path], count: int, rng: random.Random, root: Path
) -> list[InjectedAnomaly]:
    """One bad line each in ``count`` different segments, at a random line boundary (each sealed
    again, so ``segments`` names the new files)."""
    if count > len(segments):
        raise ValueError(
            f"cannot inject {count} malformed lines: one per segment and only {len(segments)} segments; "
            "lower segment_records"
        )
    items: list[InjectedAnomaly] = []
    newline = b"\n"
    for number, chosen in enumerate(sorted(rng.sample(list(segments), count))):
        data = chosen.read_bytes()
        lines = data.count(b"\n")
        cut = 0
        for _ in range(rng.randrange(lines + 1)):
            cut = data.index(b"\n", cut) + 1
        model = data[cut : data.index(b"\n", cut)] if cut < len(data) else data[: data.index(b"\n")]
        if number % 2 == 0:  # a torn record, as a kill -9 mid-write leaves it
            bad = model[: rng.randrange(10, len(model) - 10)]
            detail = "a torn record (not JSON)"
        else:
            bad = re.sub(rb'^\{"event":"[a-z]+"', b'{"event":"exploded"', model)
            detail = "a record with an unknown event"
        path = reseal(chosen, data[:cut] + bad + b"\n" + data[cut:])  # a broker's own bad line: sealed
        segments[segments.index(chosen)] = path
        cluster, broker = path.relative_to(root).parts[:2]
        items.append(
            InjectedAnomaly(
                Anomaly.MALFORMED.value,
                cluster,
                broker=broker,
                segment=str(path.relative_to(root)),
                detail=f"{detail} after line {data.count(newline, 0, cut)}",
            )
        )
    return items
