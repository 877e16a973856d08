"""Predictions of a trained head from features, without scikit-learn: the logits of one
linear or BoostLU head through stage two's own stacked heads, and their probabilities
(shared by :class:`~featcache.api.estimator.SPMLClassifier` and the run objects of
:mod:`featcache.api.runs`, so that ``featcache predict`` and ``cam`` never import
scikit-learn)."""

from __future__ import annotations

import numpy as np
import torch

from featcache.linear.heads import StackedBoostLU, StackedLinear


def linear_logits(X: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                  device: torch.device | str = "cpu") -> np.ndarray:
    """Logits of one linear head (weight (L, D), bias (L,)) through stage two's own stacked
    head, so that predictions equal the ones its evaluation scored."""
    head = StackedLinear(
        torch.as_tensor(weight, dtype=torch.float32).t().contiguous()[None].to(device),
        torch.as_tensor(bias, dtype=torch.float32).reshape(1, 1, -1).to(device))
    with torch.no_grad():
        features = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=device)
        return head(features)[0].cpu().numpy()


#: sigmoid block length: a multiple of every CPU vector width (torch computes the last
#: ``n mod 2 * width`` values of a call on its scalar path, which rounds differently) and below
#: the size at which torch splits elementwise work between threads
SIGMOID_BLOCK = 1 << 14


def probabilities(logits: np.ndarray) -> np.ndarray:
    """``sigmoid(logits)``, float32, each value computed on torch's vectorised path wherever its
    row sits: the same probability for a row alone, in a subset or in another order (a plain
    ``torch.sigmoid`` rounds the tail of each call on another path, by up to an ulp)."""
    flat = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)).reshape(-1)
    size = flat.numel()
    padded = torch.zeros(-(-size // SIGMOID_BLOCK) * SIGMOID_BLOCK)
    padded[:size] = flat
    out = torch.cat([torch.sigmoid(block) for block in padded.split(SIGMOID_BLOCK)]) if size else padded
    return out[:size].reshape(np.shape(logits)).numpy()


def boostlu_logits(X: np.ndarray, weight: np.ndarray, bias: np.ndarray, positions: int,
                   alpha: float, device: torch.device | str = "cpu") -> np.ndarray:
    """Logits of one BoostLU head (the 1 x 1 convolution weight (L, D), bias (L,)) on rows of
    (h, w, D) maps of ``positions`` = h w positions, through stage two's stacked BoostLU head."""
    head = StackedBoostLU(
        torch.as_tensor(weight, dtype=torch.float32).t().contiguous()[None].to(device),
        torch.as_tensor(bias, dtype=torch.float32).reshape(1, 1, -1).to(device),
        positions=positions, alpha=[float(alpha)], trainable=False)
    features = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=device)
    return head.logits(features)[0].cpu().numpy()
