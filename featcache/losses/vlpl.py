"""Xing et al. (VLPL, CVPRW 2024): EM on unknown labels plus smoothed vision-language
pseudo-positives (the reference ``losses.py`` ``EM_PL``, github mvrl/VLPL @ ed09b59).

Entries (probabilities f, guard 1e-5 as the reference's ``neglog``), label z, pseudo-label p:

- z = 1: neglog(f);
- z = -1 (observed negatives, ``--num-neg``): neglog(1 - f), as featcache's EM;
- z = 0, p = 1: beta [s neglog(f) + (1 - s) neglog(1 - f)], s = ``smoothing`` (0.9, hard-coded
  in the reference), beta = 0.7;
- z = 0, p = 0: -alpha H(f), Zhou et al.'s entropy maximisation;
- z = 0, p = -1: 0 (the reference's negative block is commented out; its pseudo-negatives, made
  only by the ``clip_vision`` branch with ``partial`` > 0, get no loss).

During the first ``warmup`` epochs (the reference's ``warmup_epoch``, 0: its epochs count from
1 and pseudo-labels are used once ``epoch > warmup_epoch``) the loss is plain EM.

The loss matrix is summed and divided by B * L. The pseudo-labels come from ``featcache
pseudo-label --rule vlpl`` (CLIP cosine, softmax over classes at temperature 0.01, positive
where it exceeds 0.3). The reference recomputes them at every step from the flipped training
image; frozen CLIP makes them a function of the image (and flip), which featcache computes once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.entropy import ALPHA, EM_ALPHA, entropy_matrix
from featcache.losses.needs import pseudo_labels
from featcache.losses.params import epoch_count, non_negative, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import device_constant, matrix_mean, require_pseudo, soft_bce

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 80

VLPL_REFERENCE = "Xing et al. CVPRW 2024"


@register_loss
class VisionLanguagePseudoLabels(SPMLLoss):
    """``vlpl``: EM on unknowns, beta [s neglog(f) + (1-s) neglog(1-f)] on CLIP pseudo-positives."""

    name = "vlpl"
    summary = "VLPL: EM on unknowns plus smoothed CLIP pseudo-positives (weight beta, target 0.9)."
    reference = VLPL_REFERENCE
    paper = ("VLPL: Vision Language Pseudo Labels for Multi-label Learning with Single Positive "
             "Labels (arXiv 2310.15985)")
    year = 2024
    params = {
        "alpha": ALPHA,
        "beta": non_negative(0.7, "weight of the pseudo-positive terms (the reference's beta_pos)"),
        "smoothing": unit_interval(0.9, "soft target of a pseudo-positive (the reference's 0.9)"),
        "warmup": epoch_count(0, "epochs of plain EM before the pseudo-labels are used"),
    }
    #: alpha per dataset as the reference main_clip.py (EM's values); beta 0.7 everywhere
    dataset_defaults = {name: {"alpha": alpha} for name, alpha in EM_ALPHA.items()}
    needs = (pseudo_labels("vlpl"),)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        z, pseudo = targets.observed, require_pseudo(self.name, targets)
        matrix = entropy_matrix(f, z, -self.value("alpha", logits))
        active = [float(epoch + 1 > w) for w in self.param_values["warmup"]]
        if not any(active):
            pseudo = torch.zeros_like(pseudo)
        elif not all(active):  # heads with different warm-ups: a per-head mask, built once
            pseudo = pseudo * device_constant(active, f.device, f.dtype).view(-1, 1, 1)
        smoothed = self.value("beta", logits) * soft_bce(f, self.value("smoothing", logits))
        matrix = torch.where((z == 0) & (pseudo == 1), smoothed, matrix)
        return matrix_mean(torch.where((z == 0) & (pseudo == -1), 0.0, matrix))
