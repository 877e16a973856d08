"""Conformal label sets of a finished run (``featcache predict --sets LEVEL``,
``load_run(...).predict_sets``): calibrated on the observed single positives of the run's
validation rows, scored by its selected head (``val-scores.h5``,
:mod:`featcache.protocol.label_sets`; the rules: :mod:`featcache.stats.label_sets`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featcache.errors import InputError, OptionError, plural
from featcache.protocol.label_sets import (
    VAL_SCORES_FILE,
    Calibration,
    NoCalibration,
    read_val_scores,
)
from featcache.stats.label_sets import DEFAULT_METHOD, METHODS, LabelSetRule, check_level


def checked_rule_options(level: float, method: str) -> tuple[float, str]:
    """``level`` and ``method`` checked, with errors that name the option."""
    try:
        level = check_level(level)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if method not in METHODS:
        raise OptionError(f"label-set method {method!r}: choose one of {', '.join(METHODS)}")
    return level, method


def calibrated_rule(calibration: Calibration, level: float, method: str) -> LabelSetRule:
    """The rule of ``method`` at ``level``; an error when no row can calibrate it."""
    level, method = checked_rule_options(level, method)
    try:
        return calibration.rule(level, method)
    except ValueError as exc:
        raise InputError(f"label sets cannot be calibrated: {exc}") from None


def rule_note(rule: LabelSetRule, classes, run_dir: Path) -> str:
    """One line on the rule in use: the level, the method, the cut and the calibration."""
    note = (f"label sets at level {rule.level:g} ({rule.method}): {rule.describe(classes)}; "
            f"calibrated on the observed positives of {plural(rule.rows, 'validation row')} "
            f"({Path(run_dir) / VAL_SCORES_FILE})")
    if rule.method == "rank" and rule.top()[0] >= len(classes):
        note += "; too few rows for this level: every class is kept"
    return note


class LabelSets:
    """What a finished run adds for label sets (mixed into :class:`~featcache.api.runs.TrainedRun`)."""

    path: Path
    document: dict

    def calibration(self) -> Calibration:
        """The run's calibration scores (``val-scores.h5``); InputError naming the fix."""
        try:
            found = read_val_scores(self.path, self.document)
        except NoCalibration as exc:
            raise InputError(str(exc)) from None
        if found.classes != list(self.classes):
            raise InputError(f"{self.path}: its validation scores name other classes than its "
                             "head predicts")
        return found

    def label_set_rule(self, level: float = 0.9, method: str = DEFAULT_METHOD) -> LabelSetRule:
        """The conformal rule at ``level``: a set holds a random true positive of an image
        exchangeable with the validation rows with probability at least ``level``."""
        return calibrated_rule(self.calibration(), level, method)

    def predict_sets(self, features, level: float = 0.9,
                     method: str = DEFAULT_METHOD) -> np.ndarray:
        """0/1 label sets (n, L), int64, of ``features`` (as :meth:`predict_proba` takes them)
        at ``level`` (see :meth:`label_set_rule`)."""
        rule = self.label_set_rule(level, method)
        return rule.sets(self.predict_proba(features)).astype(np.int64)

    # provided by the run
    @property
    def classes(self) -> list[str]:
        raise NotImplementedError

    def predict_proba(self, features) -> np.ndarray:
        raise NotImplementedError
