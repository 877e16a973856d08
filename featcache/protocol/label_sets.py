"""A run's label sets: its calibration scores (``val-scores.h5``) and what ``results.json``
records of its conformal label sets (``label_sets``).

Both stages keep, beside ``test-scores.h5``, the probabilities of the run's selected head
(``best.pt``'s: stage two's best seed, stage three's best configuration and epoch) on the
validation rows, with those rows' observed labels: what ``featcache predict --sets LEVEL``
calibrates on (:mod:`featcache.stats.label_sets`). ``val-scores.h5``:

- ``/scores`` float32 (N, L): the probabilities, as the run's evaluation scored the rows;
- ``/observed`` int8 (N, L): the rows' observed labels (1, 0, -1);
- ``/rows`` (N,): rows of the labels file's official training split;
- attributes: format and version, stage, loss, dataset, classes, the labels file's sha256, the
  run's settings fingerprint (a file left from another run is not read).

``results.json`` ``label_sets``: the default method's rule at each of
:data:`~featcache.stats.label_sets.LEVELS` (its cut and the calibration rows) and, where the
test split has full labels, each rule on the test split of the same head: the mean share of an
image's true positives its set holds and the mean set size, each with its bootstrap interval
over the test images, and the smallest top-k reaching the same share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featcache.errors import plural
from featcache.hdf5 import DatasetSpec, encode_attr, write_hdf5_atomic
from featcache.protocol.test_scores import NoScores, checked_scores_file, read_stored_scores
from featcache.stats.label_sets import (
    DEFAULT_METHOD,
    LEVELS,
    LabelSetRule,
    calibrate,
    evaluate,
    image_counts,
    single_positives,
)
from featcache.stats.resample import Resampling

VAL_SCORES_FILE = "val-scores.h5"
VAL_SCORES_FORMAT = "featcache-val-scores"
VAL_SCORES_VERSION = 1
#: the datasets of a validation-scores file, their kinds and shapes
VAL_SCORES_LAYOUT = {"scores": DatasetSpec("float", ("validation rows", "classes")),
                     "observed": DatasetSpec("number", ("validation rows", "classes")),
                     "rows": DatasetSpec("integer", ("validation rows",))}


class NoCalibration(Exception):
    """A run whose calibration scores cannot be had; the message says why and what to do."""


@dataclass
class Calibration:
    """The selected head's scores on the validation rows, with their observed labels."""

    scores: np.ndarray  # (N, L) float32
    observed: np.ndarray  # (N, L) int8
    rows: np.ndarray  # (N,) int64
    classes: list[str]

    def rule(self, level: float, method: str = DEFAULT_METHOD) -> LabelSetRule:
        """The label-set rule of ``method`` at ``level``, calibrated on each row's single
        positive (:func:`~featcache.stats.label_sets.single_positives`)."""
        rows, positives = single_positives(self.observed)
        return calibrate(self.scores[rows], positives, level, method)


def write_val_scores(run_dir: Path, scores, observed, rows, classes: Sequence[str],
                     document: dict) -> Path:
    """Write ``val-scores.h5`` into ``run_dir`` atomically (replacing one that is there)."""

    def fill(h5: h5py.File) -> None:
        h5.create_dataset("scores", data=np.asarray(scores, dtype=np.float32))
        h5.create_dataset("observed", data=np.asarray(observed, dtype=np.int8))
        h5.create_dataset("rows", data=np.asarray(rows, dtype=np.int64))
        identity = {"format": VAL_SCORES_FORMAT, "format_version": VAL_SCORES_VERSION,
                    "stage": document.get("stage"), "loss": document.get("loss"),
                    "dataset": document.get("dataset"), "classes": list(classes),
                    "labels_sha256": (document.get("labels") or {}).get("sha256"),
                    "fingerprint": document.get("fingerprint")}
        for key, value in identity.items():
            if value is not None:
                h5.attrs[key] = encode_attr(value)

    return write_hdf5_atomic(Path(run_dir) / VAL_SCORES_FILE, fill, overwrite=True)


def read_val_scores(run_dir: Path, document: dict) -> Calibration:
    """The run's ``val-scores.h5``; :class:`NoCalibration` saying why when there is none."""
    path = Path(run_dir) / VAL_SCORES_FILE
    if not path.is_file():
        raise NoCalibration(
            f"{run_dir} has no {VAL_SCORES_FILE} (made before featcache kept the validation "
            f"scores that label sets are calibrated on); train it again: `featcache "
            f"{'train-linear' if document.get('stage') == 'linear' else 'finetune'} --dataset "
            f"{document.get('dataset')} --loss {document.get('loss')} --run-id "
            f"{Path(run_dir).name} --overwrite`, with its other options")
    with checked_scores_file(path, run_dir, VAL_SCORES_FORMAT, VAL_SCORES_VERSION,
                             VAL_SCORES_LAYOUT, NoCalibration, "validation-scores") as (h5, attrs):
        found = Calibration(h5["scores"][()], h5["observed"][()], h5["rows"][()],
                            list(attrs.get("classes", [])))
    if attrs.get("fingerprint") != document.get("fingerprint"):
        raise NoCalibration(f"{path} belongs to another run (its settings fingerprint differs "
                            f"from {Path(run_dir) / 'results.json'}'s)")
    if found.scores.shape != found.observed.shape or found.scores.shape[1] != len(found.classes):
        raise NoCalibration(f"{path}: its scores {found.scores.shape}, observed labels "
                            f"{found.observed.shape} and {plural(len(found.classes), 'class', 'classes')} "
                            "disagree")
    return found


def label_sets_record(calibration: Calibration, test_scores: np.ndarray | None,
                      test_targets: np.ndarray | None, method: str = DEFAULT_METHOD,
                      levels: Sequence[float] = LEVELS, plan: Resampling | None = None) -> dict:
    """``results.json``'s ``label_sets``: the rule at each level, and on the test split (full
    labels only: observed single positives cannot say what share of an image's positives a set
    holds) its share and set size with intervals."""
    plan = plan or Resampling()
    rows, _ = single_positives(calibration.observed)
    record: dict = {"method": method, "scores": VAL_SCORES_FILE,
                    "calibration": {"split": "validation", "rows": int(len(rows)),
                                    "positives": "each row's observed positive"},
                    "test": None if test_targets is None else {
                        "interval": {**plan.to_json(), "method": "percentile bootstrap over "
                                                                 "the test images"}},
                    "levels": []}
    if not len(rows):
        record["reason"] = "no validation row has an observed positive to calibrate on"
        return record
    counts = None if test_targets is None else image_counts(plan, test_targets)
    for level in levels:
        rule = calibration.rule(level, method)
        entry = rule.to_json(calibration.classes)
        if test_scores is not None and test_targets is not None:
            entry["test"] = evaluate(rule, test_scores, test_targets, plan, counts)
        record["levels"].append(entry)
    return record


def selected_seed(document: dict) -> int:
    """The seed of the head ``best.pt`` keeps: stage two's selected seed, stage three's."""
    if document.get("stage") == "finetune":
        return int(document["protocol"].get("seed", 0))
    return int(document["selection"].get("seed", 0))


def level_entry(run_dir: Path, document: dict, level: float, method: str,
                plan: Resampling | None = None) -> dict:
    """One level's entry of ``label_sets`` computed again from the run's ``val-scores.h5`` and
    ``test-scores.h5`` (a level or method the run did not record); its test split must have
    full labels (the run's ``label_sets`` says so)."""
    calibration = read_val_scores(run_dir, document)
    stored = read_stored_scores(run_dir, document)
    test = stored.of_seeds([selected_seed(document)])
    if not test:
        raise NoScores(f"{run_dir}: test-scores.h5 holds no scores of seed "
                       f"{selected_seed(document)}, the seed of best.pt")
    rule = calibration.rule(level, method)
    return {**rule.to_json(calibration.classes),
            "test": evaluate(rule, test[0], stored.targets, plan or Resampling())}


def keep_label_sets(run_dir: Path, calibration: Calibration, test_scores: np.ndarray,
                    test_targets: np.ndarray | None, document: dict) -> None:
    """Write a finished run's ``val-scores.h5`` and add ``label_sets`` to its ``document``
    (written after, by the stage). ``test_targets``: the test split's full labels, or None."""
    write_val_scores(run_dir, calibration.scores, calibration.observed, calibration.rows,
                     calibration.classes, document)
    if not (np.isfinite(calibration.scores).all() and np.isfinite(test_scores).all()):
        document["label_sets"] = {"method": DEFAULT_METHOD, "levels": [],
                                  "reason": "no label sets: the head's scores are not finite "
                                            "(it diverged)"}
        return
    document["label_sets"] = label_sets_record(calibration, test_scores, test_targets)
