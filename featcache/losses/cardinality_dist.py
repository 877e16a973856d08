"""Gharib, Murena and Klami (TMLR 2025) when the **distribution** P(k) of the cardinalities is
known: ``lc-dist``, with the paper's matching that estimates each image's cardinality (the
terms: :mod:`featcache.losses.cardinality_max`; ``docs/losses.md``).

The matching: the N training images and N cardinalities drawn to follow P(k) (N P(k) of each k,
rounded by largest remainder to N in all) are the two sides of a perfect bipartite matching;
with a cost convex in ``s_n - k`` (s_n = sum_i f_ni, the image's predicted number of
positives), matching the two sorted lists in order is a global optimum, found in O(N log N)
by one sort. It needs no training of its own and no image's true k_n. It runs after every
epoch on the current predictions of the whole training split (``end_epoch``); the estimates
k^_n then play the exact cardinalities' part (:mod:`featcache.losses.cardinality_exact`). In
the first epoch, before any estimate, the loss is ``lc-max``'s with P(k)'s maximum and mean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from featcache.data.kestimate import positive_histogram
from featcache.errors import LossNeedError
from featcache.losses.base import SPMLLoss
from featcache.losses.cardinality_exact import per_image_cardinality_loss
from featcache.losses.cardinality_max import GHARIB, GHARIB_PAPER, max_cardinality_loss
from featcache.losses.needs import DataFacts, Need
from featcache.losses.params import ParamValue
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 96

Histogram = tuple[tuple[int, int], ...]


def _needs_distribution(facts: DataFacts) -> str | None:
    if facts.positives_histogram:
        return None
    return (f"needs the distribution of the number of positives per image, read from clean "
            f"training labels, but {facts.source} holds single positives only; lc-max needs "
            "only the maximum (--param k_max=K --param k=MEAN)")


#: P(k): how many training images have each number of positives
CARDINALITY_DISTRIBUTION = Need("cardinality_distribution",
                                "the distribution of positives per image (clean training labels)",
                                _needs_distribution)


def cardinality_slots(histogram: Histogram, rows: int) -> np.ndarray:
    """``rows`` cardinalities in ascending order, each k about ``rows * P(k)`` times (floors,
    then one more for the largest remainders, ties to the smaller k)."""
    values = np.array([max(int(k), 1) for k, _ in histogram], dtype=np.int64)
    weights = np.array([n for _, n in histogram], dtype=np.float64)
    share = rows * weights / weights.sum()
    counts = np.floor(share).astype(np.int64)
    extra = rows - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:extra]] += 1
    order = np.argsort(values, kind="stable")
    return np.repeat(values[order], counts[order])


def match_cardinalities(predicted: Tensor, slots: Tensor) -> Tensor:
    """Each image's cardinality (H, N) from the sorted matching of its predicted number of
    positives ``predicted`` (H, N) with the ascending ``slots`` (N,): the image with the m-th
    smallest prediction gets the m-th smallest slot (ties: the lower row first)."""
    order = torch.sort(predicted, dim=-1, stable=True).indices
    return torch.empty_like(predicted).scatter_(-1, order, slots.to(predicted).expand_as(order))


@register_loss
class DistributionCardinality(SPMLLoss):
    """``lc-dist``: the distribution P(k) of the number of positives per image, from the labels
    file's clean training labels. After every epoch each training image's cardinality k^_n is
    estimated by matching the sorted predicted counts sum_i f_ni to N cardinalities drawn to
    follow P(k); then as ``lc-exact`` with k^_n (the first epoch: ``lc-max`` with P(k)'s maximum
    and mean)."""

    name = "lc-dist"
    summary = ("Cardinality distribution P(k): each image's k estimated every epoch by matching "
               "predicted counts to P(k), then as lc-exact.")
    reference = GHARIB
    paper = GHARIB_PAPER
    year = 2025
    needs = (CARDINALITY_DISTRIBUTION,)
    scheduled = True  # the first epoch trains as lc-max, the later ones as lc-exact

    def __init__(self, num_classes: int, num_heads: int = 1,
                 params: Mapping[str, ParamValue] | None = None,
                 dataset: str | None = None, facts: DataFacts | None = None):
        super().__init__(num_classes, num_heads, params, dataset, facts)
        #: P(k) as ((k, images), ...): the labels file's official training set
        self.histogram: Histogram = facts.positives_histogram if facts is not None else ()

    def _require_histogram(self) -> Histogram:
        if not self.histogram:
            raise LossNeedError(f"loss {self.name!r} needs the distribution of positives per "
                                "image: build it with facts=DataFacts(positives_histogram=...), "
                                "or pass the clean labels to init_state")
        return self.histogram

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """``cardinality`` (H, N): each training image's estimate, 0 until the first matching.
        Built without the data's facts, P(k) is counted in ``clean``, the training rows' labels."""
        if not self.histogram and clean is not None:
            self.histogram = positive_histogram(clean.cpu().numpy())
        self._require_histogram()
        return {"cardinality": torch.zeros(self.num_heads, observed.shape[0],
                                           device=observed.device)}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        estimates = self.state_tensor(state, "cardinality")
        if epoch == 0:
            histogram = self._require_histogram()
            images = sum(n for _, n in histogram)
            mean = sum(k * n for k, n in histogram) / images
            most = max(k for k, n in histogram if n > 0)
            return max_cardinality_loss(logits, targets.observed, float(most), mean)
        return per_image_cardinality_loss(logits, targets.observed, estimates[:, targets.index])

    def end_epoch(self, epoch: int, num_epochs: int, probs: Callable[[], Tensor],
                  state: dict[str, Tensor]) -> dict[str, float | Sequence[float]]:
        """Match the predicted counts of the whole training split to P(k) (each estimate at
        least 1: every training image has its observed positive)."""
        estimates = self.state_tensor(state, "cardinality")
        predicted = probs().sum(dim=-1).to(estimates)
        slots = torch.from_numpy(cardinality_slots(self._require_histogram(), predicted.shape[-1]))
        estimates.copy_(match_cardinalities(predicted, slots).clamp(min=1.0))
        return {"cardinality_mean": estimates.mean(dim=-1).tolist()}
