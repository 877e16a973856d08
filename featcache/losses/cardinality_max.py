"""Gharib, Murena and Klami (TMLR 2025): single positives with label cardinality, when only the
**maximum** cardinality (and the mean) is known: ``lc-max``.

The paper ("Single-positive Multi-label Learning with Label Cardinality", OpenReview
XEPPXH2nKu) uses what is known of the number of positives per image at three granularities:
the maximum K over all images (with the mean k), the distribution P(k) of the cardinalities
(:mod:`featcache.losses.cardinality_dist`), the exact cardinality k_n of each image
(:mod:`featcache.losses.cardinality_exact`). The authors' code
(``shayangharib/SPMLL_with_Label_Cardinality``) could not be reached and the paper's text
beyond its abstract could not be read here: these losses implement the granularities as the
abstract describes them, with the terms written out in ``docs/losses.md`` (what was assumed is
said there). The terms, shared by the three losses, on f = sigmoid(g):

- z = 1 (observed positive): ``neglog(f)``;
- a **certain negative**: an image has at most K positives, so once its observed positives are
  placed first, every other class ranked below the K-th by the current (detached) logits is
  taken as negative, ``neglog(1 - f)``; observed negatives (``--num-neg``) are negatives too;
- the other unobserved classes (ranked 2..K): no term;
- loss = the matrix's sum over B * L, divided by B * L, plus a count regularizer on
  sum_i f_ni: EPR's ``(mean_n sum_i f_ni - k)^2 / L^2`` with the mean k here, the per-image
  ``mean_n (sum_i f_ni - k_n)^2 / L^2`` where each image's k_n is known or estimated.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from featcache.data.kestimate import EstimateRequest, sample_estimates
from featcache.errors import OptionError
from featcache.losses.base import SPMLLoss
from featcache.losses.needs import DataFacts
from featcache.losses.params import K_PARAM, Param
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import expected_positive_regularizer, matrix_mean, neglog

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 95

GHARIB = "Gharib, Murena and Klami TMLR 2025, reconstruction"
GHARIB_PAPER = ("Single-positive Multi-label Learning with Label Cardinality (OpenReview "
                "XEPPXH2nKu)")


def histogram_max(facts: DataFacts) -> float | None:
    """The largest number of positives of a training image (None without clean labels)."""
    counts = [value for value, images in facts.positives_histogram if images > 0]
    return float(max(counts)) if counts else None


def estimate_k_max(facts: DataFacts, request: EstimateRequest) -> dict:
    """``k_max=estimate:M``: the most positives among M training images drawn at random without
    replacement (one seeded draw, as ``k=estimate:M``), with the training set's own maximum."""
    histogram = facts.positives_histogram
    if not histogram:
        raise OptionError(f"k_max=estimate:{request.labeled} draws fully labelled images from the "
                          f"training set, but {facts.source} has no clean training labels; pass "
                          "--param k_max=VALUE")
    values = np.array([value for value, _ in histogram], dtype=np.int64)
    images = np.array([count for _, count in histogram], dtype=np.int64)
    if not 1 <= request.labeled <= int(images.sum()):
        sample_estimates(histogram, request.labeled, 1, request.seed)  # its error names M's range
    picks = np.random.default_rng(request.seed).multivariate_hypergeometric(images, request.labeled)
    return {"value": float(values[picks > 0].max()), "labeled": request.labeled,
            "seed": request.seed, "k_max_true": histogram_max(facts)}


#: the maximum number of positives per image, from the labels file unless given
K_MAX_PARAM = Param(
    None, "maximum positives per image, K (default: the labels file's maximum over the training "
          "set; estimate:M takes the maximum of M fully labelled training images)",
    low=1.0, integer=True, from_data=histogram_max,
    missing="the labels file has no clean training labels to read it from: pass "
            "--param k_max=VALUE",
    estimate=estimate_k_max,
)


def certain_negatives(logits: Tensor, observed: Tensor, bound: float | Tensor) -> Tensor:
    """(H, B, L) bool: the entries taken as negatives when an image has at most ``bound``
    positives: with its observed positives ranked first (and observed negatives last), the
    classes ranked below ``bound`` by the detached logits, and every observed negative.

    ``bound``: one number, one per head (H, 1, 1) or one per head and image (H, B, 1). Ties
    rank the lower class index first (a stable sort)."""
    scores = torch.where(observed == 1, torch.inf, torch.where(observed == -1, -torch.inf,
                                                                 logits.detach()))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    places = torch.arange(1, logits.shape[-1] + 1, device=logits.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, places)
    return ((rank > bound) & (observed != 1)) | (observed == -1)


def cardinality_matrix(logits: Tensor, observed: Tensor, negatives: Tensor) -> Tensor:
    """The loss matrix (H, B, L): z = 1 ``neglog(f)``, ``negatives`` ``neglog(1 - f)``, else 0."""
    f = torch.sigmoid(logits)
    negative_term = torch.where(negatives, neglog(1.0 - f), 0.0)
    return torch.where(observed == 1, neglog(f), negative_term)


def per_image_count_regularizer(probs: Tensor, counts: Tensor) -> Tensor:
    """``mean_n (sum_i f_ni - k_n)^2 / L^2`` per head, shape (H,); ``counts`` (B,) or (H, B)."""
    classes = probs.shape[-1]
    return ((probs.sum(dim=-1) - counts) ** 2).mean(dim=-1) / classes**2


def max_cardinality_loss(logits: Tensor, observed: Tensor, k_max: float | Tensor,
                         k: float | Tensor) -> Tensor:
    """``lc-max``'s value per head: the certain negatives below ``k_max``, EPR's regularizer
    towards the mean ``k``."""
    matrix = cardinality_matrix(logits, observed, certain_negatives(logits, observed, k_max))
    return matrix_mean(matrix) + expected_positive_regularizer(torch.sigmoid(logits), k)


@register_loss
class MaxCardinality(SPMLLoss):
    """``lc-max``: at most K positives per image. Observed positives ``neglog(f)``; the classes
    ranked below the K-th by the current logits (observed positives first) ``neglog(1 - f)``;
    the rest no term; plus EPR's regularizer ``(mean_n sum_i f_ni - k)^2 / L^2``. K = ``k_max``
    and k = ``k`` (EPR's) come from the labels file's clean training labels (their maximum and
    mean), or from M fully labelled images (``estimate:M``; ``featcache estimate-k`` shows how
    well M images pin the mean down), or are given (``--param k_max=K --param k=MEAN``)."""

    name = "lc-max"
    summary = ("Maximum cardinality K: classes ranked below the K-th are negatives, plus EPR's "
               "regularizer towards the mean k.")
    reference = GHARIB
    paper = GHARIB_PAPER
    year = 2025
    params = {"k_max": K_MAX_PARAM, "k": K_PARAM}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return max_cardinality_loss(logits, targets.observed,
                                    self.value("k_max", logits), self.value("k", logits))

