"""What a loss sees of one batch besides the logits."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Targets:
    """What a loss sees of one batch besides the logits.

    ``observed``: (B, L) float, 1 observed positive, 0 unobserved, -1 observed negative.
    ``index``: (B,) int64, the rows of the training split (to index per-example state).
    ``clean``: (B, L) float 0/1 full labels, or None when the data has none.
    ``pseudo``: (B, L) float pseudo-labels (1 positive, -1 negative, 0 none), for the losses
    that declare the :func:`~featcache.losses.needs.pseudo_labels` need; None otherwise.
    ``masked``: (H, B, L) logits of the second forward pass on the input masked to the single
    positive's class activation map, for the losses that declare the masked pass
    (:class:`~featcache.losses.base.MaskedPassLoss`: IGNORE).
    ``strong``: (H, B, L) logits of a strongly augmented view of the batch (differentiable;
    IGNORE in stage three); None where the stage has no such view (cached features).
    """

    observed: Tensor
    index: Tensor
    clean: Tensor | None = None
    pseudo: Tensor | None = None
    masked: Tensor | None = None
    strong: Tensor | None = None
