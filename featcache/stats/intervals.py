"""Percentile intervals, paired differences and Holm's correction over bootstrap resamples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from featcache.stats.resample import Resampling


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval of ``level`` around ``estimate`` (what the run
    reports): ``72.66 [71.20, 74.01]``."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    seed: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, digits: int = 2) -> str:
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high,
                "level": self.level, "resamples": self.resamples, "seed": self.seed}


@dataclass(frozen=True)
class Difference:
    """A difference A - B scored on the same resampled images: its paired interval, the share
    of resamples in which A scores above B (ties count half) and a two-sided p-value from the
    bootstrap standard error (for Holm's correction: :func:`holm`)."""

    interval: Interval
    wins: float
    p_value: float

    @property
    def excludes_zero(self) -> bool:
        return self.interval.low > 0 or self.interval.high < 0

    def text(self, digits: int = 2) -> str:
        i = self.interval
        return f"{i.estimate:+.{digits}f} [{i.low:+.{digits}f}, {i.high:+.{digits}f}]"

    def to_json(self) -> dict:
        return {**self.interval.to_json(), "wins": self.wins, "p_value": self.p_value}


def interval_of(estimate: float, resampled: np.ndarray, plan: Resampling) -> Interval:
    """The percentile interval of ``resampled`` values (one per resample)."""
    low, high = np.quantile(np.asarray(resampled, dtype=np.float64), plan.quantiles())
    return Interval(float(estimate), float(low), float(high), plan.level, plan.resamples,
                    plan.seed)


def paired_difference(estimate: float, differences: np.ndarray, plan: Resampling) -> Difference:
    """The paired interval of ``differences`` (A - B per resample, both on the same resampled
    images), the share A wins, and the two-sided p-value of ``estimate`` against the normal
    law of the resamples' standard deviation. (A p-value read off the resamples themselves
    cannot go below 2 / (R + 1): with 1,000 resamples, no comparison of 30 would survive
    Holm's first step, 0.05 / 30.)"""
    differences = np.asarray(differences, dtype=np.float64)
    count = differences.size
    wins = float(((differences > 0).sum() + 0.5 * (differences == 0).sum()) / count)
    spread = float(differences.std(ddof=1)) if count > 1 else 0.0
    if spread > 0:
        p_value = math.erfc(abs(estimate) / spread / math.sqrt(2))
    else:
        p_value = 1.0 if estimate == 0 else 0.0
    return Difference(interval_of(estimate, differences, plan), wins, p_value)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level ``alpha``:
    the smallest p-value against alpha/m, the next against alpha/(m-1), ... until one fails."""
    order = np.argsort(np.asarray(p_values, dtype=np.float64), kind="stable")
    rejected = [False] * len(order)
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (len(order) - rank):
            break
        rejected[index] = True
    return rejected
