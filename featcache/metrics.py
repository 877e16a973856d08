"""Average precision on the device, for many heads at once.

Matches scikit-learn's ``average_precision_score`` (the definition the reference code uses):
AP = sum over distinct score thresholds of (R_k - R_{k-1}) * P_k, tied scores forming one
threshold. A class with no positive among the evaluated examples gets AP 0, as in the
reference code (Cole et al., ``metrics.compute_avg_precision``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def average_precision(scores: Tensor, targets: Tensor) -> Tensor:
    """AP of every column: ``scores`` (..., N, L), ``targets`` (N, L) or (..., N, L) 0/1.

    Returns a float64 tensor of shape (..., L) on the scores' device. Scores are compared
    exactly as given (pass the float32 probabilities the reference code evaluates, not logits,
    to reproduce its ties).
    """
    n = scores.shape[-2]
    if n == 0:
        raise ValueError("average_precision needs at least one example")
    # Work along the last dimension: one row of N scores per (head, class).
    rows = scores.transpose(-1, -2).contiguous()
    hits_by_row = targets.to(device=scores.device).expand_as(scores).transpose(-1, -2)
    sorted_scores, order = _sort_descending(rows)
    hits = torch.gather(hits_by_row.to(rows.dtype), -1, order).to(torch.float64)
    true_pos = torch.cumsum(hits, dim=-1)
    rank = torch.arange(1, n + 1, device=rows.device, dtype=torch.float64)
    precision = true_pos / rank
    # Last position of each group of tied scores: a threshold. Every example takes the
    # precision of the threshold that admits it (the end of its tie group).
    is_end = torch.ones_like(sorted_scores, dtype=torch.bool)
    is_end[..., :-1] = sorted_scores[..., 1:] != sorted_scores[..., :-1]
    positions = torch.arange(n, device=rows.device).expand_as(sorted_scores)
    end_index = torch.where(is_end, positions, torch.full_like(positions, n))
    end_index = torch.flip(torch.cummin(torch.flip(end_index, [-1]), dim=-1).values, [-1])
    group_precision = torch.gather(precision, -1, end_index)
    positives = hits.sum(dim=-1)
    ap = (hits * group_precision).sum(dim=-1) / positives.clamp(min=1)
    return torch.where(positives > 0, ap, torch.zeros_like(ap))


def mean_average_precision(scores: Tensor, targets: Tensor) -> Tensor:
    """mAP in percent over classes, shape (...,): the mean of :func:`average_precision` x 100."""
    return average_precision(scores, targets).mean(dim=-1) * 100.0


def _sort_descending(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Sort each row in descending order (the order within ties does not matter for AP).

    On the CPU NumPy's sort is about three times faster than PyTorch's for these shapes.
    """
    if rows.device.type == "cpu":
        order = np.argsort(rows.detach().numpy(), axis=-1)[..., ::-1]
        order = torch.from_numpy(np.ascontiguousarray(order))
        return torch.gather(rows, -1, order), order
    return torch.sort(rows, dim=-1, descending=True)
