"""A results table with its intervals (``featcache table --ci [--versus LOSS]``).

Each cell reads ``mean [low, high]``; with ``--versus`` two columns per dataset follow: the
difference to that loss with its paired interval (``*`` where it survives Holm's correction)
and the share of resamples the row's loss wins; where the protocol has a published number,
whether it falls inside our interval. The caption says how the intervals were made.
"""

from __future__ import annotations

from featcache.protocol.results_table import ResultsTable
from featcache.protocol.table_cells import Cell
from featcache.protocol.uncertainty import CellUncertainty, TableUncertainty
from featcache.tables import Table

#: what a cell without scores shows in place of its interval
NO_INTERVAL = "[no interval]"


def interval_text(cell: Cell, mine: CellUncertainty | None) -> str:
    """``72.66 [71.20, 74.01]`` (the mean over seeds and the interval)."""
    if mine is None or mine.interval is None:
        return f"{cell.estimate.mean:.2f} {NO_INTERVAL}"
    return mine.interval.text()


def versus_text(mine: CellUncertainty | None, loss: str, versus: str) -> tuple[str | None, str | None]:
    """The difference with its paired interval (and Holm's mark), and the share won."""
    if loss == versus:
        return "(reference)", None
    if mine is None or mine.versus is None:
        return None, None
    mark = " *" if mine.survives_holm else ""
    return mine.versus.text() + mark, f"{mine.versus.wins:.0%}"


def published_inside(cell: Cell, mine: CellUncertainty | None) -> bool | None:
    """Whether the published number lies inside our interval (None: nothing to compare)."""
    if cell.published is None or mine is None or mine.interval is None:
        return None
    return mine.interval.contains(cell.published)


def interval_table(results: ResultsTable, unc: TableUncertainty) -> Table:
    """The display table (Markdown, LaTeX) with intervals, comparisons and published numbers."""
    with_published = results.published_datasets()
    columns = ["loss"]
    for dataset in results.datasets:
        columns.append(dataset)
        if unc.versus is not None:
            columns += [f"{dataset} - {unc.versus}", f"{dataset} wins"]
        if dataset in with_published:
            columns += [f"{dataset} published", f"{dataset} delta",
                        f"{dataset} published inside"]
    table = Table(columns, caption=caption(results, unc), notes=notes(results, unc))
    for loss in results.losses:
        row: list = [loss]
        for dataset in results.datasets:
            cell = results.cells.get((loss, dataset))
            mine = unc.cells.get((loss, dataset))
            row.append(None if cell is None else interval_text(cell, mine))
            if unc.versus is not None:
                row += list(versus_text(mine, loss, unc.versus)) if cell else [None, None]
            if dataset in with_published:
                row += ([None] * 3 if cell is None else
                        [cell.published, cell.delta, published_inside(cell, mine)])
        table.add(*row)
    table.bold = results.best_cells(columns)
    return table


def flat_interval_table(results: ResultsTable, unc: TableUncertainty) -> Table:
    """The same numbers as plain columns (CSV)."""
    names = ["", " sd", " seeds", " low", " high", " published", " delta", " published inside"]
    if unc.versus is not None:
        names += [f" - {unc.versus}", f" - {unc.versus} low", f" - {unc.versus} high",
                  f" - {unc.versus} wins", f" - {unc.versus} p", f" - {unc.versus} holm"]
    table = Table(["loss"] + [dataset + name for dataset in results.datasets for name in names])
    for loss in results.losses:
        row: list = [loss]
        for dataset in results.datasets:
            cell = results.cells.get((loss, dataset))
            if cell is None:
                row += [None] * len(names)
                continue
            mine = unc.cells.get((loss, dataset))
            interval = None if mine is None else mine.interval
            value = cell.estimate
            row += [value.mean, value.sd, value.n, interval and interval.low,
                    interval and interval.high, cell.published, cell.delta,
                    published_inside(cell, mine)]
            if unc.versus is not None:
                row += _versus_numbers(mine)
        table.add(*row)
    return table


def _versus_numbers(mine: CellUncertainty | None) -> list:
    """Difference, its interval, wins, p-value and Holm's verdict (CSV), or empty cells."""
    if mine is None or mine.versus is None:
        return [None] * 6
    versus = mine.versus
    return [versus.interval.estimate, versus.interval.low, versus.interval.high, versus.wins,
            versus.p_value, mine.survives_holm]


def interval_json(results: ResultsTable, unc: TableUncertainty, per_class: bool = False) -> dict:
    """:meth:`ResultsTable.to_json` with each cell's interval and comparison, and how they
    were made (resamples, resampling seed, level, method)."""
    out = results.to_json(per_class=per_class)
    out["caption"] = caption(results, unc)
    out["notes"] = notes(results, unc)
    out["uncertainty"] = unc.to_json()
    for row in out["rows"]:
        for dataset in results.datasets:
            if row.get(dataset) is None:
                continue
            mine = unc.cells.get((row["loss"], dataset))
            record = CellUncertainty().to_json() if mine is None else mine.to_json()
            record["published_inside"] = published_inside(results.cells[(row["loss"], dataset)],
                                                          mine)
            row[dataset]["uncertainty"] = record
    return out


def caption(results: ResultsTable, unc: TableUncertainty) -> str:
    """The table's caption and how its intervals were made."""
    text = results.caption(bold="best mean per dataset in bold")
    text += f" Cells: mean [low, high]: {unc.method()}."
    if results.published_datasets():
        text += " Published inside: whether the published number lies inside our interval."
    if all(len(mine.seeds) <= 1 for mine in unc.cells.values()):
        text += (" One seed per cell: the intervals show test-set uncertainty only, not the "
                 "training randomness another seed would add.")
    return text


def notes(results: ResultsTable, unc: TableUncertainty) -> list[str]:
    """The table's notes, why any cell has no interval, and the resampling's notes."""
    out = list(results.notes())
    for (loss, dataset), mine in unc.cells.items():
        if mine.interval is None and mine.reason:
            out.append(f"{loss} on {dataset}: {mine.reason}")
    return out + [note for note in unc.notes if note not in out]
