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


class RankedScores:
    """The scores of every (head, class) column sorted once, for several AP computations.

    ``scores`` is (..., N, L); scores are compared exactly as given (pass the float32
    probabilities the reference code evaluates, not logits, to reproduce its ties).
    """

    def __init__(self, scores: Tensor):
        self.num_examples = scores.shape[-2]
        if self.num_examples == 0:
            raise ValueError("average_precision needs at least one example")
        self.shape = scores.shape
        self.rows = scores.detach().transpose(-1, -2)  # (..., L, N): one row per (head, class)
        self.flat = self.rows.reshape(-1, self.num_examples)
        self._keys = _OrderKeys.of(self.flat)
        self.sorted = (self._keys.sorted_keys(self.flat) if self._keys is not None
                       else torch.sort(self.flat, dim=-1).values.contiguous())

    def average_precision(self, targets: Tensor) -> Tensor:
        """AP of every column against ``targets`` (N, L) or (..., N, L) 0/1: float64 (..., L)."""
        n = self.num_examples
        positives = targets.to(device=self.rows.device).transpose(-1, -2) > 0
        try:  # numpy's, not torch's: torch.broadcast_shapes imports sympy (~0.4 s) on first use
            shape = torch.Size(np.broadcast_shapes(tuple(self.rows.shape), tuple(positives.shape)))
        except ValueError:
            shape = None
        if shape != self.rows.shape:
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not fit scores of "
                             f"shape {tuple(self.shape)}")
        positives = positives.expand(shape).reshape(-1, n)
        if self._keys is not None:
            ap = self._keys.average_precision(self.sorted, self.flat, positives)
        else:
            ap = _average_precision_sorted(self.sorted, self.flat, positives)
        return ap.view(shape[:-1])


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
        return (row.astype(np.int64) << 32) + (bits.astype(np.int64) + 2**31)

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
