"""The validator's checks as DuckDB SQL: the single-machine comparator of ``make bench-validator``.

It answers one question: how fast could one process check this store, with a columnar engine
and no cluster? ``bench/bench_validator.py`` runs it beside the Spark validator on the same
store, and both must find exactly the anomalies the synthetic generator injected. It is a
benchmark yardstick, not a second validator: one full pass, no checkpoint, no report, no
examples, counts only.

The semantics are ``validator/README.md``'s, as refined for the Spark job:

* target order of a stream's records is ``(epoch, ts, position in the segment)``. DuckDB's JSON
  reader gives no line number, so records with the same ``(epoch, ts)`` are ordered by ``seq``:
  a broker logs one bundle with one ts and each stream's seqs in ascending order, so this is the
  file order for every log a broker writes (a reordering inside one logging call would go unseen);
* delivery evidence is a ``delivered`` or ``deduplicated`` record;
* ``duplicate-delivery``: a ``delivered`` record of a message with evidence earlier in target order;
* ``out-of-order``: a ``delivered`` record, the first evidence of its message, whose seq is below
  the highest seq with evidence before it, of a message never held;
* ``gap``: per missing seq below a stream's highest seq with evidence: no evidence, never
  accepted, held or discarded;
* ``lost`` / ``in-flight``: accepted, no evidence, never held or discarded; first accepted before /
  after the cluster's newest ts minus ``settle_seconds``;
* ``split-brain``: per epoch whose last accepted/delivered/deduplicated/confirmed record is later
  than the earliest ``activated`` of a higher epoch of its cluster, plus per epoch activated by two
  brokers;
* ``crashed-term``: a (broker, epoch) activated, never deactivated, below its cluster's top epoch;
* ``deduplicated``: a message with a ``deduplicated`` record and no ``delivered`` record;
* ``held`` / ``discarded``: records; ``malformed``: lines that are not JSON or do not fit the schema
  (DuckDB casts a quoted number to an integer column where the contract would refuse it);
  ``foreign-file``: files in the store that are not closed segments.

Records are read with ``read_json`` and an explicit column list (no inference pass), malformed
lines as all-null rows (``ignore_errors``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import duckdb

from broker_contracts.message_log import (
    CLOSED_SEGMENT_SUFFIX,
    FIELDS,
    LIFECYCLE_EVENTS,
    OPEN_SEGMENT_SUFFIX,
    Direction,
    Event,
)
from broker_validator.report_schema import Anomaly

VALIDATOR_DIR = ".validator"  # the validator's own files in the store (checkpoint, reports)
_TS_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_SQL_TYPES = {str: "VARCHAR", int: "BIGINT"}


@dataclass
class DuckDBResult:
    anomalies: dict[str, int]  # every Anomaly value
    lines: int  # lines read, malformed included
    records: int  # lines that fit the schema
    segments: int
    bytes: int
    messages: dict[str, dict[str, int]]  # cluster -> direction -> distinct messages with evidence
    seconds: float  # from connect to the last count, reading included
    phases: dict[str, float]  # seconds per step, for the profile

    @property
    def records_per_second(self) -> float:
        return self.lines / self.seconds if self.seconds else 0.0


def store_files(store: Path) -> tuple[list[Path], int]:
    """Closed segments as the validator sees them, and the count of foreign files beside them."""
    segments: list[Path] = []
    foreign = 0
    for path in sorted(store.rglob("*")):
        relative = path.relative_to(store)
        if relative.parts[0] == VALIDATOR_DIR or not path.is_file():
            continue
        if len(relative.parts) == 3 and path.name.endswith(CLOSED_SEGMENT_SUFFIX):
            segments.append(path)
        elif not path.name.endswith(OPEN_SEGMENT_SUFFIX):
            foreign += 1
    return segments, foreign


def _sql_list(values: object) -> str:
    return ", ".join(f"'{value}'" for value in values)  # type: ignore[attr-defined]


def _valid() -> str:
    """The contract's ``validate`` as a SQL predicate (never null)."""
    required = " AND ".join(f"{name} IS NOT NULL" for name, _, nullable in FIELDS if not nullable)
    lifecycle = _sql_list(e.value for e in LIFECYCLE_EVENTS)
    message = (
        f"direction IN ({_sql_list(d.value for d in Direction)}) AND stream IS NOT NULL "
        "AND seq >= 1 AND msgId IS NOT NULL"
    )
    return (
        f"coalesce(event IN ({_sql_list(e.value for e in Event)}) AND t IS NOT NULL AND {required} "
        f"AND (event IN ({lifecycle}) OR ({message})), false)"
    )


def validate_store_duckdb(
    store: Path,
    *,
    settle_seconds: float = 60.0,
    threads: int = 2,
    memory_limit: str = "6GB",
    temp_directory: Path | None = None,
) -> DuckDBResult:
    """Count every anomaly class over ``store`` in one pass of SQL."""
    started = time.monotonic()
    phases: dict[str, float] = {}
    segments, foreign = store_files(store)
    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    if temp_directory is not None:
        con.execute(f"SET temp_directory = '{temp_directory}'")
    anomalies = {anomaly.value: 0 for anomaly in Anomaly}
    anomalies[Anomaly.FOREIGN_FILE.value] = foreign
    if not segments:
        return DuckDBResult(anomalies, 0, 0, 0, 0, {}, time.monotonic() - started, phases)

    def step(name: str, sql: str, parameters: list[object] | None = None) -> list[tuple[object, ...]]:
        began = time.monotonic()
        rows = con.execute(sql, parameters).fetchall()
        phases[name] = phases.get(name, 0.0) + time.monotonic() - began
        return rows

    columns = "{" + ", ".join(f"'{name}': '{_SQL_TYPES[kind]}'" for name, kind, _ in FIELDS) + "}"
    # Times as µs integers and a stream as a 64-bit hash of (cluster, direction, stream): the
    # windows and groupings below then sort integers, about three times faster than strings.
    step(
        "read",
        f"""
        CREATE TEMP TABLE rec AS
        WITH parsed AS (
            SELECT *, try_strptime(ts, '{_TS_FORMAT}') AS t
            FROM read_json(?, format = 'newline_delimited', columns = {columns}, ignore_errors = true)
        )
        SELECT event, epoch_us(t) AS us, cluster, broker, epoch, direction,
            hash(cluster, direction, stream) AS sk, seq, {_valid()} AS valid
        FROM parsed
        """,
        [[str(path) for path in segments]],
    )
    ((lines, malformed),) = step("count", "SELECT count(*), count(*) FILTER (WHERE NOT valid) FROM rec")
    anomalies[Anomaly.MALFORMED.value] = int(str(malformed))
    # Forwarded records only count as lines: no check reads them.
    step("prune", "DELETE FROM rec WHERE NOT valid OR event = 'forwarded'")
    step(
        "keys",
        """
        CREATE TEMP TABLE keys AS
        SELECT sk, seq, any_value(cluster) AS cluster, any_value(direction) AS direction,
            min(us) FILTER (WHERE event = 'accepted') AS first_accepted,
            count(*) FILTER (WHERE event = 'delivered') AS delivered,
            count(*) FILTER (WHERE event = 'deduplicated') AS deduplicated,
            bool_or(event = 'held') AS held,
            bool_or(event = 'discarded') AS discarded
        FROM rec
        WHERE event IN ('accepted', 'delivered', 'deduplicated', 'held', 'discarded')
        GROUP BY sk, seq
        """,
    )
    ((lost, in_flight, deduplicated),) = step(
        "lost",
        f"""
        WITH horizon AS (
            SELECT cluster, max(us) - {int(settle_seconds * 1e6)} AS horizon FROM rec GROUP BY cluster
        )
        SELECT
            count(*) FILTER (WHERE first_accepted IS NOT NULL AND delivered + deduplicated = 0
                             AND NOT held AND NOT discarded AND first_accepted < horizon),
            count(*) FILTER (WHERE first_accepted IS NOT NULL AND delivered + deduplicated = 0
                             AND NOT held AND NOT discarded AND first_accepted >= horizon),
            count(*) FILTER (WHERE deduplicated > 0 AND delivered = 0)
        FROM keys JOIN horizon USING (cluster)
        """,
    )
    ((gap,),) = step(
        "gap",
        """
        WITH top AS (SELECT sk, max(seq) AS top FROM keys WHERE delivered + deduplicated > 0 GROUP BY sk),
        covered AS (
            SELECT sk, any_value(top) AS top, count(*) AS known
            FROM keys JOIN top USING (sk) WHERE seq <= top GROUP BY sk
        )
        SELECT coalesce(sum(top - known), 0) FROM covered
        """,
    )
    # seq < the running max including the record itself is seq < the highest seq before it.
    ((duplicate, out_of_order),) = step(
        "order",
        """
        WITH evidence AS (
            SELECT sk, seq, event,
                row_number() OVER (PARTITION BY sk, seq ORDER BY epoch, us) AS nth,
                max(seq) OVER (PARTITION BY sk ORDER BY epoch, us, seq) AS highest
            FROM rec WHERE event IN ('delivered', 'deduplicated')
        )
        SELECT
            count(*) FILTER (WHERE event = 'delivered' AND nth > 1),
            count(*) FILTER (WHERE event = 'delivered' AND nth = 1 AND seq < highest AND NOT held)
        FROM evidence JOIN keys USING (sk, seq)
        """,
    )
    ((split_brain, crashed, held, discarded),) = step(
        "terms",
        """
        WITH effect AS (
            SELECT cluster, epoch, max(us) AS last_us FROM rec
            WHERE event IN ('accepted', 'delivered', 'deduplicated', 'confirmed') GROUP BY ALL
        ),
        activation AS (
            SELECT cluster, epoch, min(us) AS first_us, count(DISTINCT broker) AS brokers FROM rec
            WHERE event = 'activated' GROUP BY ALL
        ),
        late AS (
            SELECT count(*) AS n FROM effect e
            WHERE e.last_us > (
                SELECT min(a.first_us) FROM activation a WHERE a.cluster = e.cluster AND a.epoch > e.epoch
            )
        ),
        terms AS (
            SELECT cluster, broker, epoch,
                bool_or(event = 'activated') AS began, bool_or(event = 'deactivated') AS ended
            FROM rec WHERE event IN ('activated', 'deactivated') GROUP BY ALL
        ),
        top AS (SELECT cluster, max(epoch) AS top FROM rec GROUP BY cluster)
        SELECT
            (SELECT n FROM late) + (SELECT count(*) FROM activation WHERE brokers > 1),
            (SELECT count(*) FROM terms JOIN top USING (cluster) WHERE began AND NOT ended AND epoch < top),
            (SELECT count(*) FROM rec WHERE event = 'held'),
            (SELECT count(*) FROM rec WHERE event = 'discarded')
        """,
    )
    messages: dict[str, dict[str, int]] = {}
    for cluster, direction, count in step(
        "messages",
        "SELECT cluster, direction, count(*) FROM keys WHERE delivered + deduplicated > 0 GROUP BY ALL",
    ):
        messages.setdefault(str(cluster), {})[str(direction)] = int(str(count))
    con.close()
    for anomaly, value in (
        (Anomaly.LOST, lost),
        (Anomaly.IN_FLIGHT, in_flight),
        (Anomaly.DEDUPLICATED, deduplicated),
        (Anomaly.GAP, gap),
        (Anomaly.DUPLICATE_DELIVERY, duplicate),
        (Anomaly.OUT_OF_ORDER, out_of_order),
        (Anomaly.SPLIT_BRAIN, split_brain),
        (Anomaly.CRASHED_TERM, crashed),
        (Anomaly.HELD, held),
        (Anomaly.DISCARDED, discarded),
    ):
        anomalies[anomaly.value] = int(str(value))
    return DuckDBResult(
        anomalies=anomalies,
        lines=int(str(lines)),
        records=int(str(lines)) - anomalies[Anomaly.MALFORMED.value],
        segments=len(segments),
        bytes=sum(path.stat().st_size for path in segments),
        messages=messages,
        seconds=time.monotonic() - started,
        phases=phases,
    )
