"""Predictions of a trained head from features, without scikit-learn: the logits of one head
of any kind through that kind's stacked heads (:mod:`featcache.heads`), and their probabilities
(shared by :class:`~featcache.api.estimator.SPMLClassifier` and the run objects of
:mod:`featcache.api.runs`, so that ``featcache predict`` and ``cam`` never import
scikit-learn)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from featcache.heads import HeadKind, HeadModule


def head_logits(kind: HeadKind, X: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                positions: int = 1, loss_params: Mapping[str, float] | None = None,
                device: torch.device | str = "cpu") -> np.ndarray:
    """Logits (n, L) of one head of ``kind`` (weight (L, D), bias (L,)) on rows ``X``: pooled
    features (n, D), or for a kind that reads maps rows of (h, w, D) maps of ``positions`` =
    h w positions; through the kind's own stacked heads (H = 1), so that predictions equal the
    ones stage two's evaluation scored."""
    head = kind.implementation(
        torch.as_tensor(weight, dtype=torch.float32).t().contiguous()[None].to(device),
        torch.as_tensor(bias, dtype=torch.float32).reshape(1, 1, -1).to(device),
        positions=positions, params={key: [float(value)] for key, value in
                                     (loss_params or {}).items()})
    features = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=device)
    with torch.no_grad():
        return head.logits(features)[0].cpu().numpy()


def module_logits(kind: HeadKind, X: np.ndarray, weight: np.ndarray | torch.Tensor,
                  bias: np.ndarray | torch.Tensor, positions: int = 1,
                  loss_params: Mapping[str, float] | None = None) -> np.ndarray:
    """Logits (n, L) of one head of ``kind`` on rows ``X`` as stage three's network applies it
    (:class:`~featcache.heads.HeadModule`, the same implementation over the module's
    parameters), on the CPU in float32."""
    weight = torch.as_tensor(weight, dtype=torch.float32)
    module = HeadModule.create(kind, weight.shape[1], weight.shape[0], loss_params,
                               weight=weight, bias=torch.as_tensor(bias, dtype=torch.float32))
    with torch.no_grad():
        return module.stacked(positions)(torch.from_numpy(np.ascontiguousarray(X)))[0].numpy()


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
