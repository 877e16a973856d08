"""Average precision of one run's scores under many weightings of its rows, without re-sorting.

A bootstrap resample of the test images is a weighting of them (how often each is drawn), and
AP under weights is scikit-learn's ``average_precision_score`` with ``sample_weight``, which
equals the AP of the resampled rows: with the rows ranked by score and tied scores forming one
threshold, AP = sum over thresholds t holding positives of ``W+(t) / W+ * P(t)``, where
``W+(t)`` is the weight of the positives at t, ``W+`` that of every positive and ``P(t)`` the
weight of the positives scoring at least t over the weight of every row scoring at least t.

Each class is ranked once (:class:`RankedClasses`). The numbers needed per threshold are sums of
weights over sets of rows fixed by the ranking: a row's weight counts towards every threshold
at or below its score, so it is added to the first threshold at or below it (one segment sum)
and cumulative sums over the thresholds give ``P(t)``'s numerator and denominator. All
classes' segment sums for a block of resamples are one sparse matrix product (rows x
resamples), so the work is one pass over the weights per class, vectorised over resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from featcache.errors import plural


@dataclass(frozen=True)
class _Block:
    """Where a class's sums sit in the product: ``start`` the first of its ``size``
    thresholds' sums over every row, then ``size`` sums over its positives."""

    start: int
    size: int


class RankedClasses:
    """The scores (N, L) of one run ranked once per class, for AP under any row weights.

    Scores are compared exactly as given (float32 probabilities reproduce the run's ties); a
    class without a positive gets AP 0, as :mod:`featcache.metrics` does.
    """

    def __init__(self, scores: np.ndarray, targets: np.ndarray):
        scores, positive = np.asarray(scores), np.asarray(targets) > 0
        if scores.ndim != 2 or scores.shape != positive.shape:
            raise ValueError(f"scores {scores.shape} and targets {positive.shape} must both "
                             "be (rows, classes)")
        if not np.isfinite(scores).all():
            raise ValueError("scores must be finite")
        self.rows, self.classes = scores.shape
        sums, images, self.blocks = [], [], []
        offset = 0
        has_positive = np.asarray(positive.any(axis=0))
        for c in range(self.classes):
            if not has_positive[c]:  # AP 0: no threshold holds a positive, no sums to add
                self.blocks.append(_Block(offset, 0))
                continue
            row_sum, pos_sum, size = _segments(scores[:, c], positive[:, c])
            keep = row_sum < size  # rows below every positive count towards no threshold
            pos_rows = np.flatnonzero(positive[:, c])
            sums += [offset + row_sum[keep], offset + size + pos_sum]
            images += [np.flatnonzero(keep), pos_rows]
            self.blocks.append(_Block(offset, size))
            offset += 2 * size
        index = np.concatenate(sums) if sums else np.empty(0, np.int64)
        import scipy.sparse  # here, not at import: a command that never scores pays nothing

        self.matrix = scipy.sparse.csr_matrix(
            (np.ones(index.size, np.float32), (index, np.concatenate(images) if images else index)),
            shape=(offset, self.rows))

    @property
    def sums(self) -> int:
        """Rows of the segment-sum product (its size per resample)."""
        return self.matrix.shape[0]

    def average_precision(self, weights: np.ndarray) -> np.ndarray:
        """AP of every class under each column of ``weights`` (N, R), rows as the scores' rows
        (bootstrap counts: integers below 2**24, so that every sum is exact in float32):
        float64 (R, L)."""
        if weights.shape[0] != self.rows:
            raise ValueError(f"weights for {plural(weights.shape[0], 'row')}; the scores have "
                             f"{plural(self.rows, 'row')}")
        segments = self.matrix @ np.ascontiguousarray(weights, dtype=np.float32)
        out = np.zeros((weights.shape[1], self.classes))
        for c, block in enumerate(self.blocks):
            if block.size:
                out[:, c] = _class_ap(segments, block)
        return out


def _segments(column: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """For one class: the threshold (among those holding a positive, best first) each row is
    added to, the threshold of each positive, and the number of such thresholds."""
    order = np.argsort(-column, kind="stable")
    ranked = column[order]
    group = np.empty(column.size, np.int64)
    group[order] = np.concatenate(([0], np.cumsum(ranked[1:] != ranked[:-1])))
    thresholds = np.unique(group[positive])
    return (np.searchsorted(thresholds, group), np.searchsorted(thresholds, group[positive]),
            thresholds.size)


def _class_ap(segments: np.ndarray, block: _Block) -> np.ndarray:
    """One class's AP per resample from its thresholds' segment sums (float32, exact)."""
    start, size = block.start, block.size
    scoring_at_least = np.cumsum(segments[start:start + size], axis=0)
    positives = segments[start + size:start + 2 * size]
    # positives scoring at least each threshold; summed in float32 (exact, and twice as fast
    # as a cumulative sum that converts to float64 on the way), then float64 for the ratios
    precision = np.cumsum(positives, axis=0).astype(np.float64)
    total = precision[-1].copy()
    np.maximum(scoring_at_least, 1, out=scoring_at_least)  # 0 only where no positive counts
    precision /= scoring_at_least
    precision *= positives
    weighted = precision.sum(axis=0)
    return np.divide(weighted, total, out=np.zeros_like(weighted), where=total > 0)
