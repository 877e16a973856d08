"""The report's label sets: for each loss table whose runs recorded them, the conformal label
sets at every recorded level beside the test mAP (:mod:`featcache.protocol.label_sets_table`)."""

from __future__ import annotations

from collections.abc import Sequence

from featcache.protocol.label_sets_table import cell_sets, interval_text, sets_caption
from featcache.report.groups import TableGroup
from featcache.report.html import STAGE_TITLES, esc
from featcache.stats.label_sets import DEFAULT_METHOD, LEVELS


def _has_sets(group: TableGroup) -> bool:
    return any(run.document.get("label_sets") for run in group.runs)


def _cells(group: TableGroup, loss: str, notes: list[str]) -> str:
    """``loss``'s row: its test mAP, then share, size and top-k at every level."""
    dataset = group.table.datasets[0]
    cell = group.table.cells[(loss, dataset)]
    html = f'<td data-v="{cell.estimate.mean!r}">{cell.estimate.text()}</td>'
    for level in LEVELS:
        found = cell_sets(cell, level, DEFAULT_METHOD)
        test = found.test
        if test is None:
            if found.reason and f"{loss}: {found.reason}" not in notes:
                notes.append(f"{loss}: {found.reason}")
            html += '<td data-v="">-</td>' * 3
            continue
        share, size = test["share"], test["mean_size"]
        html += (f'<td data-v="{share["estimate"]!r}">{interval_text(share, 3)}</td>'
                 f'<td data-v="{size["estimate"]!r}">{interval_text(size, 2)}</td>'
                 f'<td data-v="{test["smallest_top_k"]}">{test["smallest_top_k"]}</td>')
    return html


def label_sets_section(groups: Sequence[TableGroup]) -> str:
    """The section, or nothing when no run recorded label sets."""
    parts = []
    for index, group in enumerate(groups):
        if not _has_sets(group):
            continue
        head = "<tr><th>loss</th><th>test mAP</th>" + "".join(
            f"<th>share @{level:g}</th><th>size @{level:g}</th><th>top-k @{level:g}</th>"
            for level in LEVELS) + "</tr>"
        notes: list[str] = []
        rows = "".join(f'<tr><td data-v="{esc(loss)}"><a href="#loss-{esc(loss)}">{esc(loss)}'
                       f"</a></td>{_cells(group, loss, notes)}</tr>"
                       for loss in group.table.losses)
        caption = sets_caption(group.table, LEVELS[1], DEFAULT_METHOD).replace(
            f"at level {LEVELS[1]:g}", "at levels " + ", ".join(f"{v:g}" for v in LEVELS))
        parts.append(f'<h3 id="sets-{index}">{esc(STAGE_TITLES.get(group.stage, group.stage))}'
                     f'</h3><p class="caption">{esc(caption)}</p>'
                     f'<table class="sortable"><thead>{head}</thead><tbody>{rows}</tbody></table>'
                     '<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes)
                     + "</ul>")
    if not parts:
        return ""
    return ('<section id="label-sets"><h2>Label sets</h2><p class="caption">Which labels does '
            "an image have? <code>featcache predict --sets LEVEL</code> answers with a set "
            "calibrated on the single positives of the run's validation rows; here, how the "
            "sets of each run did on its test split.</p>" + "".join(parts) + "</section>")
