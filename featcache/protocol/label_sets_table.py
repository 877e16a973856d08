"""Label sets beside mAP: ``featcache table --sets LEVEL`` and the report's label-set table.

Each cell reads its run's ``results.json`` ``label_sets`` (:mod:`featcache.protocol.label_sets`)
at the level and method asked; a level or method the run did not record is computed from its
``val-scores.h5`` and ``test-scores.h5``. A cell of several runs shows its first run's sets (the
sets belong to one head, the one ``best.pt`` keeps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from featcache.protocol.label_sets import NoCalibration, level_entry
from featcache.protocol.results_table import ResultsTable
from featcache.protocol.table_cells import Cell
from featcache.protocol.test_scores import NoScores
from featcache.tables import Table

#: recorded levels are matched within this
SAME_LEVEL = 1e-9


@dataclass
class SetsCell:
    """One run's label sets at one level: the record's entry, or why there is none."""

    entry: dict | None
    run: str | None
    reason: str | None = None

    @property
    def test(self) -> dict | None:
        return None if self.entry is None else self.entry.get("test")


def cell_sets(cell: Cell, level: float, method: str) -> SetsCell:
    """The label sets of ``cell``'s first run that records them, at ``level`` by ``method``."""
    runs = list(dict.fromkeys(choice.run for choice in cell.seeds))
    for run, document in zip(runs, cell.documents, strict=False):
        record = document.get("label_sets")
        if not record:
            continue
        if record.get("reason"):
            return SetsCell(None, run, record["reason"])
        if record.get("test") is None:
            return SetsCell(None, run, "its test split has no full labels: what share of an "
                                       "image's positives a set holds cannot be measured")
        for entry in record.get("levels", []):
            if abs(entry["level"] - level) < SAME_LEVEL and entry["method"] == method:
                return SetsCell(entry, run)
        try:
            return SetsCell(level_entry(Path(run), document, level, method), run)
        except (NoCalibration, NoScores) as exc:
            return SetsCell(None, run, str(exc))
    return SetsCell(None, runs[0] if runs else None,
                    "no label sets recorded (a run made before featcache recorded them: train "
                    "it again)")


def interval_text(record: dict, digits: int) -> str:
    """``0.879 [0.862, 0.897]`` of an interval record."""
    return (f"{record['estimate']:.{digits}f} [{record['low']:.{digits}f}, "
            f"{record['high']:.{digits}f}]")


def label_sets_table(results: ResultsTable, level: float, method: str) -> Table:
    """Losses x datasets: test mAP, then the share of each test image's positives its set holds,
    the mean set size (each with its interval) and the smallest top-k of the same share."""
    columns = ["loss"]
    for dataset in results.datasets:
        columns += [f"{dataset} mAP", f"{dataset} share", f"{dataset} size", f"{dataset} top-k"]
    notes: list[str] = []
    table = Table(columns, caption=sets_caption(results, level, method), notes=notes)
    for loss in results.losses:
        row: list = [loss]
        for dataset in results.datasets:
            cell = results.cells.get((loss, dataset))
            if cell is None:
                row += [None] * 4
                continue
            found = cell_sets(cell, level, method)
            test = found.test
            if test is None:
                notes.append(f"{loss} on {dataset}: {found.reason}")
                row += [cell.estimate, "-", "-", None]
                continue
            row += [cell.estimate, interval_text(test["share"], 3),
                    interval_text(test["mean_size"], 2), test["smallest_top_k"]]
        table.add(*row)
    return table


def flat_sets_table(results: ResultsTable, level: float, method: str) -> Table:
    """The same as plain columns (CSV, JSON): one row per loss and dataset."""
    table = Table(["loss", "dataset", "test mAP", "level", "method", "calibration rows",
                   "share", "share low", "share high", "mean size", "size low", "size high",
                   "smallest top-k", "run", "reason"])
    for loss in results.losses:
        for dataset in results.datasets:
            cell = results.cells.get((loss, dataset))
            if cell is None:
                continue
            found = cell_sets(cell, level, method)
            test = found.test or {}
            share, size = test.get("share", {}), test.get("mean_size", {})
            table.add(loss, dataset, cell.estimate.mean, level, method,
                      None if found.entry is None else found.entry["calibration_rows"],
                      share.get("estimate"), share.get("low"), share.get("high"),
                      size.get("estimate"), size.get("low"), size.get("high"),
                      test.get("smallest_top_k"), found.run, found.reason)
    return table


def sets_caption(results: ResultsTable, level: float, method: str,
                 datasets: Sequence[str] | None = None) -> str:
    """What the label-set columns are."""
    return (f"Conformal label sets at level {level:g} ({method}), calibrated on the observed "
            "single positives of each run's validation split, on the test split of "
            f"{', '.join(datasets or results.datasets)}: share = the mean share of each "
            "test image's true positives its set holds, size = the mean set size, each with "
            "its 95% percentile bootstrap interval over the test images; top-k = the smallest "
            "k whose top-k sets hold the same share; mAP as in the main table. The sets "
            "promise a share of at least the level in expectation over validation and test "
            "images drawn alike (docs/label-sets.md).")
