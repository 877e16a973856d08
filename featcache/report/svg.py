"""Inline SVG figures of the report: learning curves and the per-class AP heatmap.

Drawn as text (no matplotlib, no files): a page that embeds them works opened from disk, and
every line and cell carries a ``<title>`` (the browser's tooltip) with its exact numbers. No
``xmlns`` attribute: inline SVG in HTML needs none, and the page holds no URL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from featcache.errors import plural

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
             f'<text x="{left}" y="15" class="chart-title">{escape(title)}</text>']
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


@dataclass
class HeatCell:
    """One loss x class cell: mean AP over seeds, its sd, and the difference against ``an``."""

    mean: float
    sd: float
    seeds: int
    delta: float | None = None  # against the reference loss (None: no reference)
    #: the paired interval of the difference (None: no test scores to resample)
    interval: tuple[float, float] | None = None
    significant: bool = False  # the interval excludes 0


def heat_colour(value: float) -> str:
    """White (AP 0) to dark blue (AP 100)."""
    t = min(max(value / 100.0, 0.0), 1.0)
    start, end = (247, 251, 255), (8, 48, 107)
    r, g, b = (round(a + (b_ - a) * t) for a, b_ in zip(start, end, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _cell_tip(loss: str, name: str, cell: HeatCell, reference: str | None) -> str:
    """A heat-map cell's tooltip: its AP (over seeds) and its difference to the reference."""
    tip = f"{loss} / {name}: AP {cell.mean:.2f}"
    if cell.seeds > 1:
        tip += f" ± {cell.sd:.2f} over {plural(cell.seeds, 'seed')}"
    if cell.delta is not None:
        tip += f"; {cell.delta:+.2f} against {reference}"
    if cell.interval is not None:
        tip += f" [{cell.interval[0]:+.2f}, {cell.interval[1]:+.2f}]"
    return tip


def heatmap_svg(rows: Sequence[str], classes: Sequence[str],
                cells: dict[tuple[str, str], HeatCell], title: str, reference: str | None,
                links: dict[str, str] | None = None) -> str:
    """Losses (rows) x classes (columns), coloured by AP; a cell where a loss gains on the
    reference loss is outlined green with a triangle up, one where it loses red with a
    triangle down; the numbers in the cell when it is wide enough, always in its tooltip."""
    cell_w = 46 if len(classes) <= 12 else 34 if len(classes) <= 30 else 14
    cell_h = 22 if len(classes) <= 12 else 20
    label_w = 10 + 7 * max((len(r) for r in rows), default=4)
    top = 16 + 6 * min(max((len(c) for c in classes), default=4), 24)
    width = label_w + cell_w * len(classes) + 90
    height = top + cell_h * len(rows) + 8
    parts = [f'<svg class="heatmap" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}">']
    for j, name in enumerate(classes):
        cx = label_w + cell_w * j + cell_w / 2
        parts.append(f'<text transform="translate({cx + 3:.1f},{top - 4}) rotate(-60)" '
                     f'class="tick">{escape(name[:24])}</text>')
    for i, loss in enumerate(rows):
        cy = top + cell_h * i
        label = escape(loss)
        if links and loss in links:
            label = f'<a href="#{escape(links[loss])}">{label}</a>'
        parts.append(f'<text x="{label_w - 6}" y="{cy + cell_h * 0.7:.1f}" class="row-label" '
                     f'text-anchor="end">{label}</text>')
        gains = losses = 0
        for j, name in enumerate(classes):
            cell = cells.get((loss, name))
            x0 = label_w + cell_w * j
            if cell is None:
                parts.append(f'<rect x="{x0}" y="{cy}" width="{cell_w - 1}" height="{cell_h - 1}" '
                             'class="empty"/>')
                continue
            tip = _cell_tip(loss, name, cell, reference)
            stroke = ""
            mark = ""
            if cell.significant and cell.delta is not None:
                up = cell.delta > 0
                gains, losses = gains + up, losses + (not up)
                colour = "#1a9850" if up else "#d73027"
                stroke = f' stroke="{colour}" stroke-width="2.5"'
                mark = (f'<text x="{x0 + cell_w - 5}" y="{cy + 8}" class="mark" fill="{colour}" '
                        f'text-anchor="middle">{"&#9650;" if up else "&#9660;"}</text>')
            text_colour = "#fff" if cell.mean > 55 else "#111"
            parts.append(f'<g class="cell{" gain" if mark and cell.delta > 0 else ""}'
                         f'{" loss" if mark and cell.delta < 0 else ""}">'
                         f'<rect x="{x0 + 1}" y="{cy + 1}" width="{cell_w - 3}" '
                         f'height="{cell_h - 3}" fill="{heat_colour(cell.mean)}"{stroke}/>'
                         + (f'<text x="{x0 + cell_w / 2:.1f}" y="{cy + cell_h * 0.68:.1f}" '
                            f'class="value" fill="{text_colour}" text-anchor="middle">'
                            f'{cell.mean:.0f}</text>' if cell_w >= 30 else "")
                         + mark + f"<title>{escape(tip)}</title></g>")
        if reference is not None and loss != reference:
            parts.append(f'<text x="{label_w + cell_w * len(classes) + 6}" '
                         f'y="{cy + cell_h * 0.7:.1f}" class="tick">'
                         f'&#9650;{gains} &#9660;{losses}</text>')
    parts.append("</svg>")
    return "".join(parts)
