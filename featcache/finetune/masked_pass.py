"""IGNORE's forward passes in stage three: the plain view's class activation maps, the strong
view, and the plain images masked to the single positive's map (a
:class:`~featcache.losses.MaskedPassLoss`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

from featcache.losses import MaskedPassLoss, Targets


def masked_pass_views(model: nn.Module, loss: MaskedPassLoss,
                      autocast: Callable[[], AbstractContextManager], x: Tensor,
                      strong: Tensor | None, targets: Targets) -> Tensor:
    """The masked-pass loss's forward passes in the authors' order (IGNORE's
    ``train_resnet.py``: plain, strong, masked; all in training mode, so each moves the
    batch-norm statistics) of ``model`` (a network whose forward takes ``cam=True``) on the
    network inputs ``x`` and their strong views: the plain view's logits (the pooled class
    activation maps); ``targets`` gets the strong view's logits and, without gradient, those of
    the plain images masked to the single positive's map (:meth:`MaskedPassLoss.image_mask`)."""
    with autocast():
        cam, logits = model(x, cam=True)
    if strong is not None:
        with autocast():
            targets.strong = model(strong).float().unsqueeze(0)
    keep = loss.image_mask(cam, targets.observed, (x.shape[-2], x.shape[-1]))
    with torch.no_grad(), autocast():
        targets.masked = model(x * keep.to(x.dtype)).float().unsqueeze(0)
    return logits
