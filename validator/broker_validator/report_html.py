"""The self-contained HTML report: one page a person opens from disk, with a timeline per cluster.

* One file, no server, no network: people open it from a volume, a ``kubectl cp`` or a CI artefact,
  often where nothing outside can be fetched. The CSS is inline, there is no script, and each
  timeline is a PNG in a ``data:`` URI: pixels cannot carry markup (a hostile broker name in a
  picture stays pixels), and unlike SVG a PNG brings no namespace or metadata URLs into the page.
* Every string in the report came from a broker's log and is hostile until escaped: :func:`_e`
  (:func:`html.escape`) on its way into the page; the picture's labels are made safe for
  matplotlib where it is drawn, in :mod:`broker_validator.report_timeline`.

What it deliberately does not do: compute findings. Every number comes from ``report.json``, so the
page and the JSON cannot disagree; this module only lays them out.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from broker_validator.report_schema import VIOLATIONS, Anomaly, ClusterReport, Example, Report
from broker_validator.report_timeline import natural_key, timeline_png

_MEANING: Final[dict[str, str]] = {
    Anomaly.LOST: "accepted, never delivered, held or discarded, older than the settle horizon",
    Anomaly.DUPLICATE_DELIVERY: "one seq of a stream taken twice by the target",
    Anomaly.OUT_OF_ORDER: "a lower seq delivered after a higher one of its stream",
    Anomaly.GAP: "a seq below delivered ones that was never accepted, delivered, held or discarded",
    Anomaly.SPLIT_BRAIN: "work by an epoch after another broker was activated with a higher one, or one "
    "epoch activated twice",
    Anomaly.IN_FLIGHT: "accepted, not delivered yet, younger than the settle horizon",
    Anomaly.HELD: "parked by the onPoison policy after maxDeliveries",
    Anomaly.DISCARDED: "dropped on purpose by an operator",
    Anomaly.DEDUPLICATED: "the target already had it: a delivery a crash or a lost reply left unlogged",
    Anomaly.CRASHED_TERM: "an active term that ended without a deactivated record",
    Anomaly.MALFORMED: "a log line that does not parse or does not fit the schema",
    Anomaly.FOREIGN_FILE: "a file in the store that is not a closed segment the validator reads",
    Anomaly.CORRUPT_SEGMENT: "a closed segment whose bytes do not match its checksum: not read",
    Anomaly.UNVERIFIED_SEGMENT: "a closed segment named without a checksum (an older broker)",
}
_EXAMPLE_HEADERS: Final = ("cluster", "direction", "stream", "seq", "broker", "epoch", "ts", "detail")

_CSS: Final = """
body{font:15px/1.45 system-ui,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#1d1d1f;
 background:#f4f5f7} main{max-width:1180px;margin:0 auto;padding:16px 20px 40px}
header.verdict{color:#fff;padding:18px 22px;border-radius:10px;display:flex;gap:28px;flex-wrap:wrap;
 align-items:baseline} header.passed{background:#1e7b34} header.failed{background:#b00020}
header .big{font-size:44px;font-weight:700} header .count{font-size:22px;font-weight:600}
section{background:#fff;border:1px solid #dcdfe4;border-radius:10px;padding:6px 18px 16px;margin:18px 0}
h2{font-size:22px;margin:12px 0 6px} h3{font-size:17px;margin:18px 0 6px} h4{font-size:15px;margin:14px 0 4px}
table{border-collapse:collapse;margin:4px 0;font-size:13.5px} table.wide{width:100%}
th,td{border-bottom:1px solid #e3e5e8;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600} .num{text-align:right;font-variant-numeric:tabular-nums}
table.facts th{background:none;font-weight:500;color:#555} td{overflow-wrap:anywhere}
tr.hit td{background:#fde8ea} tr.hit td:first-child{box-shadow:inset 4px 0 #b00020}
.badge{display:inline-block;border-radius:9px;padding:0 8px;font-size:12px;font-weight:600;color:#fff;
 vertical-align:middle;background:#6b7280} .badge.violation,.badge.failed{background:#b00020}
.badge.passed{background:#1e7b34} .scroll{max-height:28em;overflow:auto} .scroll th{position:sticky;top:0}
code,.mono,.ts{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px} .ts{white-space:nowrap}
img.timeline{width:100%;max-width:1100px;height:auto;display:block} .empty{color:#666;font-style:italic}
details{margin:10px 0} summary{cursor:pointer;font-weight:600} footer{color:#777;font-size:12.5px}
"""


def render_html(report: Report) -> str:
    """The whole page for `report`: inline CSS, no script, each timeline a PNG in a data: URI."""
    # Failed clusters first: they are what a person opened the page for.
    clusters = sorted(
        report["clusters"].items(), key=lambda kv: (kv[1]["violations"] == 0, natural_key(kv[0]))
    )
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Ordering report: {_e(report['result'])}</title><style>{_CSS}</style></head><body><main>",
        _verdict(report),
        _run_section(report),
        _anomaly_section(report["anomalies"]),
        _cluster_index(clusters),
        *(_cluster_section(index, name, cluster) for index, (name, cluster) in enumerate(clusters)),
        _problem_section(report),
        f"<footer>report.json schema version {_e(report['schemaVersion'])}</footer></main></body></html>\n",
    ]
    return "\n".join(parts)


def write_html(report: Report, path: str | os.PathLike[str]) -> None:
    """Writes the page to `path` atomically, so a person or a web server never reads half of one."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(render_html(report), encoding="utf-8")
    partial.replace(target)


def _e(value: object) -> str:
    """A report value as HTML text: escaped, and a dash for a missing one."""
    return "—" if value is None else html.escape(str(value))


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f} ms"


Row = tuple[Sequence[str], str]  # a table row: its cells (HTML already) and its CSS class, "" for none


def _table(head: Sequence[str], rows: Sequence[Row], numeric: Sequence[int] = (), wide: bool = True) -> str:
    """A table whose `numeric` columns align right; longer than 15 rows, it scrolls inside the page."""

    def cell(tag: str, i: int, text: str) -> str:
        return f'<{tag} class="num">{text}</{tag}>' if i in numeric else f"<{tag}>{text}</{tag}>"

    heading = "".join(cell("th", i, _e(header)) for i, header in enumerate(head))
    body = "".join(
        f'<tr class="{css}">' + "".join(cell("td", i, c) for i, c in enumerate(cells)) + "</tr>"
        for cells, css in rows
    )
    table = f'<table class="{"wide" * wide}"><thead><tr>{heading}</tr></thead><tbody>{body}</tbody></table>'
    return f'<div class="scroll">{table}</div>' if len(rows) > 15 else table


def _facts(facts: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in facts)
    return f'<table class="facts">{rows}</table>'


def _verdict(report: Report) -> str:
    count = report["violations"]
    return (
        f'<header class="verdict {"passed" if report["result"] == "Passed" else "failed"}">'
        f'<span class="big">{_e(report["result"])}</span>'
        f'<span class="count">{count:,} violation{"" if count == 1 else "s"}</span>'
        f"<span>generated {_e(report['generatedAt'])}</span></header>"
    )


def _run_section(report: Report) -> str:
    run = report["run"]
    facts = [
        ("store", f'<span class="mono">{_e(report["store"])}</span>'),
        ("mode", _e(run["mode"])),
        ("started", _e(run["startedAt"])),
        ("seconds", f"{run['seconds']:,.1f}"),
        ("segments read / known", f"{run['segmentsRead']:,} / {run['segmentsKnown']:,}"),
        ("records read", f"{run['recordsRead']:,} ({run['bytesRead']:,} bytes)"),
        ("settle horizon", f"{run['settleSeconds']:,.0f} s"),
    ]
    return f"<section><h2>Run</h2>{_facts(facts)}</section>"


def _anomaly_order(anomalies: dict[str, int]) -> list[str]:
    """Violations first, then informational classes, in the schema's order; unknown classes last."""
    known = [a.value for a in Anomaly if a in VIOLATIONS] + [a.value for a in Anomaly if a not in VIOLATIONS]
    return known + sorted(set(anomalies) - set(known))


def _kind_badge(anomaly: str) -> str:
    kind = "violation" if anomaly in VIOLATIONS else "informational"
    return f'<span class="badge {kind}">{kind}</span>'


def _badge(result: str) -> str:
    return f'<span class="badge {"passed" if result == "Passed" else "failed"}">{_e(result)}</span>'


def _anomaly_section(anomalies: dict[str, int]) -> str:
    rows: list[Row] = []
    for anomaly in _anomaly_order(anomalies):
        count = anomalies.get(anomaly, 0)
        cells = [_e(anomaly), f"{count:,}", _kind_badge(anomaly), _e(_MEANING.get(anomaly, "unknown class"))]
        rows.append((cells, "hit" if count and anomaly in VIOLATIONS else ""))
    table = _table(("class", "count", "kind", "meaning"), rows, (1,))
    return f"<section><h2>Anomaly classes</h2>{table}</section>"


def _cluster_index(clusters: Sequence[tuple[str, ClusterReport]]) -> str:
    if not clusters:
        return '<section><h2>Clusters</h2><p class="empty">No cluster has records in the store.</p></section>'
    rows: list[Row] = []
    for index, (name, cluster) in enumerate(clusters):
        delivered = ", ".join(f"{_e(d)} {n:,}" for d, n in sorted(cluster["messages"].items())) or "—"
        link = f'<a href="#cluster-{index}">{_e(name)}</a>'
        counts = [f"{cluster['violations']:,}", f"{len(cluster['failovers']):,}"]
        cells = [link, _badge(cluster["result"]), *counts, delivered]
        rows.append((cells, "hit" if cluster["violations"] else ""))
    headers = ("cluster", "result", "violations", "failovers", "delivered")
    return f"<section><h2>Clusters</h2>{_table(headers, rows, (2, 3))}</section>"


def _example_table(examples: Sequence[Example], css: str) -> str:
    def cells(ex: Example) -> list[str]:
        plain = [_e(ex[key]) for key in ("cluster", "direction", "stream", "seq", "broker", "epoch")]
        return [*plain, f'<span class="ts">{_e(ex["ts"])}</span>', _e(ex["detail"])]

    return _table(_EXAMPLE_HEADERS, [(cells(ex), css) for ex in examples], (3, 5))


def _cluster_section(index: int, name: str, cluster: ClusterReport) -> str:
    first, last, failovers = cluster["firstTs"], cluster["lastTs"], len(cluster["failovers"])
    facts = [
        ("violations", f"{cluster['violations']:,}"),
        ("streams", f"{cluster['streamCount']:,}"),
        ("terms / failovers", f"{len(cluster['terms']):,} / {failovers:,}"),
        ("records", f"{_e(first)} to {_e(last)}" if first or last else "none"),
    ]
    return "\n".join(
        [
            f'<section id="cluster-{index}"><h2>{_e(name)} {_badge(cluster["result"])}</h2>{_facts(facts)}',
            f"<h3>Messages and accepted-to-delivered latency</h3>{_latency_table(cluster)}",
            f"<h3>Timeline</h3>{_timeline_html(name, cluster)}",
            f"<h3>Failovers ({failovers:,})</h3>{_failover_table(cluster)}",
            f"<h3>Anomalies</h3>{_cluster_anomalies(cluster)}",
            f"{_terms_details(cluster)}</section>",
        ]
    )


def _latency_table(cluster: ClusterReport) -> str:
    rows: list[Row] = []
    for direction in sorted(set(cluster["messages"]) | set(cluster["latencyMs"])):
        cells = [_e(direction), f"{cluster['messages'].get(direction, 0):,}"]
        latency = cluster["latencyMs"].get(direction)
        if latency is None:
            cells += ["0", "—", "—", "—", "—"]
        else:
            cells += [f"{latency['count']:,}", _ms(latency["p50"]), _ms(latency["p90"])]
            cells += [_ms(latency["p99"]), _ms(latency["max"])]
        rows.append((cells, ""))
    headers = ("direction", "delivered", "timed", "p50", "p90", "p99", "max")
    empty = '<p class="empty">Nothing delivered.</p>'
    table = _table(headers, rows, range(1, 7), wide=False) if rows else empty
    worst = cluster["worstLag"]
    return table if worst is None else f"{table}<h4>Worst lag</h4>{_example_table([worst], '')}"


def _failover_table(cluster: ClusterReport) -> str:
    if not cluster["failovers"]:
        return '<p class="empty">No failovers.</p>'
    rows: list[Row] = []
    for f in cluster["failovers"]:
        unknown = f["fromBroker"] is None and f["fromEpoch"] is None
        origin = "—" if unknown else f"{_e(f['fromBroker'])} / epoch {_e(f['fromEpoch'])}"
        target = f"{_e(f['toBroker'])} / epoch {_e(f['toEpoch'])}"
        rows.append(([f'<span class="ts">{_e(f["at"])}</span>', origin, target, _ms(f["gapMs"])], ""))
    return _table(("at", "from", "to", "delivery gap"), rows, (3,), wide=False)


def _cluster_anomalies(cluster: ClusterReport) -> str:
    parts = []
    for anomaly in _anomaly_order(cluster["anomalies"]):
        count, examples = cluster["anomalies"].get(anomaly, 0), cluster["examples"].get(anomaly, [])
        if count or examples:
            shown = f"showing {len(examples):,} of {count:,}" if len(examples) < count else f"{count:,}"
            parts.append(f"<h4>{_e(anomaly)} {_kind_badge(anomaly)} <small>{shown}</small></h4>")
            parts.append(_example_table(examples, "hit" if anomaly in VIOLATIONS else "") if examples else "")
    return "".join(parts) or '<p class="empty">No anomalies.</p>'


def _terms_details(cluster: ClusterReport) -> str:
    rows: list[Row] = [
        ([_e(t["broker"]), _e(t["epoch"]), _e(t["start"]), _e(t["end"] or "(open)"), _e(t["ended"])], "")
        for t in cluster["terms"]
    ]
    table = _table(("broker", "epoch", "start", "end", "ended"), rows, (1,), wide=False)
    return f"<details><summary>Active terms ({len(rows):,})</summary>{table}</details>"


def _problem_section(report: Report) -> str:
    problems = report["problems"]
    if not problems:
        return '<section><h2>Problems</h2><p class="empty">No malformed, foreign or empty file.</p></section>'
    rows: list[Row] = [
        ([f"<code>{_e(p['segment'])}</code>", f"{p['lines']:,}", f"<code>{_e(p['example'])}</code>"], "")
        for p in problems
    ]
    headers = ("file", "malformed lines", "first bad line, or why the file is foreign")
    return f"<section><h2>Problems ({len(problems):,})</h2>{_table(headers, rows, (1,))}</section>"


def _timeline_html(name: str, cluster: ClusterReport) -> str:
    try:  # a hostile timestamp (the year 9999, say) costs the picture, never the page
        png = timeline_png(cluster)
    except (ValueError, OverflowError) as error:
        return f'<p class="empty">The timeline could not be drawn: {_e(error)}</p>'
    if png is None:
        return '<p class="empty">No timestamps in this cluster\'s records: nothing to draw.</p>'
    alt = f"Timeline of cluster {name}: active terms per broker, failovers, delivery rate"
    return f'<img class="timeline" alt="{_e(alt)}" src="data:image/png;base64,{png}">'
