"""How sure a table's numbers are: bootstrap intervals of its cells and paired comparisons.

A cell's interval resamples its seeds, then the test images (:mod:`featcache.stats`), from each
seed's test scores (:mod:`featcache.protocol.test_scores`): it covers the uncertainty that comes
from which test images were drawn and, with several seeds, from the training seed; not the
choice of hyper-parameters on the validation split, nor training randomness the seeds do not
vary. A comparison with the ``versus`` loss scores both cells on the same resampled images
(paired), so what the two share cancels; its p-values are corrected for the number of
comparisons in the table by Holm's procedure. Per class, the same resamples give each class's
paired difference (the report's heatmap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from featcache.protocol.rescore import read_test_scores
from featcache.protocol.table_cells import Cell
from featcache.protocol.test_scores import NoScores, TestScores, write_test_scores
from featcache.stats import Difference, Interval, RankedClasses, Resampling
from featcache.stats.bootstrap import Scored, resampled_ap
from featcache.stats.intervals import holm, interval_of, paired_difference

#: family-wise level of Holm's correction
FAMILY_LEVEL = 0.05


def interval_method(plan: Resampling) -> str:
    """One sentence saying how the intervals were made (captions, JSON, results.json)."""
    return (f"{plan.level:.0%} percentile bootstrap intervals over the test images "
            f"({plan.resamples} resamples, resampling seed {plan.seed}; with several seeds, the "
            "seeds are resampled, then the images)")


@dataclass
class CellUncertainty:
    """A cell's interval and, against the ``versus`` loss, its paired difference."""

    seeds: list[int] = field(default_factory=list)  # the seeds whose scores were resampled
    classes: list[str] = field(default_factory=list)
    images: str | None = None  # which test images it was resampled on (cells paired if equal)
    class_ap: np.ndarray | None = None  # (resamples, L): resampled per-class AP in [0, 1]
    interval: Interval | None = None
    reason: str | None = None  # why there is no interval
    versus: Difference | None = None
    survives_holm: bool | None = None
    #: per class: (low, high) of the paired difference (points) to the versus loss
    class_versus: dict[str, tuple[float, float]] = field(default_factory=dict)

    def resampled_map(self) -> np.ndarray:
        """The mAP (percent) in every resample."""
        assert self.class_ap is not None
        return self.class_ap.mean(axis=1) * 100.0

    def to_json(self) -> dict:
        out: dict = {"seeds_resampled": self.seeds}
        if self.interval is None:
            return {**out, "interval": None, "reason": self.reason}
        out["interval"] = self.interval.to_json()
        if self.versus is not None:
            out["versus"] = {**self.versus.to_json(), "survives_holm": self.survives_holm}
        return out


@dataclass
class TableUncertainty:
    """The intervals and comparisons of every cell of a results table."""

    plan: Resampling
    versus: str | None
    cells: dict[tuple[str, str], CellUncertainty]
    notes: list[str] = field(default_factory=list)

    @property
    def comparisons(self) -> int:
        return sum(c.versus is not None for c in self.cells.values())

    def method(self) -> str:
        text = interval_method(self.plan)
        if self.versus is not None:
            text += (f"; differences to {self.versus} on the same resampled images (paired), "
                     f"wins = share of resamples in which the loss scores above {self.versus} "
                     "(ties count half), * = the difference survives Holm's correction over the "
                     f"{self.comparisons} comparisons of the table (family-wise "
                     f"{FAMILY_LEVEL:.0%}; two-sided p-values from the bootstrap standard error)")
        return text

    def to_json(self) -> dict:
        return {**self.plan.to_json(), "method": self.method(), "versus": self.versus,
                "comparisons": self.comparisons, "family_level": FAMILY_LEVEL,
                "notes": self.notes}


def seed_scores(cell: Cell, run_dirs: Mapping[str, Path] | None = None
                ) -> tuple[TestScores | None, list[np.ndarray], list[int], list[str]]:
    """Each seed's test scores of a cell (from every run pooled in it), the seeds they are of,
    and notes; the first run's scores stand for the images they were scored on."""
    runs = list(dict.fromkeys(choice.run for choice in cell.seeds))
    first: TestScores | None = None
    arrays: list[np.ndarray] = []
    seeds: list[int] = []
    notes: list[str] = []
    for run, document in zip(runs, cell.documents, strict=True):
        folder = Path(run_dirs[run]) if run_dirs and run in run_dirs else Path(run)
        try:
            found = read_test_scores(folder, document)
        except NoScores as exc:
            notes.append(str(exc))
            continue
        wanted = [c.seed for c in cell.seeds if c.run == run]
        if first is not None and not found.same_images(first):
            notes.append(f"{folder} was scored on other test images than the cell's other runs; "
                         "left out of its interval")
            continue
        first = first or found
        notes += found.notes
        mine = [s for s in wanted if s in found.seeds]
        arrays += found.of_seeds(mine)
        seeds += mine
    return first, arrays, seeds, notes


def run_interval(scores: TestScores, estimate: float, key: str, plan: Resampling,
                 workers: int | None = None) -> Interval:
    """The interval of one run's test mAP (every seed it holds)."""
    ranked = [RankedClasses(s, scores.targets) for s in scores.scores]
    (class_ap,) = resampled_ap([Scored(key, ranked)], plan, workers)
    return interval_of(estimate, class_ap.mean(axis=1) * 100.0, plan)


def interval_record(scores: TestScores, estimate: float, key: str,
                    plan: Resampling | None = None) -> dict:
    """What ``results.json`` keeps of the run's interval (``uncertainty``)."""
    plan = plan or Resampling()
    interval = run_interval(scores, estimate, key, plan)
    return {"test_map": interval.to_json(), "seeds": scores.seeds, "method": interval_method(plan),
            "scores": "test-scores.h5"}


def table_uncertainty(cells: Mapping[tuple[str, str], Cell], plan: Resampling,
                      versus: str | None = None, run_dirs: Mapping[str, Path] | None = None,
                      workers: int | None = None) -> TableUncertainty:
    """Intervals of every cell and, with ``versus``, each cell's paired difference to that
    loss's cell on the same dataset (Holm's correction over all of them)."""
    result = TableUncertainty(plan, versus, {})
    groups: dict[str, list[tuple[tuple[str, str], TestScores, list[RankedClasses]]]] = {}
    for key, cell in cells.items():
        found, arrays, seeds, notes = seed_scores(cell, run_dirs)
        result.notes += [note for note in notes if note not in result.notes]
        mine = result.cells[key] = CellUncertainty(seeds)
        if found is None or not arrays:
            mine.reason = "no test scores" + (f" ({notes[0]})" if notes else "")
            continue
        mine.classes = found.classes
        # ranked now, so that no cell's scores are held beside every other cell's ranking
        try:
            ranked = [RankedClasses(a, found.targets) for a in arrays]
        except ValueError as exc:  # NaN scores of a head that diverged
            mine.reason = f"its test scores cannot be ranked ({exc})"
            continue
        groups.setdefault(key[1], []).append((key, replace(found, scores=found.scores[:0]),
                                              ranked))
    for dataset, members in groups.items():
        _resample_dataset(dataset, members, cells, result, workers)
    if versus is not None:
        _compare(cells, result, versus)
    return result


def _resample_dataset(dataset: str, members: Sequence, cells: Mapping[tuple[str, str], Cell],
                      result: TableUncertainty, workers: int | None) -> None:
    """Resample the cells of one dataset, those on the same test images together (paired)."""
    batches: list[list] = []
    for member in members:
        for batch in batches:
            if batch[0][1].same_images(member[1]):
                batch.append(member)
                break
        else:
            batches.append([member])
    for number, batch in enumerate(batches):
        scored = [Scored(f"{dataset}/{key[0]}", ranked) for key, _, ranked in batch]
        for (key, _, _), class_ap in zip(batch, resampled_ap(scored, result.plan, workers),
                                         strict=True):
            mine = result.cells[key]
            mine.class_ap, mine.images = class_ap, f"{dataset}#{number}"
            mine.interval = interval_of(cells[key].estimate.mean, mine.resampled_map(),
                                        result.plan)
    if len(batches) > 1:
        result.notes.append(f"{dataset}: the runs were scored on {len(batches)} different sets "
                            "of test images (other labels files or unreadable images dropped); "
                            "only runs on the same images are compared")


def _compare(cells: Mapping[tuple[str, str], Cell], result: TableUncertainty,
             versus: str) -> None:
    """Each cell's paired difference to the ``versus`` cell of its dataset, Holm-corrected."""
    compared = []
    for (loss, dataset), mine in result.cells.items():
        reference = result.cells.get((versus, dataset))
        if (loss == versus or reference is None or mine.class_ap is None
                or mine.images != reference.images):
            continue
        cell, base = cells[(loss, dataset)], cells[(versus, dataset)]
        mine.versus = paired_difference(cell.estimate.mean - base.estimate.mean,
                                        mine.resampled_map() - reference.resampled_map(),
                                        result.plan)
        per_class = (mine.class_ap - reference.class_ap) * 100.0
        low, high = np.quantile(per_class, result.plan.quantiles(), axis=0)
        mine.class_versus = {name: (float(a), float(b))
                             for name, a, b in zip(mine.classes, low, high, strict=True)}
        compared.append(mine)
    kept = holm([c.versus.p_value for c in compared if c.versus is not None], FAMILY_LEVEL)
    for mine, survives in zip(compared, kept, strict=True):
        mine.survives_holm = survives



def keep_test_scores(run_dir: Path, scores: np.ndarray, seeds: Sequence[int], targets,
                     rows, classes: Sequence[str], document: dict, estimate: float) -> None:
    """Write a finished run's ``test-scores.h5`` and add its interval to its results
    ``document`` (``uncertainty``; the document is written after, by the stage)."""

    write_test_scores(run_dir, scores, seeds, targets, rows, classes, document)
    found = TestScores(list(seeds), np.asarray(scores, np.float32).reshape(
        len(seeds), *np.shape(targets)), (np.asarray(targets) > 0).astype(np.uint8),
        np.asarray(rows), list(classes), (document.get("labels") or {}).get("sha256"))
    try:
        document["uncertainty"] = interval_record(found, estimate,
                                                  f"{document['dataset']}/{document['loss']}")
    except ValueError as exc:  # NaN scores of a head that diverged: no interval, said
        document["uncertainty"] = {"test_map": None, "reason": f"no interval: {exc}"}
