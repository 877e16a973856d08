"""The report's intervals: extra columns of a loss table, and the sentences that say how to
read them and the heatmap's outlines (:mod:`featcache.protocol.uncertainty` computes them)."""

from __future__ import annotations

from html import escape

from featcache.protocol.uncertainty import CellUncertainty
from featcache.report.groups import TableGroup


def _one_seed(group: TableGroup) -> bool:
    """Whether every cell's interval rests on one seed (test-set uncertainty only)."""
    return all(len(c.seeds) <= 1 for c in group.uncertainty.cells.values())


def interval_head(group: TableGroup) -> str:
    """The header cells of the interval columns."""
    unc = group.uncertainty
    head = f"<th>{unc.plan.level:.0%} interval</th>"
    if unc.versus is not None:
        head += f"<th>&Delta; {escape(unc.versus)} [{unc.plan.level:.0%}]</th><th>wins</th>"
    if group.table.published_datasets():
        head += "<th>published inside</th>"
    return head


def interval_cells(group: TableGroup, loss: str) -> str:
    """The interval columns of ``loss``'s row."""
    unc = group.uncertainty
    dataset = group.table.datasets[0]
    mine = unc.cells.get((loss, dataset))
    interval = None if mine is None else mine.interval
    if interval is None:
        reason = "" if mine is None or mine.reason is None else mine.reason
        cells = f'<td data-v="" title="{escape(reason)}">-</td>'
    else:
        cells = (f'<td data-v="{interval.low!r}">[{interval.low:.2f}, {interval.high:.2f}]'
                 "</td>")
    if unc.versus is not None:
        cells += _versus_cells(mine, loss == unc.versus)
    if group.table.published_datasets():
        cell = group.table.cells[(loss, dataset)]
        inside = (None if cell.published is None or interval is None
                  else interval.contains(cell.published))
        cells += f"<td>{'' if inside is None else 'yes' if inside else 'no'}</td>"
    return cells


def _versus_cells(mine: CellUncertainty | None, reference: bool) -> str:
    if reference:
        return '<td data-v="">(reference)</td><td data-v=""></td>'
    if mine is None or mine.versus is None:
        return '<td data-v=""></td><td data-v=""></td>'
    versus = mine.versus
    tone = ("" if not versus.excludes_zero
            else ' class="up"' if versus.interval.estimate > 0 else ' class="down"')
    mark = " *" if mine.survives_holm else ""
    return (f'<td data-v="{versus.interval.estimate!r}"{tone}>{escape(versus.text())}{mark}</td>'
            f'<td data-v="{versus.wins!r}">{versus.wins:.0%}</td>')


def interval_caption(group: TableGroup) -> str:
    """How the table's intervals were made, and what a one-seed table's cover."""
    text = group.uncertainty.method() + "."
    if group.table.published_datasets():
        text += " Published inside: whether the published number lies inside our interval."
    if _one_seed(group):
        text += (" One seed per loss: the intervals show test-set uncertainty only, not the "
                 "training randomness another seed would add.")
    return text


def interval_notes(group: TableGroup) -> list[str]:
    """Why a loss has no interval, and the resampling's notes."""
    unc = group.uncertainty
    notes = [f"{loss}: no interval ({mine.reason})" for (loss, _), mine in unc.cells.items()
             if mine.interval is None and mine.reason]
    return notes + unc.notes


def heatmap_rule(group: TableGroup, reference: str) -> str:
    """The heatmap's outline rule (HTML), for the caption."""
    plan = group.uncertainty.plan
    rule = (f"outlined green &#9650;: the loss gains on <b>{escape(reference)}</b> for that "
            f"class, red &#9660;: it loses, where the {plan.level:.0%} paired bootstrap interval "
            f"of the per-class AP difference excludes 0 (both scored on the same resampled "
            f"test images: {plan.resamples} resamples, resampling seed {plan.seed}; with "
            "several seeds, seeds resampled too); not corrected for the number of cells, so "
            "about 1 in 20 cells where two losses do not differ is outlined by chance; the "
            "counts at the right of each row")
    if _one_seed(group):
        rule += ("; one seed: these intervals show test-set uncertainty only, not training "
                 "randomness")
    unscored = [loss for (loss, _), mine in group.uncertainty.cells.items()
                if loss != reference and not mine.class_versus]
    if unscored:
        rule += (f"; never outlined, for want of paired test scores: "
                 f"{escape(', '.join(unscored))}")
    return rule
