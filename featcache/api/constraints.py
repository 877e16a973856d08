"""scikit-learn parameter constraints for featcache's own kinds of values: names in a registry
that can grow after import (losses, backbones), an (h, w, D) shape, and a loss's parameters
as ``Interval`` objects of their valid ranges."""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

from sklearn.utils._param_validation import Interval, Options, StrOptions

from featcache.losses import loss_class


class RegisteredNames(StrOptions):
    """A name registered when the check runs (``names()``); ``shown()`` lists the ones the
    error message names (default: all of them)."""

    def __init__(self, names: Callable[[], list[str]],
                 shown: Callable[[], list[str]] | None = None):
        super().__init__(set())
        self.names = names
        self.shown = shown or names

    def is_satisfied_by(self, val):
        return isinstance(val, str) and val in self.names()

    def __str__(self):
        return f"a str among {{{', '.join(map(repr, self.shown()))}}}"


class SpatialShape(Options):
    """``(h, w, D)``: three positive whole numbers."""

    def __init__(self):
        super().__init__(tuple, set())

    def is_satisfied_by(self, val):
        return (isinstance(val, (tuple, list)) and len(val) == 3
                and all(isinstance(v, Integral) and not isinstance(v, bool) and int(v) >= 1
                        for v in val))

    def __str__(self):
        return "an (h, w, D) tuple of 3 positive ints"


def loss_param_constraints(loss: str) -> dict[str, list]:
    """Each parameter of ``loss`` as a scikit-learn ``Interval`` of its valid range (whole
    numbers, where a parameter takes them, are checked when the loss resolves them)."""
    out = {}
    for key, param in loss_class(loss).params.items():
        left = None if param.low == -math.inf else param.low
        right = None if param.high == math.inf else param.high
        closed_left = left is not None and not param.low_open
        closed_right = right is not None and not param.high_open
        closed = {(True, True): "both", (True, False): "left", (False, True): "right",
                  (False, False): "neither"}[closed_left, closed_right]
        out[key] = [Interval(Real, left, right, closed=closed)]
    return out
