"""Zhang et al. (arXiv 2112.07368), "Simple and robust loss design for multi-label learning with
missing labels": Hill and SPLC.

Conventions of the authors' code (``xinyu1205/robust-loss-mlml`` @ dcfa4d5,
``src/loss_functions/losses.py`` classes ``Hill`` and ``SPLC``, unchanged since its first
commit):

- on logits; the observed positives are the targets 1, every other entry a target 0 (their
  setting has no separate "observed negative": an observed negative, z = -1, is a target 0
  here too; SPLC never turns one into a positive);
- the positive term is the focal-margin loss ``-(1 - p_m)^gamma log(p_m)``, p_m = sigmoid(g - m),
  computed with ``logsigmoid`` (the code's ``log(sigmoid(.))`` has no guard), its focal weight
  differentiated (not detached);
- reduction: the **sum** over the B x L matrix, the code's default (``sum=0``: the mean over
  B * L, as the GR repository's copy of Hill does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.params import epoch_count, non_negative, switch, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import head_floats, matrix_mean

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 70

ZHANG = "Zhang et al. arXiv 2021"
ZHANG_PAPER = ("Simple and Robust Loss Design for Multi-Label Learning with Missing Labels "
               "(arXiv 2112.07368)")

MARGIN = non_negative(1.0, "margin m subtracted from the logits of positives (paper: 0.5 to 1)")
GAMMA = non_negative(2.0, "focusing exponent gamma of the focal terms")
SUM = switch(1.0, "reduction: 1 the sum over the B x L matrix (the code's default), 0 the mean")


def reduce_matrix(loss: SPMLLoss, matrix: Tensor) -> Tensor:
    """Per head: the matrix's sum where the head's ``sum`` switch is 1, else its B * L mean."""
    totals = matrix.sum(dim=(-2, -1))
    flags = loss.param_values["sum"]
    if all(flags):
        return totals
    if not any(flags):
        return matrix_mean(matrix)
    return torch.where(head_floats(flags, matrix, (-1,)) == 1, totals, matrix_mean(matrix))


def focal_margin_positive(logits: Tensor, margin: Tensor | float, gamma: Tensor | float) -> Tensor:
    """``-(1 - p_m)^gamma log(p_m)`` with p_m = sigmoid(g - m), elementwise."""
    shifted = logits - margin
    return -((1.0 - torch.sigmoid(shifted)) ** gamma) * F.logsigmoid(shifted)


@register_loss
class Hill(SPMLLoss):
    """``hill``: z=1 focal margin -(1 - p_m)^gamma log p_m; every other entry (lam - p) p^2.

    p = sigmoid(g) and p_m = sigmoid(g - m). Summed over B x L (``sum=1``, the code's default).
    """

    name = "hill"
    summary = "Hill: focal-margin positives; negatives (lam - p) p^2 down-weight likely missing labels."
    reference = ZHANG
    paper = ZHANG_PAPER
    year = 2021
    params = {"lam": non_negative(1.5, "lambda of the negative term (lam - p) p^2 (fixed at 1.5 "
                                       "in the paper)"),
              "margin": MARGIN, "gamma": GAMMA, "sum": SUM}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        p = torch.sigmoid(logits)
        negative = (self.value("lam", logits) - p) * p**2
        positive = focal_margin_positive(logits, self.value("margin", logits),
                                         self.value("gamma", logits))
        return reduce_matrix(self, torch.where(targets.observed == 1, positive, negative))


@register_loss
class SelfPacedCorrection(SPMLLoss):
    """``splc``: focal margin on positives, focal BCE on negatives; from epoch ``change_epoch``
    (0-based) on, a target-0 entry with sigmoid(g) > tau is trained as a positive.

    Original positives use g - m; corrected entries keep their logit g (no margin), as in the
    code. The correction is recomputed at every step and never stored. Observed negatives
    (z = -1) are never corrected. Summed over B x L (``sum=1``).
    """

    name = "splc"
    summary = "SPLC: focal margin loss; from change_epoch, unobserved labels with p > tau become positives."
    reference = ZHANG
    paper = ZHANG_PAPER
    year = 2021
    params = {"tau": unit_interval(0.6, "threshold: unobserved entries with p > tau count as "
                                        "positive (0.65 only for COCO with 75% of labels left)"),
              "change_epoch": epoch_count(1, "first epoch (0-based) with the correction"),
              "margin": MARGIN, "gamma": GAMMA, "sum": SUM}
    scheduled = True  # the correction starts at change_epoch

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        observed = targets.observed
        positive = observed == 1
        shifted = torch.where(positive, logits - self.value("margin", logits), logits)
        p = torch.sigmoid(shifted)
        active = head_floats(self.param_values["change_epoch"], logits) <= epoch
        corrected = (observed == 0) & active & (p > self.value("tau", logits))
        target = positive | corrected
        gamma = self.value("gamma", logits)
        matrix = torch.where(target, -((1.0 - p) ** gamma) * F.logsigmoid(shifted),
                             -(p**gamma) * F.logsigmoid(-shifted))
        return reduce_matrix(self, matrix)
