"""The per-class AP heatmap of a loss table: its cells (mean AP over seeds, the difference
against the reference loss, its paired interval and whether that interval excludes 0, which
outlines the cell), drawn as inline SVG, and its section of the page with the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from featcache.errors import plural
from featcache.protocol.results_table import STAGES
from featcache.report import uncertainty as ci
from featcache.report.advice import missing_reference_note
from featcache.report.groups import REFERENCE_LOSS, TableGroup
from featcache.report.html import STAGE_TITLES, esc


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


#: (loss, class) -> its cell
HeatCells = dict[tuple[str, str], HeatCell]


def per_class_cells(group: TableGroup) -> tuple[list[str], list[str], HeatCells, str | None]:
    """The heatmap of a table: losses, classes, cells (with the difference against ``an``,
    its paired interval, and whether that interval excludes 0) and the reference loss (None
    when ``an`` is not there)."""
    table = group.table
    dataset = table.datasets[0]
    estimates = {}
    for loss in table.losses:
        table_cell = table.cells.get((loss, dataset))
        if table_cell is not None:
            estimates[loss] = table_cell.per_class()[0]
    losses = [loss for loss in table.losses if estimates.get(loss)]
    classes = next((list(v) for v in estimates.values() if v), [])
    reference = REFERENCE_LOSS if REFERENCE_LOSS in losses else None
    paired = group.uncertainty.cells if reference is not None else {}
    cells: HeatCells = {}
    for loss in losses:
        for name, value in estimates[loss].items():
            cell = HeatCell(value.mean, value.sd, value.n)
            if reference is not None and loss != reference:
                base = estimates[reference].get(name)
                found = paired.get((loss, dataset))
                if base is not None:
                    cell.delta = value.mean - base.mean
                if found is not None and name in found.class_versus:
                    cell.interval = found.class_versus[name]
                    cell.significant = cell.interval[0] > 0 or cell.interval[1] < 0
            cells[(loss, name)] = cell
    return losses, classes, cells, reference


def heatmap_html(group: TableGroup, index: int, number_text: str = "") -> str:
    """The per-class AP heatmap of one table, with its key."""
    losses, classes, cells, reference = per_class_cells(group)
    if not losses:
        return ""
    title = (f"Per-class test AP (%), {STAGES.get(group.stage, group.stage)}, "
             f"{group.table.datasets[0]}")
    links = {loss: f"loss-{loss}" for loss in losses}
    if reference is None:
        key = missing_reference_note(group)
    else:
        key = ci.heatmap_rule(group, reference)
    missing = sorted({c for cell in group.table.cells.values()
                      for c in cell.classes_without_positives})
    extra = (f" Classes without a test positive (AP 0 by the protocol): {esc(', '.join(missing))}."
             if missing else "")
    return (f'<h3 id="heatmap-{index}">{esc(STAGE_TITLES.get(group.stage, group.stage))}'
            f"{number_text}</h3>"
            f'<p class="caption">Colour: test AP, mean over seeds (white 0, dark blue 100); '
            f"{key}. Hover a cell for its numbers.{extra}</p>"
            f'<div class="scroll">{heatmap_svg(losses, classes, cells, title, reference, links)}'
            "</div>")


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
                cells: HeatCells, title: str, reference: str | None,
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
            stroke = mark = direction = ""
            if cell.significant and cell.delta is not None:
                up = cell.delta > 0
                direction = " gain" if up else " loss" if cell.delta < 0 else ""
                gains, losses = gains + up, losses + (not up)
                colour = "#1a9850" if up else "#d73027"
                stroke = f' stroke="{colour}" stroke-width="2.5"'
                mark = (f'<text x="{x0 + cell_w - 5}" y="{cy + 8}" class="mark" fill="{colour}" '
                        f'text-anchor="middle">{"&#9650;" if up else "&#9660;"}</text>')
            text_colour = "#fff" if cell.mean > 55 else "#111"
            parts.append(f'<g class="cell{direction}">'
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
