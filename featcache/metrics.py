"""Average precision on the device, for many heads at once.

Matches scikit-learn's ``average_precision_score`` (the definition the reference code uses):
AP = sum over distinct score thresholds of (R_k - R_{k-1}) * P_k, tied scores forming one
threshold. A class with no positive among the evaluated examples gets AP 0, as in the
reference code (Cole et al., ``metrics.compute_avg_precision``).

Written per positive, the same sum reads AP = mean over positives i of
``#(positives scoring >= s_i) / #(examples scoring >= s_i)``: every positive tied at a
threshold takes that threshold's precision. Both counts come from binary searches in sorted
scores, so one sort of each (head, class) column serves any number of label sets
(:class:`RankedScores`), and only the positives are visited after it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: (head, class) columns x examples ranked at once, at most (one column at least): with more,
#: the columns are ranked a block at a time, so that ranking a large split holds about
#: :data:`RANK_BYTES` per element of one block beside the scores instead of per element of all
RANK_BLOCK = 1 << 19
#: the same on a GPU: its memory holds the scores of every head of a large group, and each
#: block costs two waits for the device (the positives' count and positions)
CUDA_RANK_BLOCK = 1 << 26
#: bytes ranking holds per element of a block: its column copy, sorted copy, int64 keys and
#: positives
RANK_BYTES = 20


class RankedScores:
    """The scores of every (head, class) column sorted once, for several AP computations.

    ``scores`` is (..., N, L); scores are compared exactly as given (pass the float32
    probabilities the reference code evaluates, not logits, to reproduce its ties). Scores of
    more than :data:`RANK_BLOCK` elements (:data:`CUDA_RANK_BLOCK` on a GPU) are ranked a
    block of columns at a time, on each call (each column's AP is computed alone either way:
    the same numbers).
    """

    def __init__(self, scores: Tensor):
        self.num_examples = scores.shape[-2]
        if self.num_examples == 0:
            raise ValueError("average_precision needs at least one example")
        self.shape = scores.shape
        self.scores = scores.detach()
        self.rows = self.scores.transpose(-1, -2)  # (..., L, N): one row per (head, class)
        self.blocks = _column_blocks(scores.shape, CUDA_RANK_BLOCK
                                     if scores.device.type == "cuda" else RANK_BLOCK)
        if len(self.blocks) == 1:
            self.flat = self.rows.reshape(-1, self.num_examples)
            self._keys = _OrderKeys.of(self.flat)
            self.sorted = _sorted(self._keys, self.flat)

    def average_precision(self, targets: Tensor) -> Tensor:
        """AP of every column against ``targets`` (N, L) or (..., N, L) 0/1: float64 (..., L)."""
        n = self.num_examples
        targets = targets.to(device=self.rows.device)
        positives = targets.transpose(-1, -2) > 0 if len(self.blocks) == 1 else targets
        try:  # numpy's, not torch's: torch.broadcast_shapes imports sympy (~0.4 s) on first use
            shape = torch.Size(np.broadcast_shapes(tuple(self.shape), tuple(targets.shape)))
        except ValueError:
            shape = None
        if shape != self.shape:
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not fit scores of "
                             f"shape {tuple(self.shape)}")
        if len(self.blocks) > 1:
            return self._blockwise(targets.expand(self.shape))
        positives = positives.expand(self.rows.shape).reshape(-1, n)
        return _column_ap(self._keys, self.sorted, self.flat, positives).view(self.rows.shape[:-1])

    def _blockwise(self, targets: Tensor) -> Tensor:
        leading, classes = self.shape[:-2], self.shape[-1]
        out = torch.empty(*leading, classes, dtype=torch.float64, device=self.rows.device)
        for index, first, last in self.blocks:
            flat = self.scores[index][:, first:last].t().contiguous()
            keys = _OrderKeys.of(flat)
            positives = targets[index][:, first:last].t() > 0
            out[index][first:last] = _column_ap(keys, _sorted(keys, flat), flat, positives)
        return out


def _column_blocks(shape: torch.Size, block: int) -> list[tuple[tuple[int, ...], int, int]]:
    """(leading index, first class, end class) of each block of columns of scores of ``shape``
    (..., N, L): whole when they fit ``block`` elements, else at least one column each."""
    examples, classes = shape[-2], shape[-1]
    leading = tuple(shape[:-2])
    if examples * classes * int(np.prod(leading, dtype=np.int64)) <= block:
        return [((), 0, classes)]
    width = max(1, block // max(examples, 1))
    return [(tuple(int(i) for i in index), first, min(first + width, classes))
            for index in np.ndindex(*leading) for first in range(0, classes, width)]


def _sorted(keys: _OrderKeys | None, flat: Tensor) -> Tensor:
    return (keys.sorted_keys(flat) if keys is not None
            else torch.sort(flat, dim=-1).values.contiguous())


def _column_ap(keys: _OrderKeys | None, ascending: Tensor, flat: Tensor,
               positives: Tensor) -> Tensor:
    if keys is not None:
        return keys.average_precision(ascending, flat, positives)
    return _average_precision_sorted(ascending, flat, positives)


def average_precision(scores: Tensor, targets: Tensor) -> Tensor:
    """AP of every column: ``scores`` (..., N, L), ``targets`` (N, L) or (..., N, L) 0/1.

    Returns a float64 tensor of shape (..., L) on the scores' device. Scores are compared
    exactly as given (pass the float32 probabilities the reference code evaluates, not logits,
    to reproduce its ties).
    """
    return RankedScores(scores).average_precision(targets)


def mean_average_precision(scores: Tensor, targets: Tensor) -> Tensor:
    """mAP in percent over classes, shape (...,): the mean of :func:`average_precision` x 100."""
    return average_precision(scores, targets).mean(dim=-1) * 100.0


def _average_precision_sorted(ascending: Tensor, rows: Tensor, positives: Tensor) -> Tensor:
    """AP of each row of ``rows`` (R, N) whose sorted copy is ``ascending``, on any device."""
    n = rows.shape[-1]
    count = positives.sum(dim=-1)
    width = max(int(count.max()), 1) if count.numel() else 1
    row, column = torch.nonzero(positives, as_tuple=True)
    slot = torch.arange(row.numel(), device=rows.device) - (torch.cumsum(count, 0) - count)[row]
    scores = torch.full((rows.shape[0], width), -torch.inf, dtype=rows.dtype, device=rows.device)
    scores[row, slot] = rows[row, column]
    valid = torch.zeros(rows.shape[0], width, dtype=torch.bool, device=rows.device)
    valid[row, slot] = True
    # examples, then positives, scoring at least each positive's score
    at_least = n - torch.searchsorted(ascending, scores, side="left")
    hits = width - torch.searchsorted(torch.sort(scores, dim=-1).values, scores, side="left")
    precision = torch.where(valid, hits.double() / at_least.clamp(min=1).double(), 0.0)
    count = count.double()
    ap = precision.sum(dim=-1) / count.clamp(min=1)
    return torch.where(count > 0, ap, torch.zeros_like(ap))


class _OrderKeys:
    """CPU float32 scores as int64 keys ``row << 32 | order(score)``: every row's scores in
    one globally sorted array, so NumPy answers all the counts with one binary search each
    (and searches sorted keys faster). ``order`` is monotone in the float value, ties stay
    ties (-0.0 is first made +0.0)."""

    @staticmethod
    def of(rows: Tensor) -> _OrderKeys | None:
        if rows.device.type != "cpu" or rows.dtype not in (torch.float32, torch.float16):
            return None
        return _OrderKeys()

    @staticmethod
    def keys(values: np.ndarray, row: np.ndarray) -> np.ndarray:
        bits = values.astype(np.float32, copy=False).view(np.int32)
        if (bits < 0).any():  # negative scores (or -0.0): make the order of the bits monotone
            bits = (values.astype(np.float32) + np.float32(0.0)).view(np.int32)
            bits = np.where(bits < 0, np.int32(-(2**31)) - bits - 1, bits)
        keys = bits.astype(np.int64)  # in place from here: one int64 copy of the scores
        keys += 2**31
        keys += row.astype(np.int64) << 32
        return keys

    def sorted_keys(self, rows: Tensor) -> Tensor:
        ascending = np.sort(rows.numpy(), axis=-1)
        row = np.arange(rows.shape[0])[:, None]
        return torch.from_numpy(self.keys(ascending, row).reshape(-1))

    def average_precision(self, sorted_keys: Tensor, rows: Tensor, positives: Tensor) -> Tensor:
        n = rows.shape[-1]
        mask = positives.numpy()
        row, _ = np.nonzero(mask)
        keys = np.sort(self.keys(rows.numpy()[mask], row))
        count = mask.sum(axis=-1)
        end = np.cumsum(count)
        at_least = (row + 1) * n - np.searchsorted(sorted_keys.numpy(), keys, side="left")
        hits = end[row] - np.searchsorted(keys, keys, side="left")
        precision = hits / at_least
        ap = np.bincount(row, weights=precision, minlength=len(count)) / np.maximum(count, 1)
        return torch.from_numpy(np.where(count > 0, ap, 0.0))
