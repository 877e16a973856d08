"""Gharib, Murena and Klami (TMLR 2025) when each image's **exact** cardinality k_n is known:
``lc-exact`` (the terms: :mod:`featcache.losses.cardinality_max`; ``docs/losses.md``).

A dataset with clean training labels has k_n: the number of 1 entries of the image's clean label
row. Only that count is read, never which classes are positive; the need says so where a
labels file holds single positives only.
"""

from __future__ import annotations

from torch import Tensor

from featcache.errors import InputError
from featcache.losses.base import SPMLLoss
from featcache.losses.cardinality_max import (
    GHARIB,
    GHARIB_PAPER,
    cardinality_matrix,
    certain_negatives,
    per_image_count_regularizer,
)
from featcache.losses.needs import DataFacts, Need
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import matrix_mean

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 97


def _needs_counts(facts: DataFacts) -> str | None:
    if facts.has_clean_train:
        return None
    return (f"needs each training image's number of positives (its exact label cardinality), "
            f"which comes from clean training labels, but {facts.source} holds single positives "
            "only; lc-max needs only the maximum (--param k_max=K --param k=MEAN)")


#: each training image's number of positives, counted in its clean label row
EXACT_CARDINALITY = Need("exact_cardinality",
                         "each image's number of positives (counted in clean training labels)",
                         _needs_counts)


def per_image_cardinality_loss(logits: Tensor, observed: Tensor, counts: Tensor) -> Tensor:
    """The loss per head when image n has ``counts[n]`` positives ((B,) or (H, B)): the classes
    ranked below its k_n-th are negatives, and the per-image count regularizer."""
    bound = counts.unsqueeze(-1)  # (B, 1) or (H, B, 1) against ranks (H, B, L)
    matrix = cardinality_matrix(logits, observed, certain_negatives(logits, observed, bound))
    return matrix_mean(matrix) + per_image_count_regularizer(logits.sigmoid(), counts)


@register_loss
class ExactCardinality(SPMLLoss):
    """``lc-exact``: each training image's number of positives k_n, counted in its clean label
    row (only the count is used). Observed positives ``neglog(f)``; the classes ranked below
    the image's k_n-th by the current logits (observed positives first) ``neglog(1 - f)``; plus
    the per-image regularizer ``mean_n (sum_i f_ni - k_n)^2 / L^2``."""

    name = "lc-exact"
    summary = ("Exact cardinality k_n of each image (from clean labels): classes ranked below "
               "its k_n-th are negatives, plus (sum_i f_ni - k_n)^2.")
    reference = GHARIB
    paper = GHARIB_PAPER
    year = 2025
    needs = (EXACT_CARDINALITY,)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        if targets.clean is None:
            raise InputError(f"loss {self.name!r} counts each image's positives in its clean "
                             "labels: pass Targets(clean=...) (the training data has none)")
        return per_image_cardinality_loss(logits, targets.observed, targets.clean.sum(dim=-1))
