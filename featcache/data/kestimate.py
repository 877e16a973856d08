"""Estimating k, the expected number of positives per image, from M fully labelled images.

Cole et al. (CVPR 2021), supplement B: with M fully labelled training examples, k is estimated
as the mean number of positives per example, ``k_M = (1/M) sum_n sum_i y_ni`` (Eq. A1). How
well M examples pin k down is measured by drawing T = 10^5 sets of M examples uniformly at
random **without replacement** from the training set, computing k_M for each, and taking the
5th and 95th percentiles as the interval I_M (the paper calls it an "approximate 95% confidence
interval"; 5-95 percentiles give nominal 90% coverage). The percentiles interpolate linearly
(``np.percentile``'s default; the paper does not say).

Since k_M depends on the M examples only through their positive counts, a draw of M rows without
replacement is a draw from the multivariate hypergeometric distribution over the histogram of
counts (``numpy.random.Generator.multivariate_hypergeometric``): the same distribution, exact,
and all T draws at once. The training set is the official one, the same set whose mean is the
labels file's k (``LabelSet.k``, k* in the supplement).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from featcache.errors import InputError, OptionError, plural

#: the supplement's number of realisations
DRAWS = 100_000
#: the supplement's percentiles
PERCENTILES = (5.0, 95.0)
#: the protocol's seed, the default seed of the draws
SEED = 1200

Histogram = tuple[tuple[int, int], ...]

_REQUEST = re.compile(r"estimate:(\d+)(?::(-?\d+))?")


@dataclass(frozen=True)
class EstimateRequest:
    """``--param k=estimate:M[:SEED]``: k estimated from M fully labelled training images, drawn
    with ``SEED`` (default 1200)."""

    labeled: int
    seed: int = SEED

    @classmethod
    def parse(cls, text: str) -> EstimateRequest | None:
        """The request spelled by ``text``, or None when ``text`` is not ``estimate:...``."""
        match = _REQUEST.fullmatch(text.strip())
        if match is None:
            if text.strip().startswith("estimate"):
                raise OptionError(f"{text!r}: write estimate:M or estimate:M:SEED (M fully "
                                  "labelled images, a whole number >= 1)")
            return None
        labeled = int(match.group(1))
        if labeled < 1:
            raise OptionError(f"{text!r}: M must be at least 1")
        return cls(labeled, int(match.group(2)) if match.group(2) is not None else SEED)

    def __str__(self) -> str:
        return f"estimate:{self.labeled}:{self.seed}"


@dataclass
class KInterval:
    """k* on the full training set and the interval of k_M over many draws of M images."""

    labeled: int
    k_true: float
    low: float
    high: float
    mean: float
    std: float
    draws: int
    seed: int
    images: int
    percentiles: tuple[float, float] = PERCENTILES

    def contains(self, k: float) -> bool:
        return self.low <= k <= self.high

    def to_json(self) -> dict:
        return {**asdict(self), "percentiles": list(self.percentiles)}


def positive_histogram(clean: np.ndarray) -> Histogram:
    """((positives per image, how many images), ...) of a clean 0/1 label matrix."""
    counts = np.asarray(clean).sum(axis=1).astype(np.int64)
    values, numbers = np.unique(counts, return_counts=True)
    return tuple((int(v), int(n)) for v, n in zip(values, numbers, strict=True))


def sample_estimates(histogram: Histogram, labeled: int, draws: int, seed: int = SEED) -> np.ndarray:
    """``draws`` values of k_M, each from ``labeled`` images drawn without replacement."""
    if not histogram:
        raise InputError("estimating k needs full (clean) training labels, which these labels "
                         "do not have")
    values = np.array([v for v, _ in histogram], dtype=np.int64)
    colors = np.array([n for _, n in histogram], dtype=np.int64)
    images = int(colors.sum())
    if not 1 <= labeled <= images:
        raise OptionError(f"M = {labeled} fully labelled images: M must be between 1 and the "
                          f"{plural(images, 'training image')}")
    if draws < 1:
        raise OptionError(f"the number of draws must be at least 1, got {draws}")
    rng = np.random.default_rng(seed)
    picks = rng.multivariate_hypergeometric(colors, labeled, size=draws)
    return picks @ values / labeled


def k_interval(histogram: Histogram, labeled: int, draws: int = DRAWS, seed: int = SEED,
               percentiles: tuple[float, float] = PERCENTILES) -> KInterval:
    """I_M: the percentiles of k_M over ``draws`` draws of ``labeled`` images (supplement B)."""
    estimates = sample_estimates(histogram, labeled, draws, seed)
    low, high = np.percentile(estimates, percentiles)
    first, last = percentiles  # a list given is recorded as a pair
    images = sum(n for _, n in histogram)
    k_true = sum(v * n for v, n in histogram) / images
    return KInterval(labeled=labeled, k_true=float(k_true), low=float(low), high=float(high),
                     mean=float(estimates.mean()), std=float(estimates.std()), draws=draws,
                     seed=seed, images=images, percentiles=(first, last))


def estimate_k(histogram: Histogram, request: EstimateRequest) -> dict:
    """k_M from one seeded draw of M images, with I_M for context: what a user who fully
    labelled M random training images would estimate. The record goes into results.json."""
    value = float(sample_estimates(histogram, request.labeled, 1, request.seed)[0])
    interval = k_interval(histogram, request.labeled, seed=request.seed)
    return {"value": value, "labeled": request.labeled, "seed": request.seed,
            "k_true": interval.k_true, "interval": [interval.low, interval.high],
            "interval_percentiles": list(interval.percentiles), "interval_draws": interval.draws}
