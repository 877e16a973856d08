"""BoostLU (Kim et al. CVPR 2023, "Bridging the gap between model explanations in partially
annotated multi-label classification"): the losses the authors train their head with.

**The head.** A 1x1 convolution over the last feature map F (h x w positions of D channels)
gives the class activation map CAM = W F(u, v) + bias (the linear head applied at every
position, bias included); BoostLU multiplies its positive entries by ``alpha`` (B(x) = alpha x
for x > 0, else x) and the logit is the mean over the positions of B(CAM). Equivalently
``g = (W GAP(F) + bias) + (alpha - 1) mean relu(CAM)``, so alpha = 1 is the ordinary linear head
on pooled features. Boosting is part of the forward pass in training and evaluation alike (the
authors' ``ImageClassifier.forward`` has no train/eval switch); alpha = 5 (their default, for
every dataset). The head is :class:`featcache.heads.BoostLUHeads` (``HeadKind.BOOSTLU``), the
one implementation both training stages and the API use.

**The losses** (authors' code youngwk/BridgeGapExplanationPAMC ``losses.py``, ``train.py``,
``config.py``): ``binary_cross_entropy_with_logits`` on the boosted logits with the observed
labels clipped to >= 0, mean over B x L. ``an+boostlu`` is that loss unmodified (their
``loss_an``; featcache's ``an`` is Cole et al.'s ``-log(sigmoid + 1e-5)`` instead). The
``ll-*+boostlu`` variants follow the authors' code where it differs from Kim et al. 2022's
(``featcache.losses.large_loss``):

- ``delta_rel`` defaults per scheme, for every dataset: LL-R 0.5, LL-Ct 0.2, LL-Cp 0.1 (percent
  per epoch; Kim 2022: 0.2 by default, tuned per dataset);
- the rejection rate is ``1 - clean_rate``, ``clean_rate`` starting at 1 and lowered by
  ``delta_rel / 100`` after each epoch by repeated float subtraction, and k = ``ceil(B L (1 -
  clean_rate))`` without rounding the round-off away (B = 8, L = 20, delta 0.5: k = 5 in epoch
  5 where the exact product gives 4);
- LL-Cp flips the unobserved entries whose loss is **>=** the k-th largest (the k-th included;
  Kim 2022's code: strictly >).

Like featcache's LL losses, only unobserved entries are rejected, corrected or flipped (the
authors' ``torch.where(unobserved_loss >= thr)`` would also touch observed positives, whose
masked loss is 0, in a batch where the k-th value is 0).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from featcache.heads import HeadKind
from featcache.losses.base import SPMLLoss
from featcache.losses.large_loss import (
    LargeLossCorrectPermanent,
    LargeLossCorrectTemporary,
    LargeLossReject,
    RelativeLargeLoss,
)
from featcache.losses.needs import SPATIAL_FEATURES
from featcache.losses.params import Param
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import matrix_mean

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 100

BOOSTLU = "Kim et al. CVPR 2023"
BOOSTLU_PAPER = ("Bridging the Gap between Model Explanations in Partially Annotated Multi-label "
                 "Classification (arXiv 2304.01804)")

#: BoostLU's factor on the positive entries of the class activation map
ALPHA = Param(5.0, "BoostLU: factor on the positive class-activation-map entries before pooling "
                   "(Kim 2023: 5; 1 = the linear head on pooled features)", low=1.0)


# ---------------------------------------------------------------------------------- the losses
class BoostLULoss(SPMLLoss):
    """What every BoostLU loss declares: its head, the spatial features it needs, ``alpha``."""

    head = HeadKind.BOOSTLU
    needs = (SPATIAL_FEATURES,)
    reference = BOOSTLU
    paper = BOOSTLU_PAPER
    year = 2023


def _bce_an(logits: Tensor, labels: Tensor) -> Tensor:
    """The authors' ``loss_an``: BCE with logits against the observed labels clipped to >= 0."""
    return F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0).expand_as(logits),
                                              reduction="none")


@register_loss
class AssumeNegativeBoostLU(BoostLULoss):
    """``an+boostlu``: assume negative (BCE with logits) on BoostLU's logits."""

    name = "an+boostlu"
    summary = "AN (BCE with logits, the authors' loss_an) on a BoostLU head (spatial features)."
    params = {"alpha": ALPHA}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return matrix_mean(_bce_an(logits, targets.observed))


def reference_rate(epoch: int, delta_rel: float) -> float:
    """``1 - clean_rate`` in epoch ``epoch`` (0-based) as the authors' code computes it:
    ``clean_rate`` starts at 1.0 and loses ``delta_rel / 100`` after each epoch."""
    clean_rate, step = 1.0, delta_rel / 100.0
    for _ in range(epoch):
        clean_rate -= step
    return 1.0 - clean_rate


class ReferenceLargeLoss(RelativeLargeLoss):
    """The authors' LL arithmetic (mixed into featcache's LL classes): k from the repeatedly
    decremented ``clean_rate`` (LL-R, LL-Ct) or ``ceil(B L delta_rel / 100)`` (LL-Cp), no
    change while ``clean_rate == 1``, and LL-Cp's flip of the entries >= the k-th largest."""

    #: LL-Cp flips entries whose loss is >= the k-th largest ("ge", the authors') or > ("gt")
    flip_ties: ClassVar[str] = "ge"
    #: whether corrections are permanent (LL-Cp): the LL class this is mixed into says
    permanent: ClassVar[bool]

    def num_large(self, entries: int, epoch: int, delta_rel: float) -> int:
        if reference_rate(epoch, delta_rel) == 0.0:  # clean_rate == 1: the loss is unmodified
            return 0
        rate = delta_rel / 100.0 if self.permanent else reference_rate(epoch, delta_rel)
        return min(math.ceil(entries * rate), entries)

    def select(self, loss: Tensor, unobserved: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        large, flip = super().select(loss, unobserved, epoch)
        return large, (large if self.flip_ties == "ge" else flip)


def _delta(default: float) -> dict[str, Param]:
    return {"delta_rel": Param(default, "rejection-rate increase per epoch, in percent (the "
                                        "BoostLU code: LL-R 0.5, LL-Ct 0.2, LL-Cp 0.1)",
                               low=0.0, high=100.0),
            "alpha": ALPHA}


@register_loss
class LargeLossRejectBoostLU(ReferenceLargeLoss, BoostLULoss, LargeLossReject):
    """``ll-r+boostlu``: LL-R on BoostLU's logits, the authors' conventions."""

    name = "ll-r+boostlu"
    summary = "LL-R on a BoostLU head (spatial features; the BoostLU code's conventions)."
    params = _delta(0.5)


@register_loss
class LargeLossCorrectTemporaryBoostLU(ReferenceLargeLoss, BoostLULoss, LargeLossCorrectTemporary):
    """``ll-ct+boostlu``: LL-Ct on BoostLU's logits, the authors' conventions."""

    name = "ll-ct+boostlu"
    summary = "LL-Ct on a BoostLU head (spatial features; the BoostLU code's conventions)."
    params = _delta(0.2)


@register_loss
class LargeLossCorrectPermanentBoostLU(ReferenceLargeLoss, BoostLULoss, LargeLossCorrectPermanent):
    """``ll-cp+boostlu``: LL-Cp on BoostLU's logits; the k-th entry is flipped too (>=)."""

    name = "ll-cp+boostlu"
    summary = "LL-Cp on a BoostLU head (spatial features; flips >= the k-th, the BoostLU code)."
    params = _delta(0.1)
