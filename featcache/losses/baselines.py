"""Baselines compared by Zhou et al. and Li et al.: focal loss, ASL, DW, L1R, L2R.

All take the AN view (every label that is not an observed positive is a negative) and use the
project's conventions: probabilities, ``neglog(x) = -log(x + 1e-5)``, matrix / (B * L). No
paper gives these baselines' hyperparameters for single positives; the defaults are documented
choices (``docs/losses.md``), overridable with ``--param``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.params import Param, non_negative
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import assume_negative, matrix_mean, neglog, where_mask

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 50

BASELINE = "baseline in Zhou et al. ECCV 2022 / Li et al."
BASELINE_PAPER = ("no paper of its own: a baseline of Zhou et al., 'Acknowledging the Unknown for "
                  "Multi-label Learning with Single Positive Labels'")


@register_loss
class Focal(SPMLLoss):
    """``focal`` (Lin et al. 2017) on AN targets: z=1 (1-f)^gamma neglog(f); else f^gamma neglog(1-f)."""

    name = "focal"
    summary = "Focal loss on AN targets: (1-f)^gamma neglog(f), f^gamma neglog(1-f)."
    reference = "Lin et al. ICCV 2017; " + BASELINE
    paper = "Focal Loss for Dense Object Detection"
    year = 2017
    params = {"gamma": non_negative(2.0, "focusing exponent")}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        gamma = self.value("gamma", logits)
        positive = targets.observed == 1
        matrix = torch.where(positive, (1.0 - f) ** gamma * neglog(f), f**gamma * neglog(1.0 - f))
        return matrix_mean(matrix)


@register_loss
class Asymmetric(SPMLLoss):
    """``asl`` (Ridnik et al. 2021) on AN targets.

    z=1: (1-f)^gamma_pos neglog(f); else p_m^gamma_neg neglog(1 - p_m) with the shifted
    probability p_m = max(f - clip, 0). The focusing weights are differentiated (Ridnik's
    ``disable_torch_grad_focal_loss=False``).
    """

    name = "asl"
    summary = "Asymmetric loss on AN targets: focusing gamma_neg and probability shift clip."
    reference = "Ridnik et al. ICCV 2021; " + BASELINE
    paper = "Asymmetric Loss For Multi-Label Classification"
    year = 2021
    params = {"gamma_pos": non_negative(0.0, "focusing exponent of positives"),
              "gamma_neg": non_negative(4.0, "focusing exponent of negatives"),
              "clip": Param(0.05, "probability margin m: negatives use max(f - m, 0)", low=0.0,
                            high=1.0, high_open=True)}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        shifted = (f - self.value("clip", logits)).clamp(min=0)
        positive = targets.observed == 1
        matrix = torch.where(positive, (1.0 - f) ** self.value("gamma_pos", logits) * neglog(f),
                             shifted ** self.value("gamma_neg", logits) * neglog(1.0 - shifted))
        return matrix_mean(matrix)


@register_loss
class DownWeighted(SPMLLoss):
    """``dw``: AN with the assumed negatives weighted by ``weight`` (wan fixes it to 1/(L-1))."""

    name = "dw"
    summary = "AN with assumed negatives down-weighted by a constant."
    reference = BASELINE
    paper = BASELINE_PAPER
    year = 2022
    params = {"weight": non_negative(0.1, "weight of the assumed-negative terms")}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        return matrix_mean(assume_negative(f, targets.observed, self.value("weight", logits)))


class RegularizedAssumeNegative(SPMLLoss):
    """AN plus ``lam * f^power`` on each unobserved entry (inside the matrix, so / (B * L))."""

    power = 1

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        penalty = where_mask(targets.observed == 0, self.value("lam", logits) * f**self.power)
        return matrix_mean(assume_negative(f, targets.observed) + penalty)


@register_loss
class L1Regularized(RegularizedAssumeNegative):
    """``l1r``: AN + lam * f on unobserved entries."""

    name = "l1r"
    summary = "AN + L1 penalty lam*f on unobserved predictions."
    reference = BASELINE
    paper = BASELINE_PAPER
    year = 2022
    params = {"lam": non_negative(0.1, "weight of the L1 penalty on unobserved predictions")}


@register_loss
class L2Regularized(RegularizedAssumeNegative):
    """``l2r``: AN + lam * f^2 on unobserved entries."""

    name = "l2r"
    summary = "AN + L2 penalty lam*f^2 on unobserved predictions."
    reference = BASELINE
    paper = BASELINE_PAPER
    year = 2022
    power = 2
    params = {"lam": non_negative(0.1, "weight of the L2 penalty on unobserved predictions")}
