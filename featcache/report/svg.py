"""Inline SVG learning curves of the report (the per-class AP heatmap: :mod:`.heatmap`).

Drawn as text (no matplotlib, no files): a page that embeds them works opened from disk, and
every line and selected mark carries a ``<title>`` (the browser's tooltip) with its numbers. No
``xmlns`` attribute: inline SVG in HTML needs none, and the page holds no URL.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

#: colours of the configurations (Tableau 10)
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")


@dataclass
class Series:
    """One configuration's curves: validation and test mAP per epoch."""

    label: str
    epochs: Sequence[int]
    val: Sequence[float | None]
    test: Sequence[float | None]
    colour: str
    selected_epoch: int | None = None  # marked when this configuration was selected
    emphasis: bool = False  # the run's overall selection (a larger mark)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    span = max(high - low, 1e-9)
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def curves_svg(series: Sequence[Series], title: str, width: int = 520, height: int = 300) -> str:
    """Val (solid) and test (dashed) mAP per epoch, one colour per configuration; the selected
    epoch of each selected configuration marked with a star on its val curve and a ring on its
    test curve."""
    left, right, top, bottom = 46, 10, 24, 34
    title_lines = _title_lines(title, width - 8)
    top += TITLE_LINE_PX * (len(title_lines) - 1)
    values = [v for s in series for v in (*s.val, *s.test) if v is not None]
    epochs = [e for s in series for e in s.epochs]
    if not values or not epochs:
        return f'<p class="muted">{escape(title)}: no per-epoch records</p>'
    low, high = min(values), max(values)
    pad = max((high - low) * 0.05, 0.5)
    low, high = max(0.0, low - pad), min(100.0, high + pad)
    first, last = min(epochs), max(epochs)

    def x(epoch: float) -> float:
        return left + (epoch - first) / max(last - first, 1) * (width - left - right)

    def y(value: float) -> float:
        return top + (high - value) / max(high - low, 1e-9) * (height - top - bottom)

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}">',
             '<text x="4" y="15" class="chart-title">'
             + "".join(f'<tspan x="4" dy="{0 if i == 0 else TITLE_LINE_PX}">{escape(line)}</tspan>'
                       for i, line in enumerate(title_lines))
             + (f"<title>{escape(title)}</title>" if title_lines[-1].endswith("\u2026") else "")
             + "</text>"]
    for tick in _ticks(low, high):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" '
                     f'y2="{y(tick):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{y(tick) + 3:.1f}" class="tick" '
                     f'text-anchor="end">{tick:g}</text>')
    for tick in _ticks(first, last, count=min(8, max(1, last - first))):
        if float(tick).is_integer():
            parts.append(f'<text x="{x(tick):.1f}" y="{height - bottom + 13}" class="tick" '
                         f'text-anchor="middle">{int(tick)}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" class="tick" '
                 'text-anchor="middle">epoch (mAP %: val solid, test dashed)</text>')
    marks = []
    for s in series:
        for values_, style in ((s.val, ""), (s.test, ' stroke-dasharray="4 3"')):
            points = " ".join(f"{x(e):.1f},{y(v):.1f}" for e, v in zip(s.epochs, values_,
                                                                       strict=True)
                              if v is not None)
            kind = "val" if not style else "test"
            if points and " " not in points:  # one epoch: a dot, as a line would not show
                cx, cy = points.split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{s.colour}"/>')
            parts.append(f'<polyline points="{points}" fill="none" stroke="{s.colour}" '
                         f'stroke-width="{2 if s.emphasis else 1.2}"{style}>'
                         f'<title>{escape(s.label)} ({kind})</title></polyline>')
        if s.selected_epoch is not None and s.selected_epoch in s.epochs:
            marks += _selected_marks(s, s.selected_epoch, x, y)
    parts += marks
    parts.append("</svg>")
    return "".join(parts)


#: a chart title's line height, and the width of one of its characters on average (11 px
#: bold sans-serif, rounded up so that a title is never clipped at the chart's edge)
TITLE_LINE_PX = 13
TITLE_CHAR_PX = 7.0


def _title_lines(title: str, room: float) -> list[str]:
    """``title`` in at most two lines that fit ``room`` pixels (the second shortened with an
    ellipsis if it must be; the whole title is the chart's tooltip and label)."""
    fits = max(12, int(room / TITLE_CHAR_PX))
    lines = textwrap.wrap(title, fits, break_on_hyphens=False) or [""]
    if len(lines) > 2:
        lines = [lines[0], " ".join(lines[1:])]
    if len(lines[-1]) > fits:
        lines[-1] = lines[-1][:fits - 1] + "…"
    return lines


def _selected_marks(s: Series, epoch: int, x: Callable[[float], float],
                    y: Callable[[float], float]) -> list[str]:
    """The star on the val curve and the ring on the test curve at ``s``'s selected
    ``epoch``."""
    marks = []
    i = list(s.epochs).index(epoch)
    size = 8 if s.emphasis else 5.5
    val, test = s.val[i], s.test[i]
    tip = (f"selected: {s.label}, epoch {epoch}: val "
           f"{_number(val)}, test {_number(test)}")
    if val is not None:
        marks.append(f'<path d="{_star(x(epoch), y(val), size)}" '
                     f'fill="{s.colour}" stroke="#000" stroke-width="0.8" '
                     f'class="selected"><title>{escape(tip)}</title></path>')
    if test is not None:
        marks.append(f'<circle cx="{x(epoch):.1f}" cy="{y(test):.1f}" '
                     f'r="{size * 0.6:.1f}" fill="none" stroke="#000" '
                     f'stroke-width="1.2"><title>{escape(tip)}</title></circle>')
    return marks


def legend_html(series: Sequence[Series]) -> str:
    """The configurations' colours, once per label."""
    seen: dict[str, str] = {}
    for s in series:
        key = s.label.split(", seed")[0]
        seen.setdefault(key, s.colour)
    items = "".join(f'<span class="key"><i style="background:{colour}"></i>{escape(label)}</span>'
                    for label, colour in seen.items())
    return f'<div class="legend">{items} <span class="key">&#9733; selected (val), &#9675; its test mAP</span></div>'


def _star(cx: float, cy: float, r: float) -> str:
    points = []
    for i in range(10):
        radius = r if i % 2 == 0 else r * 0.45
        angle = math.pi / 2 + i * math.pi / 5
        points.append(f"{cx + radius * math.cos(angle):.1f},{cy - radius * math.sin(angle):.1f}")
    return "M" + " L".join(points) + " Z"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
