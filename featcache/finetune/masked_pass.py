"""IGNORE's forward passes in stage three: the plain view's class activation maps, the strong
view, and the plain images masked to the single positive's map (the loss's ``masked_pass``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from featcache.losses import Targets

if TYPE_CHECKING:
    from featcache.finetune.loop import ConfigTrainer


def masked_pass_views(trainer: ConfigTrainer, x: Tensor, strong: Tensor | None,
                      targets: Targets) -> Tensor:
    """IGNORE's forward passes in the authors' order (``train_resnet.py``: plain, strong,
    masked; all in training mode, so each moves the batch-norm statistics): the plain
    view's logits (the mean of its class activation maps); ``targets`` gets the strong
    view's logits and, without gradient, those of the plain images masked to the single
    positive's map (:meth:`~featcache.losses.ignore.Ignore.image_mask`)."""
    with trainer.autocast():
        cam = trainer.model(x, cam=True)
    logits = cam.mean(dim=(2, 3))
    if strong is not None:
        with trainer.autocast():
            targets.strong = trainer.model(trainer.to_input(strong)).float().unsqueeze(0)
    keep = trainer.loss.image_mask(cam, targets.observed, (x.shape[-2], x.shape[-1]))
    with torch.no_grad(), trainer.autocast():
        targets.masked = trainer.model(x * keep.to(x.dtype)).float().unsqueeze(0)
    return logits
