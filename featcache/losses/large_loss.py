"""Kim et al. (CVPR 2022) "Large Loss Matters": reject or correct the unobserved labels whose
assumed-negative loss is large.

On logits with ``binary_cross_entropy_with_logits`` (no 1e-5 guard) and AN targets (observed
labels clipped to >= 0); the (H, B, L) matrix is divided by B * L. Labels are read from the
per-head state ``observed`` (H, N, L) int8, so that LL-Cp's permanent corrections persist.

Relative variants (``ll-r``, ``ll-ct``, ``ll-cp``): in epoch e (0-based) the rejection rate is
e * delta_rel / 100 (nothing changes in the first epoch); k = ceil(B L rate) for LL-R/LL-Ct,
k = ceil(B L delta_rel / 100) from the second epoch on for LL-Cp. With the loss of observed
entries masked to 0, an unobserved entry is "large" when its loss is >= the k-th largest
masked value (the k-th itself counts); LL-Cp flips to positive, permanently, the unobserved
entries strictly > the k-th value. Absolute variants (``-abs``, supplement B): large means
loss > R(e) = r0 - e * delta_abs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.params import Param, non_negative
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import (
    batch_labels,
    device_constant,
    head_floats,
    matrix_mean,
    per_head_labels,
)

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 30

KIM = "Kim et al. CVPR 2022"
KIM_PAPER = "Large Loss Matters in Weakly Supervised Multi-Label Classification"
KIM_ABS = "Kim et al. CVPR 2022, supplement B"

#: delta_rel is a percentage: 0.2 means 0.2 % more rejected per epoch (PROTOCOL.md section 4)
RELATIVE_PARAMS = {"delta_rel": Param(
    0.2, "rejection-rate increase per epoch, in percent (Kim: 0.1 to 0.5)", low=0.0, high=100.0)}
ABSOLUTE_PARAMS = {
    "r0": non_negative(1.5, "initial loss threshold R0 (supplement grid 1.0, 1.5, 2.0)"),
    "delta_abs": non_negative(0.15, "threshold decrease per epoch (supplement grid 0.1, 0.15, 0.2)"),
}


def ceil_count(value: float) -> int:
    """``ceil`` of a count computed in floating point, immune to round-off (0.64*25 -> 16)."""
    return math.ceil(round(value, 9))


class LargeLoss(SPMLLoss):
    """Shared machinery of the six LL variants; subclasses pick the selection and the action."""

    scheduled = True  # the rejection rate (or threshold) moves every epoch
    #: "reject" (loss 0) or "correct" (loss computed with target 1)
    action: ClassVar[str] = "reject"
    #: LL-Cp: flip the selected labels to positive in the state, permanently
    permanent: ClassVar[bool] = False

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        return {"observed": per_head_labels(observed, self.num_heads)}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        labels = batch_labels(targets, state)
        if self.permanent:
            self.state_tensor(state, "observed")
        labels = labels.expand_as(logits)
        unobserved = labels == 0
        loss = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0), reduction="none")
        large, flip = self.select(loss.detach(), unobserved, epoch)
        if self.action == "reject":
            loss = torch.where(large, torch.zeros_like(loss), loss)
        else:
            corrected = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits),
                                                           reduction="none")
            loss = torch.where(large, corrected, loss)
        if self.permanent:
            # Written back whether or not anything flipped: a data-dependent `if flip.any()`
            # would make the host wait for the device at every step. Entries not flipped are
            # written with the value they already hold.
            observed = state["observed"]
            rows = observed[:, targets.index]
            observed[:, targets.index] = torch.where(flip, torch.ones_like(rows), rows)
        return matrix_mean(loss)

    def select(self, loss: Tensor, unobserved: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        """Masks (H, B, L): the large unobserved entries, and those LL-Cp flips."""
        raise NotImplementedError


class RelativeLargeLoss(LargeLoss):
    """Top-k selection among the batch's unobserved losses (the paper's main variants)."""

    params = RELATIVE_PARAMS

    def num_large(self, entries: int, epoch: int, delta_rel: float) -> int:
        """k for one head: how many of the batch's ``entries`` count as large."""
        if epoch == 0:
            return 0
        rate = delta_rel / 100.0 if self.permanent else epoch * delta_rel / 100.0
        return min(ceil_count(entries * rate), entries)

    def select(self, loss: Tensor, unobserved: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        heads = loss.shape[0]
        masked = torch.where(unobserved, loss, torch.zeros_like(loss)).reshape(heads, -1)
        ks = [self.num_large(masked.shape[1], epoch, d) for d in self.param_values["delta_rel"]]
        nothing = torch.zeros_like(unobserved)
        if max(ks) == 0:
            return nothing, nothing
        top = torch.topk(masked, max(ks), dim=1).values
        k = device_constant(ks, loss.device, torch.int64)
        kth = top.gather(1, (k.clamp(min=1) - 1).unsqueeze(1)).view(heads, 1, 1)
        active = (k > 0).view(heads, 1, 1)
        masked = masked.view_as(loss)
        # Only unobserved entries are touched. The reference's `torch.where(unobserved_loss <
        # kth, loss, modified)` would also modify observed positives (masked to 0) whenever the
        # k-th value is 0; PROTOCOL.md restricts the selection to unobserved entries.
        large = unobserved & active & (masked >= kth)
        flip = unobserved & active & (masked > kth)
        return large, flip


class AbsoluteLargeLoss(LargeLoss):
    """Threshold selection: large means loss > R(e) = r0 - e * delta_abs (supplement B)."""

    reference = KIM_ABS
    paper = KIM_PAPER
    year = 2022
    params = ABSOLUTE_PARAMS

    def select(self, loss: Tensor, unobserved: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        r0 = head_floats(self.param_values["r0"], loss)
        delta = head_floats(self.param_values["delta_abs"], loss)
        large = unobserved & (loss > r0 - epoch * delta)
        return large, large


@register_loss
class LargeLossReject(RelativeLargeLoss):
    """``ll-r``: reject (loss 0) the large-loss unobserved entries."""

    name = "ll-r"
    summary = "Large-loss rejection: the top rate of unobserved losses get loss 0."
    reference = KIM
    paper = KIM_PAPER
    year = 2022


@register_loss
class LargeLossCorrectTemporary(RelativeLargeLoss):
    """``ll-ct``: temporarily correct the large-loss entries (loss with target 1, this batch)."""

    name = "ll-ct"
    summary = "Large-loss temporary correction: the top rate are trained as positives."
    reference = KIM
    paper = KIM_PAPER
    year = 2022
    action = "correct"


@register_loss
class LargeLossCorrectPermanent(RelativeLargeLoss):
    """``ll-cp``: correct the large-loss entries and flip their stored label to positive."""

    name = "ll-cp"
    summary = "Large-loss permanent correction: top delta_rel% flipped to positive for good."
    reference = KIM
    paper = KIM_PAPER
    year = 2022
    action = "correct"
    permanent = True


@register_loss
class LargeLossRejectAbsolute(AbsoluteLargeLoss):
    """``ll-r-abs``: LL-R with the absolute threshold."""

    name = "ll-r-abs"
    summary = "LL-R with an absolute loss threshold r0 - epoch*delta_abs."


@register_loss
class LargeLossCorrectTemporaryAbsolute(AbsoluteLargeLoss):
    """``ll-ct-abs``: LL-Ct with the absolute threshold."""

    name = "ll-ct-abs"
    summary = "LL-Ct with an absolute loss threshold r0 - epoch*delta_abs."
    action = "correct"


@register_loss
class LargeLossCorrectPermanentAbsolute(AbsoluteLargeLoss):
    """``ll-cp-abs``: LL-Cp with the absolute threshold (every large entry is flipped)."""

    name = "ll-cp-abs"
    summary = "LL-Cp with an absolute loss threshold r0 - epoch*delta_abs."
    action = "correct"
    permanent = True
