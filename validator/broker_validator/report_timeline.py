"""The timeline picture of the HTML report: per cluster, a PNG of active terms, failovers and rate.

* One lane per broker with a bar per active term, coloured by how it ended and labelled with its
  epoch where the label fits; failovers as lines across both panels; examples of anomalies marked
  where they happened; below, the delivery rate.
* matplotlib's object API (a ``Figure`` on the Agg canvas), never ``pyplot``: no global registry of
  figures to leak or close, no backend switch for whoever imports us, safe off the main thread.
* Every label comes from a broker's log: :func:`_plain` puts it into the picture one line long and
  with ``$`` taken literally, since a ``$`` would switch matplotlib to mathtext, which raises on bad
  TeX. Pixels cannot carry markup, so the page needs no more escaping for the picture.
* The picture stays small however long the store: one bar collection per broker, epoch labels only
  on bars that hold them, the delivery rate merged into at most :data:`_MAX_RATE_STEPS` steps.

What it deliberately does not do: HTML (:mod:`broker_validator.report_html` embeds the PNG), or
compute findings (everything drawn comes from the report's cluster section).
"""

from __future__ import annotations

import base64
import io
import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from matplotlib import dates as mdates
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from broker_validator.report_schema import VIOLATIONS, ClusterReport, Term

_TERM_COLOURS: Final = {"deactivated": "#4c78a8", "crashed": "#f58518", "open": "#54a24b"}
_VIOLATION_COLOUR: Final = "#c00000"
_OTHER_COLOUR: Final = "#7f3c8d"
_FAILOVER_COLOUR: Final = "#8a8f98"
_MAX_LANES: Final = 16  # brokers drawn per cluster; a cluster has a handful, a hostile log could have more
_MAX_RATE_STEPS: Final = 600  # a day in 1 s buckets would otherwise be 86,400 steps
_FIGURE_WIDTH_INCHES: Final = 11.0
_DPI: Final = 130  # 1430 px wide, shown at up to 1100 CSS px: sharp on high-density screens too


def natural_key(text: str) -> list[int | str]:
    """Sort key that puts broker-2 before broker-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _ts(text: str | None) -> datetime | None:
    """A report timestamp (``2026-11-22T12:00:00.123456Z``, UTC); None when missing or unreadable."""
    try:
        parsed = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return parsed.replace(tzinfo=parsed.tzinfo or UTC) if parsed else None


def _x(moment: datetime) -> float:
    return float(mdates.date2num(moment))


def _plain(text: str, limit: int = 28) -> str:
    """A label for matplotlib: one line, cut to `limit`, with ``$`` taken literally, not as mathtext."""
    one_line = " ".join(text.split())
    cut = one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"
    return cut.replace("$", r"\$")


def _rate_steps(counts: Sequence[int], bucket_seconds: int) -> tuple[list[float], list[float]]:
    """Step edges (seconds from the first bucket) and deliveries per second, merged to fit the picture."""
    factor = max(1, -(-len(counts) // _MAX_RATE_STEPS))
    bounds = [min(i, len(counts)) for i in range(0, len(counts) + factor, factor)]
    rates = [sum(counts[a:b]) / ((b - a) * bucket_seconds) for a, b in itertools.pairwise(bounds)]
    return [float(b * bucket_seconds) for b in bounds], rates


def timeline_png(cluster: ClusterReport) -> str | None:
    """Lanes of active terms per broker over the delivery rate, as base64 PNG; None with no timestamp."""
    terms = [(term, start, _ts(term["end"])) for term in cluster["terms"] if (start := _ts(term["start"]))]
    failovers = [at for failover in cluster["failovers"] if (at := _ts(failover["at"]))]
    marks = [(ex, at) for exs in cluster["examples"].values() for ex in exs if (at := _ts(ex["ts"]))]
    rate = cluster["deliveryRate"]
    rate_start = _ts(rate["start"]) if rate["counts"] and rate["bucketSeconds"] > 0 else None
    known = [moment for _, start, end in terms for moment in (start, end) if moment] + failovers
    known += [at for _, at in marks] + [m for m in (_ts(cluster["firstTs"]), _ts(cluster["lastTs"])) if m]
    if rate_start:
        known += [rate_start, rate_start + timedelta(seconds=rate["bucketSeconds"] * len(rate["counts"]))]
    if not known:
        return None
    first, last = min(known), max(known)
    pad = max((last - first) / 50, timedelta(seconds=0.5))
    window = (_x(first - pad), _x(last + pad))
    brokers = {t["broker"] for t, _, _ in terms} | {ex["broker"] for ex, _ in marks if ex["broker"]}
    lanes = {broker: lane for lane, broker in enumerate(sorted(brokers, key=natural_key)[:_MAX_LANES])}

    lane_height = 0.42 * max(len(lanes), 2)
    fig = Figure(figsize=(_FIGURE_WIDTH_INCHES, lane_height + 2.6), layout="constrained")
    FigureCanvasAgg(fig)
    lanes_ax, rate_ax = fig.subplots(2, 1, sharex=True, height_ratios=[lane_height + 0.3, 1.5])
    drawn = _draw_terms(lanes_ax, lanes, [(t, _x(start), _x(end or last)) for t, start, end in terms], window)
    if len(brokers) > len(lanes):
        lanes_ax.set_title(f"{len(brokers) - len(lanes)} more brokers not drawn", fontsize=9, loc="right")
    for ax in (lanes_ax, rate_ax):
        xs = [_x(at) for at in failovers]
        # Solid (dashes of many close lines merge into black blocks) and behind the bars, whose edges show it.
        ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors=_FAILOVER_COLOUR, lw=0.7, zorder=0.8)
        ax.grid(axis="x", color="#e6e6e6", lw=0.6)
        ax.set_axisbelow(True)
    for kind, marker, colour in (("other", "D", _OTHER_COLOUR), ("bad", "X", _VIOLATION_COLOUR)):
        chosen = [
            (_x(at), ex["broker"]) for ex, at in marks if (ex["anomaly"] in VIOLATIONS) == (kind == "bad")
        ]
        on_lane = [(x, lanes[broker]) for x, broker in chosen if broker in lanes]
        if on_lane:
            lanes_ax.scatter(*zip(*on_lane, strict=True), marker=marker, s=46, c=colour, zorder=3, lw=0.5)
        # An example without a broker (or beyond the lanes drawn) sits on the rate panel's time axis.
        off_lane = [x for x, broker in chosen if broker not in lanes]
        if off_lane:
            rate_ax.scatter(off_lane, [0] * len(off_lane), marker=marker, s=46, c=colour, clip_on=False)
        drawn[kind] = bool(chosen)
    drawn["failover"] = bool(failovers)
    _draw_rate(rate_ax, rate["counts"], rate["bucketSeconds"], rate_start)
    rate_ax.set_xlim(*window)
    locator = mdates.AutoDateLocator(tz=UTC)
    rate_ax.xaxis.set_major_locator(locator)
    rate_ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    rate_ax.set_xlabel("time (UTC)")
    legend = [handle for key, handle in _legend_handles().items() if drawn.get(key)]
    if legend:
        fig.legend(handles=legend, loc="outside upper center", ncols=len(legend), frameon=False, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    fig.clear()
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _draw_terms(
    ax: Axes, lanes: dict[str, int], terms: Sequence[tuple[Term, float, float]], window: tuple[float, float]
) -> dict[str, bool]:
    """One lane per broker, a bar per active term coloured by how it ended; says which endings it drew."""
    width = window[1] - window[0]
    drawn: dict[str, bool] = {}
    for broker, lane in lanes.items():
        own = [(t, x0, x1) for t, x0, x1 in terms if t["broker"] == broker]
        # A term shorter than a pixel still gets a visible sliver: a blip of an active is news.
        spans = [(x0, max(x1 - x0, width / 800)) for _, x0, x1 in own]
        colours = [_TERM_COLOURS.get(t["ended"], "#999999") for t, _, _ in own]
        # A white edge parts back-to-back terms of one broker, but would wash out a bar a pixel or two wide.
        edges = [0.6 if span > width / 250 else 0.0 for _, span in spans]
        ax.broken_barh(spans, (lane - 0.32, 0.64), facecolors=colours, edgecolor="white", linewidth=edges)
        for t, x0, x1 in own:
            drawn[t["ended"]] = True
            label = str(t["epoch"])  # only where it fits: a digit is ~0.066 in at 7.5 pt, on ~9.4 in of axis
            if x1 - x0 > (0.066 * len(label) + 0.03) * width / 9.4:
                ax.text((x0 + x1) / 2, lane, label, ha="center", va="center", fontsize=7.5, color="white")
    ax.set_yticks(list(lanes.values()), [_plain(broker) for broker in lanes])
    ax.set_ylim(max(len(lanes), 1) - 0.5, -0.5)
    ax.set_ylabel("active terms\n(label: epoch)", fontsize=9)
    if not lanes:
        ax.text(0.5, 0.5, "no active terms", transform=ax.transAxes, ha="center", color="#666666")
    return drawn


def _draw_rate(ax: Axes, counts: Sequence[int], bucket_seconds: int, start: datetime | None) -> None:
    if start is None:
        ax.text(0.5, 0.5, "no deliveries", transform=ax.transAxes, ha="center", color="#666666")
    else:
        edges, rates = _rate_steps(counts, bucket_seconds)
        xs = [_x(start + timedelta(seconds=edge)) for edge in edges]
        ax.stairs(rates, xs, fill=True, color="#72b7b2", alpha=0.75)
        ax.stairs(rates, xs, color="#2f7d78", lw=0.8)
        ax.set_ylim(bottom=0)
    ax.set_ylabel("deliveries/s")


def _legend_handles() -> dict[str, Artist]:
    handles: dict[str, Artist] = {
        end: Patch(color=c, label=f"term {end}") for end, c in _TERM_COLOURS.items()
    }
    handles["failover"] = Line2D([], [], color=_FAILOVER_COLOUR, lw=0.7, label="failover")
    handles["bad"] = Line2D([], [], color=_VIOLATION_COLOUR, marker="X", ls="", label="violation example")
    handles["other"] = Line2D([], [], color=_OTHER_COLOUR, marker="D", ls="", label="other anomaly example")
    return handles
