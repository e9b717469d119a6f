"""Tiny hand-written SVG charts (no matplotlib): a line chart and stacked bars.

The fallback of :mod:`mlbench_runner.tools.plots` when matplotlib (the "plots" extra) is not installed.
"""

from __future__ import annotations

import textwrap
from html import escape

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H, LEFT, RIGHT, TOP, BOTTOM = 720, 440, 70, 190, 40, 70


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def caption_lines(caption: str | None, width: int = 125) -> list[str]:
    """The caption's lines (``\\n`` separated), each wrapped to about the chart's width."""
    return [w for line in (caption or "").splitlines() for w in (textwrap.wrap(line, width) or [""])]


#: Characters per line of a legend entry (the legend column is 190 px wide); longer names wrap, never cut.
LEGEND_WIDTH = 24
LINE = 14
#: The thinnest bar of a bar chart, in pixels: more rows make the image taller instead.
MIN_BAR = 12.0


def _legend(names: list[str]) -> list[str]:
    """The legend column: a colour box and the whole name per entry, wrapped onto as many lines as it needs
    (cutting names made configurations that differ only at their end, e.g. in the batch size, look alike)."""
    out, y = [], TOP + 8.0
    for i, name in enumerate(names):
        color = COLORS[i % len(COLORS)]
        lines = textwrap.wrap(name, LEGEND_WIDTH, break_on_hyphens=False) or [""]
        out.append(f'<rect x="{W - RIGHT + 12}" y="{y - 8:.0f}" width="12" height="10" fill="{color}"/>')
        spans = (
            escape(lines[0])
            if len(lines) == 1
            else "".join(
                f'<tspan x="{W - RIGHT + 30}" dy="{0 if j == 0 else LINE}">{escape(line)}</tspan>'
                for j, line in enumerate(lines)
            )
        )
        out.append(f'<text x="{W - RIGHT + 30}" y="{y + 1:.0f}">{spans}</text>')
        y += LINE * len(lines) + 2
    return out


def _frame(title: str, xlabel: str, ylabel: str, caption: str | None = None, chart: float = H) -> list[str]:
    """The image around a chart ``chart`` pixels high (``H``, or more for many bars), and its caption below."""
    lines = caption_lines(caption)
    height = chart + 13 * max(0, len(lines) - 1)  # the chart keeps its size; extra caption lines go below
    notes = [
        f'<text x="8" y="{chart - 8 + 13 * i}" font-size="10" fill="#555">{escape(line)}</text>'
        for i, line in enumerate(lines)
    ]
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{W}" height="{height}" fill="white"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<text x="{LEFT + (W - LEFT - RIGHT) / 2}" y="{chart - 30}" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="16" y="{TOP + (chart - TOP - BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + (chart - TOP - BOTTOM) / 2})">{escape(ylabel)}</text>',
        *notes,
    ]


def line_chart(
    title: str,
    xlabel: str,
    ylabel: str,
    series: list[tuple[str, list[tuple[float, float]]]],
    *,
    hline: float | None = None,
    ymax: float | None = None,
    caption: str | None = None,
) -> str:
    """Lines with markers, one colour and one legend entry per series *name* (several runs of one
    configuration may share it); ``hline`` draws a dashed target level; ``caption`` a footnote."""
    pts = [p for _, s in series for p in s]
    xmax = max((x for x, _ in pts), default=1.0) or 1.0
    ys = [y for _, y in pts] + ([hline] if hline is not None else [])
    ymin, ymax = 0.0, ymax or max(ys, default=1.0) or 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + pw * x / xmax

    def sy(y: float) -> float:
        return TOP + ph * (1 - (y - ymin) / (ymax - ymin))

    out = _frame(title, xlabel, ylabel, caption)
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    for t in _ticks(0, xmax):
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{t:.3g}</text>')
    for t in _ticks(ymin, ymax):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
    if hline is not None:
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(hline):.1f}" y2="{sy(hline):.1f}" '
            f'stroke="#000" stroke-dasharray="6 4"/>'
        )
    names = list(dict.fromkeys(name for name, _ in series))
    for name, s in series:
        color = COLORS[names.index(name) % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        if path:
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in s]
    out += _legend(names)
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(title: str, xlabel: str, rows: list[tuple[str, dict[str, float]]], caption: str | None = None) -> str:
    """One horizontal bar per row, split into its named parts (e.g. seconds per phase)."""
    parts = list(dict.fromkeys(k for _, r in rows for k in r))
    total = max((sum(r.values()) for _, r in rows), default=1.0) or 1.0
    pw = W - LEFT - RIGHT - 60
    bar = max(MIN_BAR, min(40.0, (H - TOP - BOTTOM) / max(1, len(rows)) - 8 - LINE))
    chart = max(H, TOP + BOTTOM + len(rows) * (bar + 8 + LINE))  # rows that do not fit make the image taller
    out = _frame(title, xlabel, "", caption, chart)
    for i, (name, r) in enumerate(rows):  # each bar's whole name on a line above it: a name is never cut
        y = TOP + i * (bar + 8 + LINE) + LINE
        out.append(f'<text x="{LEFT + 60}" y="{y - 3:.1f}" font-size="11">{escape(name)}</text>')
        x = LEFT + 60.0
        for j, part in enumerate(parts):
            w = pw * r.get(part, 0.0) / total
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{bar:.1f}" '
                f'fill="{COLORS[j % len(COLORS)]}"><title>{escape(part)}: {r.get(part, 0.0):.3g}</title></rect>'
            )
            x += w
    out += _legend(parts)
    out.append(f'<text x="{LEFT + 60 + pw}" y="{chart - 30}" text-anchor="end">max {total:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)
