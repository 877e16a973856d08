"""Tran et al. (AEVLP, ICCV 2025): the generalized pseudo-label robust loss (GPR), built on the
GR loss (:mod:`featcache.losses.gr`).

Conventions of the authors' code (``Fsoft-AIC/AEVLP`` @ 0bad82a, ``losses.py`` ``GPR_loss``,
the K/V schedules of ``train.py``, identical to GR's), which produced the published numbers.
On probabilities p = sigmoid(g), K = sigmoid(w p' + b) and V = exp(-((p' - mu) / sigma)^2 / 2)
of the **detached** p' with GR's schedule of w, b, mu, sigma over the run, the final label
f = pseudo-label where z = 0, else z:

- z = 1: ``-log(p + 1e-7)`` (the code's ``LOG_EPSILON``, as GR's);
- f = 0 (unknown): GR's ``V [K (1 - p^q2) / q2 + (1 - K) (1 - (1 - p)^q3) / q3]``;
- z = 0 and pseudo-label 1: ``(1 - V~) [rho (-log(p + 1e-7)) + (1 - rho) (-log(1 - p + 1e-7))]``
  with V~ = V clamped to [1 - lambda1, 1 - lambda2], so that the weight 1 - V~ lies in the
  window [lambda2, lambda1] (largest for predictions far from mu);
- f = -1 (a pseudo-negative, or an observed negative from ``--num-neg``):
  ``V (-log(1 - p + 1e-7))``. AEVLP's own pseudo-label rule never makes one (it clears its
  lowest classes to 0); ``featcache pseudo-label --rule aevlp --mark-negatives`` does.

loss = the matrix's mean over B * L + ``reg`` times the expected-positive regularizer
(mean_n sum_c p_nc - k)^2 / L^2, with gradient through p.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from featcache.errors import OptionError
from featcache.losses.gr import (
    GR_PARAMS,
    GeneralizedRobust,
    gaussian_weight,
    gr_neglog,
    gr_unobserved_term,
    soft_pseudo_label,
)
from featcache.losses.needs import pseudo_labels
from featcache.losses.params import K_PARAM, non_negative, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import expected_positive_regularizer, matrix_mean, require_pseudo

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 90

TRAN = "Tran et al. ICCV 2025 (AEVLP)"
TRAN_PAPER = ("More Reliable Pseudo-labels, Better Performance: A Generalized Approach to Single "
              "Positive Multi-label Learning (arXiv 2508.20381)")

#: AEVLP's configs/*.json: beta = [w0, wT, b0, bT], q2q3, lam_1, lam_2, reg (alpha = [0.5, 2,
#: 0.8, 0.5], q2 = 0.01 and rho = 0.9 everywhere, as the defaults)
GPR_DATASET_DEFAULTS = {
    "voc": {"w_end": 2.0, "b_end": -2.0, "q3": 1.0, "lambda1": 0.7, "lambda2": 0.4, "reg": 0.05},
    "coco": {"w_end": 10.0, "b_end": -8.0, "q3": 1.0, "lambda1": 0.7, "lambda2": 0.5,
             "reg": 0.001},
    "nuswide": {"w_end": 10.0, "b_end": -8.0, "q3": 1.0, "lambda1": 0.7, "lambda2": 0.5,
                "reg": 0.001},
    "cub": {"w_end": 10.0, "b_end": -8.0, "q3": 1.5, "lambda1": 0.8, "lambda2": 0.2, "reg": 0.01},
}


@register_loss
class GeneralizedPseudoLabelRobust(GeneralizedRobust):
    """``gpr``: GR on unknowns, windowed-weight smoothed CE on pseudo-positives, V-weighted
    negatives, plus ``reg`` times the expected-positive regularizer (module docstring)."""

    name = "gpr"
    summary = ("AEVLP's GPR: GR on unknowns, pseudo-positives weighted in [lambda2, lambda1], "
               "V-weighted pseudo-negatives, + reg * EPR.")
    reference = TRAN
    paper = TRAN_PAPER
    year = 2025
    params = {
        **GR_PARAMS,
        "lambda1": unit_interval(0.7, "upper end of the pseudo-positive weight window (lam_1)"),
        "lambda2": unit_interval(0.5, "lower end of the pseudo-positive weight window (lam_2)"),
        "rho": unit_interval(0.9, "soft target of a pseudo-positive"),
        "reg": non_negative(0.001, "weight of the expected-positive regularizer"),
        "k": K_PARAM,
    }
    dataset_defaults = GPR_DATASET_DEFAULTS
    needs = (pseudo_labels("aevlp"),)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for head, (upper, lower) in enumerate(zip(self.param_values["lambda1"], self.param_values["lambda2"],
                                                  strict=True)):
            if lower > upper:
                raise OptionError(f"loss 'gpr': lambda2={lower:g} > lambda1={upper:g} (head "
                                  f"{head}); the pseudo-positive weights lie in [lambda2, lambda1]")

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        probs = torch.sigmoid(logits)
        detached = probs.detach()
        s = self.schedule(epoch, logits)
        k = soft_pseudo_label(detached, s.w, s.b)
        v = gaussian_weight(detached, s.mu, s.sigma)
        observed, pseudo = targets.observed, require_pseudo(self.name, targets)
        final = torch.where(observed == 0, pseudo, observed)
        unknown = gr_unobserved_term(logits, k, v, self.value("q2", logits),
                                     self.value("q3", logits))
        low, high = 1.0 - self.value("lambda1", logits), 1.0 - self.value("lambda2", logits)
        clamped = torch.where(v > low, v, low)  # the code's two torch.where, in its order
        clamped = torch.where(clamped < high, clamped, high)
        rho = self.value("rho", logits)
        positive_pseudo = (1.0 - clamped) * (rho * gr_neglog(probs)
                                             + (1.0 - rho) * gr_neglog(1.0 - probs))
        negative = v * gr_neglog(1.0 - probs)
        matrix = torch.where(final == 0, unknown, torch.where(final == -1, negative, 0.0))
        matrix = torch.where((observed == 0) & (pseudo == 1), positive_pseudo, matrix)
        matrix = torch.where(observed == 1, gr_neglog(probs), matrix)
        reg = self.value("reg", logits)
        reg = reg.reshape(-1) if isinstance(reg, torch.Tensor) else reg
        return matrix_mean(matrix) + reg * expected_positive_regularizer(probs,
                                                                          self.value("k", logits))
