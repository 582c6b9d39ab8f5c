"""The HTML report: real rendering of realistic reports, read back as a person and a browser would.

Each test renders a report built here (not a fixture file) and checks what reaches the page: the
verdict, the counts, every example record, hostile log strings escaped, the timeline PNG (decoded,
with the colours of the terms it must show), and that nothing points outside the file.
"""

from __future__ import annotations

import base64
import io
import re
from datetime import UTC, datetime, timedelta
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal

from PIL import Image

from broker_validator.report_html import render_html, write_html
from broker_validator.report_schema import (
    SCHEMA_VERSION,
    VIOLATIONS,
    Anomaly,
    ClusterReport,
    Example,
    Failover,
    Report,
    Term,
    count_violations,
    empty_anomalies,
    result_of,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
HOSTILE_STREAM = "<script>alert(1)</script>"
HOSTILE_BROKER = 'orders-2"><img src=x onerror=alert(2)>$\\frac{$'
PNG_PREFIX = "data:image/png;base64,"


def ts(seconds: float) -> str:
    """A report timestamp `seconds` after T0, as the validator writes it."""
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def example(anomaly: Anomaly, seq: int, broker: str | None, epoch: int | None, at: float | None) -> Example:
    return {
        "anomaly": anomaly.value,
        "cluster": "orders",
        "direction": "outbound",
        "stream": f"invoices-{seq % 3}",
        "seq": seq,
        "broker": broker,
        "epoch": epoch,
        "ts": None if at is None else ts(at),
        "detail": f"{anomaly.value} detail for seq {seq}",
    }


def orders_cluster(
    failover_count: int = 50, brokers: tuple[str, ...] = ("orders-0", "orders-1", "orders-2")
) -> ClusterReport:
    """Three brokers taking turns, `failover_count` failovers every 20 s, the last term still open."""
    terms: list[Term] = []
    failovers: list[Failover] = []
    for epoch in range(1, failover_count + 2):
        start, broker = (epoch - 1) * 20.0, brokers[(epoch - 1) % len(brokers)]
        last = epoch == failover_count + 1
        ended: Literal["deactivated", "crashed", "open"] = (
            "open" if last else ("crashed" if epoch % 4 == 0 else "deactivated")
        )
        terms.append(
            {
                "broker": broker,
                "epoch": epoch,
                "start": ts(start),
                "end": None if last else ts(start + 18.5),
                "ended": ended,
            }
        )
        if epoch > 1:
            previous = terms[-2]
            failovers.append(
                {
                    "at": ts(start),
                    "fromBroker": previous["broker"],
                    "fromEpoch": previous["epoch"],
                    "toBroker": broker,
                    "toEpoch": epoch,
                    "gapMs": 1500.0 + epoch,
                }
            )
    if failovers:  # the first failover of a store whose older segments are gone: no known predecessor
        failovers[0]["fromBroker"], failovers[0]["fromEpoch"], failovers[0]["gapMs"] = None, None, None
    end = (failover_count + 1) * 20.0
    examples = {
        Anomaly.LOST.value: [
            example(Anomaly.LOST, seq, "orders-1", 2, 25.0 + seq) for seq in (101, 102, 103)
        ],
        Anomaly.GAP.value: [example(Anomaly.GAP, 7, brokers[2], 3, 45.5)],
        Anomaly.SPLIT_BRAIN.value: [example(Anomaly.SPLIT_BRAIN, 9, None, 4, 61.0)],
        Anomaly.HELD.value: [example(Anomaly.HELD, 55, "orders-0", 1, 10.0)],
        Anomaly.CRASHED_TERM.value: [example(Anomaly.CRASHED_TERM, 0, "orders-0", 4, None)],
        Anomaly.DEDUPLICATED.value: [
            example(Anomaly.DEDUPLICATED, seq, "orders-1", 5, 80.0 + seq) for seq in range(5)
        ],
    }
    examples[Anomaly.GAP.value][0]["stream"] = HOSTILE_STREAM
    anomalies = empty_anomalies()
    anomalies.update(
        {"lost": 3, "gap": 1, "split-brain": 1, "held": 1, "crashed-term": 12, "deduplicated": 17}
    )
    violations = count_violations(anomalies)
    return {
        "result": result_of(violations),
        "violations": violations,
        "anomalies": anomalies,
        "examples": examples,
        "messages": {"outbound": 48_210, "inbound": 12_003},
        "streamCount": 2,
        "streams": [
            {"direction": "outbound", "stream": "invoices-0", "delivered": 48_210, "lastSeq": 48_210},
            {"direction": "inbound", "stream": "orders-in", "delivered": 12_003, "lastSeq": 12_003},
        ],
        "terms": terms,
        "failovers": failovers,
        "latencyMs": {
            "outbound": {"count": 48_210, "p50": 12.5, "p90": 48.25, "p99": 1830.0, "max": 4120.75},
            "inbound": {"count": 12_003, "p50": 9.0, "p90": 31.0, "p99": 250.5, "max": 2002.0},
        },
        "worstLag": {
            **example(Anomaly.LOST, 4242, "orders-1", 7, 130.0),
            "anomaly": "",
            "detail": "waited 4120.75 ms",
        },
        "deliveryRate": {
            "bucketSeconds": 5,
            "start": ts(0),
            "counts": [(i * 37) % 400 for i in range(int(end // 5))],
        },
        "firstTs": ts(0),
        "lastTs": ts(end),
    }


def quiet_cluster() -> ClusterReport:
    """A cluster whose brokers never went active: no terms, no deliveries, no timestamps."""
    return {
        "result": "Passed",
        "violations": 0,
        "anomalies": empty_anomalies(),
        "examples": {},
        "messages": {},
        "streamCount": 0,
        "streams": [],
        "terms": [],
        "failovers": [],
        "latencyMs": {},
        "worstLag": None,
        "deliveryRate": {"bucketSeconds": 10, "start": None, "counts": []},
        "firstTs": None,
        "lastTs": None,
    }


def make_report(clusters: dict[str, ClusterReport] | None = None) -> Report:
    clusters = {"orders": orders_cluster(), "billing": quiet_cluster()} if clusters is None else clusters
    anomalies = empty_anomalies()
    for cluster in clusters.values():
        for name, count in cluster["anomalies"].items():
            anomalies[name] += count
    anomalies["malformed"], anomalies["foreign-file"] = 2, 1
    violations = count_violations(anomalies)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "generatedAt": "2026-11-22T12:30:00.000001Z",
        "store": "/var/log-store/brokers",
        "result": result_of(violations),
        "violations": violations,
        "anomalies": anomalies,
        "run": {
            "mode": "incremental",
            "startedAt": "2026-11-22T12:29:41.5Z",
            "seconds": 18.75,
            "segmentsRead": 37,
            "segmentsKnown": 1204,
            "recordsRead": 250_311,
            "bytesRead": 61_002_113,
            "settleSeconds": 60.0,
        },
        "clusters": clusters,
        "problems": [
            {"segment": "orders/orders-1/000042.jsonl", "lines": 2, "example": '{"event": "deliv<b>ered"'},
            {"segment": "orders/notes.txt", "lines": 0, "example": "not a closed segment (*.jsonl)"},
        ],
    }


def timeline_images(page: str) -> list[Image.Image]:
    encoded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(data, validate=True))) for data in encoded]


def rows_of(page: str) -> list[tuple[str, list[str]]]:
    """Every table row as a person reads it: its class and the text of its cells."""
    return ReadPage().read(page).rows


def cells(*values: object) -> list[str]:
    """The cells a row shows for these report values: a missing one shows as a dash."""
    return ["—" if value is None else str(value) for value in values]


def test_header_shows_the_verdict_violations_and_run() -> None:
    page = render_html(make_report())
    assert '<header class="verdict failed"><span class="big">Failed</span>' in page
    assert '<span class="count">5 violations</span>' in page
    rows = [row for _, row in rows_of(page)]
    assert ["store", "/var/log-store/brokers"] in rows
    assert ["mode", "incremental"] in rows
    assert ["segments read / known", "37 / 1,204"] in rows
    assert ["records read", "250,311 (61,002,113 bytes)"] in rows
    assert "generated 2026-11-22T12:30:00.000001Z" in page


def test_a_clean_report_is_passed_in_green() -> None:
    page = render_html(make_report({"billing": quiet_cluster()}))
    assert '<header class="verdict passed"><span class="big">Passed</span>' in page
    assert "0 violations" in page


def test_anomaly_table_counts_every_class_and_marks_found_violations_apart() -> None:
    table = [
        (css, row)
        for css, row in rows_of(render_html(make_report()))
        if row[2:3] == ["kind"] or (len(row) == 4 and row[2] in {"violation", "informational"})
    ]
    rows = {row[0]: (css, row) for css, row in table}
    assert set(rows) == {"class"} | {anomaly.value for anomaly in Anomaly}
    assert rows["lost"][1][:3] == ["lost", "3", "violation"]
    assert rows["crashed-term"][1][:3] == ["crashed-term", "12", "informational"]
    assert rows["malformed"][1][1] == "2"
    assert [rows[name][0] for name in ("lost", "gap", "split-brain")] == ["hit"] * 3
    assert [rows[name][0] for name in ("out-of-order", "duplicate-delivery")] == [""] * 2  # none found
    assert [rows[name][0] for name in ("deduplicated", "crashed-term", "held")] == [""] * 3  # never


def test_every_example_record_is_a_row_and_violations_stand_out() -> None:
    report = make_report()
    rows = rows_of(render_html(report))
    examples = {a: exs for a, exs in report["clusters"]["orders"]["examples"].items()}
    assert sum(map(len, examples.values())) == 12
    for anomaly, found in examples.items():
        for ex in found:
            expected = cells(
                *(ex[k] for k in ("cluster", "direction", "stream", "seq", "broker", "epoch", "ts"))
            )
            matching = [css for css, row in rows if row == [*expected, ex["detail"]]]
            assert matching == ["hit" if anomaly in VIOLATIONS else ""], ex
    worst = report["clusters"]["orders"]["worstLag"]
    assert worst is not None
    assert [
        "orders",
        "outbound",
        "invoices-0",
        "4242",
        "orders-1",
        "7",
        worst["ts"],
        "waited 4120.75 ms",
    ] in [row for _, row in rows]
    page = render_html(report)
    assert "showing 5 of 17" in page  # deduplicated: 17 found, 5 kept
    assert "showing 1 of 12" in page  # crashed-term


def test_hostile_log_strings_are_escaped_in_every_place() -> None:
    orders = orders_cluster(brokers=("orders-0", "orders-1", HOSTILE_BROKER))
    page = render_html(make_report({HOSTILE_STREAM: orders}))
    assert "<script" not in page.lower()
    assert "<img src=x" not in page and "<b>" not in page
    # The index, the section heading, the timeline's alt text, the gap example's stream.
    assert page.count(escape(HOSTILE_STREAM)) == 4
    assert escape(HOSTILE_BROKER) in page  # in the failovers and terms tables
    rows = [row for _, row in rows_of(page)]
    assert [HOSTILE_BROKER, "3", ts(40), ts(58.5), "deactivated"] in rows  # and it reads back as it was
    assert len(timeline_images(page)) == 1  # the $ and \ in the broker name did not break the picture
    ReadPage().read(page)


def test_timeline_is_an_embedded_png_showing_terms_failovers_and_examples() -> None:
    page = render_html(make_report())
    images = timeline_images(page)
    assert len(images) == 1  # orders; billing has nothing to draw
    assert base64.b64decode(page.split(PNG_PREFIX)[1].split('"')[0])[:8] == b"\x89PNG\r\n\x1a\n"
    image = images[0].convert("RGB")
    assert 1000 <= image.width <= 2000 and 300 <= image.height <= 1000
    colours = {colour for _, colour in image.getcolors(maxcolors=1 << 22) or []}
    for hex_colour in ("#4c78a8", "#f58518", "#54a24b", "#c00000", "#7f3c8d"):
        # term deactivated, crashed, open; a violation example, another anomaly example
        assert tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)) in colours, hex_colour
    assert 'alt="Timeline of cluster orders: active terms per broker, failovers, delivery rate"' in page


def test_failovers_terms_and_latency_are_tabled() -> None:
    report = make_report()
    rows = [row for _, row in rows_of(render_html(report))]
    orders = report["clusters"]["orders"]
    assert [ts(20), "—", "orders-1 / epoch 2", "—"] in rows  # no known predecessor
    assert [ts(40), "orders-1 / epoch 2", "orders-2 / epoch 3", "1,503.0 ms"] in rows
    assert sum(1 for row in rows if len(row) == 4 and row[0] in {f["at"] for f in orders["failovers"]}) == 50
    assert ["outbound", "48,210", "48,210", "12.5 ms", "48.2 ms", "1,830.0 ms", "4,120.8 ms"] in rows
    assert ["inbound", "12,003", "12,003", "9.0 ms", "31.0 ms", "250.5 ms", "2,002.0 ms"] in rows
    assert ["orders-2", "51", ts(1000), "(open)", "open"] in rows
    assert ["orders-0", "4", ts(60), ts(78.5), "crashed"] in rows


def test_problems_are_listed_escaped() -> None:
    page = render_html(make_report())
    assert "<h2>Problems (2)</h2>" in page
    rows = [row for _, row in rows_of(page)]
    assert ["orders/orders-1/000042.jsonl", "2", '{"event": "deliv<b>ered"'] in rows
    assert ["orders/notes.txt", "0", "not a closed segment (*.jsonl)"] in rows
    assert escape('{"event": "deliv<b>ered"') in page


def test_the_page_stands_alone_and_is_well_formed() -> None:
    page = render_html(make_report())
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    sources = re.findall(r'\b(?:src|href)="([^"]*)"', page)
    assert sources and all(s.startswith((PNG_PREFIX, "#cluster-")) for s in sources)
    assert {f"#cluster-{i}" for i in range(2)} <= set(sources)
    assert 'id="cluster-0"' in page and 'id="cluster-1"' in page
    ReadPage().read(page)


def test_a_report_with_no_clusters_and_no_problems_renders() -> None:
    report = make_report({})
    report["problems"] = []
    report["anomalies"] = empty_anomalies()
    report["violations"], report["result"] = 0, "Passed"
    page = render_html(report)
    assert "Passed" in page
    assert "No cluster has records in the store." in page
    assert "No malformed, foreign or empty file." in page
    assert PNG_PREFIX not in page
    ReadPage().read(page)


def test_clusters_with_little_to_draw_render() -> None:
    quiet = quiet_cluster()
    delivering = quiet_cluster() | {"firstTs": ts(0), "lastTs": ts(30)}  # records, but no term yet
    delivering["deliveryRate"] = {"bucketSeconds": 10, "start": ts(0), "counts": [3, 0, 9]}
    single = orders_cluster(failover_count=0)  # one open term and nothing after its start
    single["deliveryRate"] = {"bucketSeconds": 1, "start": None, "counts": []}
    single["examples"], single["lastTs"] = {}, single["firstTs"]
    page = render_html(make_report({"quiet": quiet, "delivering": delivering, "single": single}))
    assert page.count("nothing to draw") == 1
    assert len(timeline_images(page)) == 2
    assert "No failovers." in page and "Nothing delivered." in page and "No anomalies." in page


def test_unreadable_timestamps_cost_at_most_the_picture() -> None:
    orders = orders_cluster(failover_count=3)
    orders["terms"][1]["start"] = "yesterday-ish"
    orders["failovers"][0]["at"] = "<b>soon</b>"
    far = orders_cluster(failover_count=3)
    far["lastTs"] = "9999-12-31T23:59:59.999999Z"  # the end of time: no room for the picture's margin
    page = render_html(make_report({"orders": orders, "far": far}))
    assert len(timeline_images(page)) == 1
    assert "&lt;b&gt;soon&lt;/b&gt;" in page
    assert "The timeline could not be drawn" in page


def test_the_page_stays_small_for_many_failovers_and_a_long_rate() -> None:
    page = render_html(make_report())  # 3 brokers, 50 failovers
    assert len(page.encode()) < 400_000
    day = orders_cluster(failover_count=200)
    day["deliveryRate"] = {"bucketSeconds": 1, "start": ts(0), "counts": [i % 50 for i in range(86_400)]}
    day["lastTs"] = ts(86_400)
    assert len(render_html(make_report({"day": day})).encode()) < 1_000_000


def test_write_html_writes_the_page_and_leaves_no_partial_file(tmp_path: Path) -> None:
    report = make_report()
    target = tmp_path / "report.html"
    write_html(report, target)
    assert target.read_text(encoding="utf-8") == render_html(report)
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


class ReadPage(HTMLParser):
    """Reads table rows as text, and fails where a browser would have to repair the markup."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()  # convert_charrefs: cell text comes back unescaped, as a person reads it
        self.open: list[str] = []
        self.rows: list[tuple[str, list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.open.append(tag)
        if tag == "tr":
            self.rows.append((dict(attrs).get("class") or "", []))
        elif tag in {"td", "th"}:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else ''}>"
        self.open.pop()
        if tag in {"td", "th"} and self.cell is not None:
            self.rows[-1][1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)

    def read(self, page: str) -> ReadPage:
        self.feed(page)
        self.close()
        assert self.open == [], self.open
        return self
