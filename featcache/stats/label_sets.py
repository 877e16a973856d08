"""Conformal label sets calibrated on single positives: which labels an image has, with a
guarantee.

Split conformal prediction (the least-ambiguous set-valued classifier of Sadinle, Lei and
Wasserman, JASA 2019; for single positives, Hagos and Lundstrom, arXiv 2509.10689). Each
calibration row (the run's validation split) gives one nonconformity score, that of its
observed single positive y: with n rows, the threshold q is the ceil((n + 1) level)-th smallest
score (no threshold, every class kept, when that exceeds n), and a new image's set is every
class whose score is at most q. If the calibration rows and the new image are exchangeable,
the set holds the new image's single positive, a true positive drawn the way the calibration
rows' were, with probability at least ``level`` (over the draw of both). When the observed
positive is drawn uniformly among an image's positives (the protocol's sampler), that
probability is the expected share of an image's true positives its set holds.

The nonconformity scores, on the head's probabilities p (n, L) as the run scores its rows:

- ``rank`` (the default): r_y - p_y, the rank of p_y in its row (1 for the top class, ties to
  the lower class index) less p_y; with the cut q = m + f (m whole, 0 <= f < 1), every image
  gets its top m classes and the next one where its probability is at least 1 - f: never more
  than a top-k set of the same share, and as adaptive as the probabilities allow at its edge;
- ``threshold`` (Sadinle et al.'s least ambiguous classifier): 1 - p_y; the set is every class
  whose probability is at least one calibrated cut;
- ``class`` (class-wise, as Hagos and Lundstrom calibrate): 1 - p_y among the rows whose
  positive is class y only, one cut per class; a class with fewer than level / (1 - level)
  calibration rows is always kept. Its guarantee holds per class of the single positive.

NumPy only. Measured choices between them: ``docs/label-sets.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from featcache.errors import plural
from featcache.stats.intervals import interval_of
from featcache.stats.resample import Resampling

METHODS = ("rank", "threshold", "class")
DEFAULT_METHOD = "rank"
#: the levels every run records
LEVELS = (0.8, 0.9, 0.95)


def check_level(level: float) -> float:
    """``level`` as a float strictly between 0 and 1, else ValueError naming it."""
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"the level of a label set must lie strictly between 0 and 1, not {level:g}")
    return level


def conformal_index(rows: int, level: float) -> int | None:
    """The 0-based position of the threshold among ``rows`` sorted scores: ceil((n + 1) level)
    - 1, or None when that is past the last (too few rows: the set keeps every class)."""
    position = math.ceil((rows + 1) * check_level(level) - 1e-9)
    return position - 1 if position <= rows else None


def ranks(scores: np.ndarray) -> np.ndarray:
    """Each class's rank in its row (n, L), 1 for the largest score, ties to the lower class."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), axis=1, kind="stable")
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.broadcast_to(np.arange(1, order.shape[1] + 1), order.shape),
                      axis=1)
    return out


@dataclass(frozen=True)
class LabelSetRule:
    """A calibrated rule: ``cut`` is the cut of r - p (``rank``), one probability cut
    (``threshold``) or one per class (``class``; -inf keeps the class always)."""

    method: str
    level: float
    rows: int  # calibration rows
    cut: float | tuple[float, ...]

    def sets(self, scores: np.ndarray) -> np.ndarray:
        """The label sets of rows of probabilities ``scores`` (n, L): bool (n, L)."""
        scores = np.asarray(scores, dtype=np.float64)
        if self.method == "rank":
            return ranks(scores) - scores <= self.cut
        cut = np.asarray(self.cut, dtype=np.float64)
        if cut.ndim and cut.shape[0] != scores.shape[1]:
            raise ValueError(f"a rule calibrated for {plural(cut.shape[0], 'class', 'classes')} cannot score "
                             f"{scores.shape[1]}")
        return scores >= cut

    def describe(self, classes: Sequence[str]) -> str:
        """The rule in words, for a note."""
        if self.method == "rank":
            top, next_at = self.top()
            return (f"each row's top {top} of {plural(len(classes), 'class', 'classes')}"
                    + (f", and the next where its probability is at least {next_at:.4g}"
                       if top < len(classes) else ""))
        if self.method == "threshold":
            cut = float(self.cut)  # type: ignore[arg-type]
            return ("every class" if cut == -math.inf else
                    f"every class with probability at least {cut:.4g}")
        always = sum(c == -math.inf for c in self.cut)  # type: ignore[union-attr]
        return ("one cut per class" + (f" ({always} of {plural(len(classes), 'class', 'classes')} always kept: too "
                                        "few calibration rows)" if always else ""))

    def top(self) -> tuple[int, float]:
        """``rank``: (m, t): every row's top m classes, and the next where its probability is at
        least t."""
        cut = float(self.cut)  # type: ignore[arg-type]
        top = math.floor(cut)
        return top, top + 1.0 - cut

    def to_json(self, classes: Sequence[str]) -> dict:
        """The rule as ``results.json`` keeps it: ``top_k``, or the probability cut (``null``:
        every class kept), or one per class."""
        record: dict = {"method": self.method, "level": self.level, "calibration_rows": self.rows}
        if self.method == "rank":
            top, next_at = self.top()
            record.update(score=float(self.cut), top_k=top,  # type: ignore[arg-type]
                          next_probability=next_at if top < len(classes) else None)
        elif self.method == "threshold":
            record["probability"] = _number(self.cut)
        else:
            record["per_class"] = {name: _number(c) for name, c in
                                   zip(classes, self.cut, strict=True)}  # type: ignore[arg-type]
        return record


def _number(value) -> float | None:
    value = float(value)
    return None if value == -math.inf else value  # JSON: null means the class is always kept


def single_positives(observed: np.ndarray, seed: int = 1200) -> tuple[np.ndarray, np.ndarray]:
    """(rows, positive class) of the calibration rows: each row with an observed positive, its
    one positive (a row with several: one drawn uniformly, seeded)."""
    positive = np.asarray(observed) == 1
    rows = np.flatnonzero(positive.any(axis=1))
    counts = positive[rows].sum(axis=1)
    if (counts == 1).all():
        return rows, np.argmax(positive[rows], axis=1)
    rng = np.random.RandomState(seed)
    chosen = [int(rng.choice(np.flatnonzero(positive[row]))) for row in rows]
    return rows, np.asarray(chosen, dtype=np.int64)


def calibrate(scores: np.ndarray, positives: np.ndarray, level: float,
              method: str = DEFAULT_METHOD) -> LabelSetRule:
    """The rule of ``method`` at ``level`` from the calibration rows' probabilities ``scores``
    (n, L) and each row's single positive ``positives`` (n,)."""
    if method not in METHODS:
        raise ValueError(f"label-set method {method!r}: choose one of {', '.join(METHODS)}")
    scores = np.asarray(scores, dtype=np.float64)
    positives = np.asarray(positives, dtype=np.int64)
    rows, classes = scores.shape
    if len(positives) != rows:
        raise ValueError(f"{plural(rows, 'calibration row')} but {plural(len(positives), 'positive')}")
    if method == "rank":
        taken = np.arange(rows), positives
        placed = np.sort(ranks(scores)[taken] - scores[taken])
        at = conformal_index(rows, level)
        return LabelSetRule(method, level, rows, float(classes if at is None else placed[at]))
    if method == "threshold":
        return LabelSetRule(method, level, rows, _cut(scores[np.arange(rows), positives], level))
    cuts = tuple(_cut(scores[positives == c, c], level) for c in range(classes))
    return LabelSetRule(method, level, rows, cuts)


def _cut(positive_scores: np.ndarray, level: float) -> float:
    """The probability cut: 1 minus the conformal quantile of the scores 1 - p_y, that is the
    ceil((n + 1) level)-th largest p_y (-inf: too few rows, keep every class)."""
    at = conformal_index(len(positive_scores), level)
    return -math.inf if at is None else float(np.sort(positive_scores)[::-1][at])


# ---------------------------------------------------------------------- evaluation
def shares(sets: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each row's share of its true positives that its set holds (rows without positives left
    out): float64 (n',)."""
    truth = np.asarray(targets) > 0
    counts = truth.sum(axis=1)
    kept = counts > 0
    return (np.asarray(sets)[kept] & truth[kept]).sum(axis=1) / counts[kept]


def smallest_top_k(scores: np.ndarray, targets: np.ndarray, share: float) -> int:
    """The smallest k whose top-k sets hold at least ``share`` of each image's positives on
    average (what a set of that share is measured against)."""
    truth = np.asarray(targets) > 0
    kept = truth.sum(axis=1) > 0
    rank = ranks(scores)[kept]
    truth = truth[kept]
    counts = truth.sum(axis=1)
    # the positives each row holds within its top k, for every k at once
    held = np.zeros((len(rank), rank.shape[1] + 1))
    np.add.at(held, (np.nonzero(truth)[0], rank[truth]), 1.0)
    mean = (np.cumsum(held, axis=1)[:, 1:] / counts[:, None]).mean(axis=0)
    reached = np.flatnonzero(mean >= share - 1e-12)
    return int(reached[0] + 1) if reached.size else int(rank.shape[1])


def labelled_rows(targets: np.ndarray) -> int:
    """How many rows of ``targets`` hold a positive: those the label sets are evaluated on."""
    return int((np.asarray(targets) > 0).any(axis=1).sum())


def image_counts(plan: Resampling, targets: np.ndarray) -> np.ndarray:
    """How often each test row with a positive is drawn by each of ``plan``'s resamples
    (float64, rows x resamples): what :func:`evaluate` weighs the rows by."""
    return plan.image_counts(labelled_rows(targets)).astype(np.float64)


def evaluate(rule: LabelSetRule, scores: np.ndarray, targets: np.ndarray,
             plan: Resampling | None = None, counts: np.ndarray | None = None) -> dict:
    """The rule on labelled rows: mean share of each image's positives held and mean set size,
    each with its percentile bootstrap interval over the images (``plan``; ``counts``: its
    :func:`image_counts` of the rows with a positive, when the caller evaluates several rules
    on the same rows), and the smallest top-k reaching the same share."""
    plan = plan or Resampling()
    sets = rule.sets(scores)
    truth = np.asarray(targets) > 0
    kept = truth.sum(axis=1) > 0
    held, sizes = shares(sets, truth), sets[kept].sum(axis=1).astype(np.float64)
    if counts is None:
        counts = image_counts(plan, targets)
    share = interval_of(held.mean(), held @ counts / len(held), plan)
    size = interval_of(sizes.mean(), sizes @ counts / len(held), plan)
    return {"rows": int(len(held)), "share": share.to_json(), "mean_size": size.to_json(),
            "smallest_top_k": smallest_top_k(scores, truth, share.estimate),
            "empty_sets": int((sizes == 0).sum())}
