"""A loss's parameters: each :class:`Param` with its default, valid range and how the data sets
it, the common kinds of range, EPR's and ROLE's ``k``, and :class:`ResolvedParams`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from featcache.data.kestimate import EstimateRequest, estimate_k
from featcache.errors import OptionError
from featcache.losses.needs import DataFacts

#: a parameter's value: a number, several (a grid axis), or a request to estimate it from the
#: data (``estimate:M``, :class:`~featcache.data.kestimate.EstimateRequest`)
ParamValue = float | EstimateRequest | Sequence[float | EstimateRequest]

@dataclass(frozen=True)
class Param:
    """One loss parameter: its default, its valid range, and (``from_data``) how the data sets it.

    A ``None`` default with ``from_data`` means the data decides (EPR's ``k``: the labels
    file's mean positives per image). ``integer`` parameters take whole numbers (epochs,
    0/1 switches).
    """

    default: float | None
    help: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    from_data: Callable[[DataFacts], float | None] | None = None
    missing: str = ""  # what to do when neither the data nor the user gives a value
    #: how ``--param NAME=estimate:M`` estimates the value from M fully labelled training
    #: images: (facts, request) -> the record kept in results.json, its ``value`` the estimate
    estimate: Callable[[DataFacts, EstimateRequest], dict] | None = None

    def decided_by(self, facts: DataFacts | None) -> float | None:
        """What the data decides for this parameter (None: nothing, or no facts)."""
        return None if self.from_data is None or facts is None else self.from_data(facts)

    def range_text(self) -> str:
        """The valid range in interval notation, e.g. ``[0, 1]`` or ``(0, inf)``."""
        def bound(value: float) -> str:
            return "inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:g}"

        if self.integer and (self.low, self.high) == (0.0, 1.0):
            return "0 or 1"
        kind = "whole numbers in " if self.integer else ""
        return (f"{kind}{'(' if self.low_open or self.low == -math.inf else '['}{bound(self.low)}, "
                f"{bound(self.high)}{')' if self.high_open or self.high == math.inf else ']'}")

    def accepts(self, value: float) -> bool:
        if not math.isfinite(value) or (self.integer and not float(value).is_integer()):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def _mean_positives(facts: DataFacts) -> float | None:
    return facts.mean_positives


def _estimate_k(facts: DataFacts, request: EstimateRequest) -> dict:
    if not facts.positives_histogram:
        raise OptionError(f"k=estimate:{request.labeled} draws fully labelled images from the "
                          f"training set, but {facts.source} has no clean training labels; pass "
                          "--param k=VALUE")
    return estimate_k(facts.positives_histogram, request)


#: EPR's and ROLE's k: expected positives per image, from the labels file unless given
K_PARAM = Param(
    None, "expected positives per image (default: the labels file's mean over the training set; "
          "estimate:M estimates it from M fully labelled training images)",
    low=0.0, low_open=True, from_data=_mean_positives,
    missing="the labels file has no clean training labels to compute it: pass --param k=VALUE",
    estimate=_estimate_k,
)


def unit_interval(default: float, help: str) -> Param:
    """A parameter in [0, 1] (smoothing, fractions)."""
    return Param(default, help, low=0.0, high=1.0)


def non_negative(default: float, help: str) -> Param:
    """A parameter in [0, inf) (weights, exponents)."""
    return Param(default, help, low=0.0)


def positive(default: float, help: str) -> Param:
    """A parameter in (0, inf) (multipliers, constants inside logs)."""
    return Param(default, help, low=0.0, low_open=True)


def switch(default: float, help: str) -> Param:
    """A 0/1 switch."""
    return Param(default, help, low=0.0, high=1.0, integer=True)


def epoch_count(default: float, help: str) -> Param:
    """A number of epochs (a whole number >= 0)."""
    return Param(default, help, low=0.0, integer=True)


@dataclass
class ResolvedParams:
    """Every parameter of a loss: its values (several for a grid axis), where each came from
    (``given``, ``estimate``, ``dataset``, ``data`` or ``default``) and, for estimated values,
    how they were estimated (one record per value, ``--param k=estimate:M``)."""

    values: dict[str, list[float]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    estimates: dict[str, list[dict | None]] = field(default_factory=dict)

    def chosen(self) -> list[str]:
        """Parameters set by the user or the data (not defaults): they name a configuration."""
        return sorted(k for k, source in self.sources.items()
                      if source in ("given", "estimate", "data"))

    def single(self) -> dict[str, float]:
        """One value per parameter (refuses grid axes)."""
        several = sorted(k for k, v in self.values.items() if len(v) != 1)
        if several:
            raise OptionError(f"parameter {', '.join(several)} has several values; one is "
                              "needed here")
        return {k: v[0] for k, v in self.values.items()}
