"""Stage two's hooks of each search mode (``--search``), registered one module per mode.

The mode itself (its name, help, default grid, what its runs' heads expect of their rows) is
declared below the stages, in :mod:`featcache.protocol.search_modes`; here each mode adds what
only stage two does with it: the losses it takes, how it makes a loss's search spec, how it
transforms the training data, and what it does once a search is selected (its refit). Every
module of this package is imported on first use and registers its hooks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from featcache.discovery import import_modules_of
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.search import SearchResult, SearchSpec
from featcache.protocol.search_modes import SearchMode


class LinearSearchMode:
    """Stage two's hooks of ``mode``; the defaults change nothing (the protocol's search)."""

    def __init__(self, mode: SearchMode):
        self.mode = mode

    def losses(self, losses: list[str], skipped: list[tuple[str, str]], every: bool) -> list[str]:
        """The losses of ``losses`` it trains (``every``: ``--loss all``); those it cannot
        train join ``skipped`` with the reason (named ones are refused)."""
        return losses

    def spec(self, spec: SearchSpec, weight_decays: Sequence[float] | None) -> SearchSpec:
        """A loss's search, as this mode searches it (``weight_decays``: ``--weight-decay``)."""
        return spec

    def data(self, data: TrainingSplits) -> TrainingSplits:
        """The training data as this mode's heads see it."""
        return data

    def refit(self, data: TrainingSplits, result: SearchResult,
              device: torch.device) -> SearchResult:
        """A finished search as this mode keeps it (``data``: what it searched on)."""
        return result


_HOOKS: dict[str, LinearSearchMode] = {}
_DISCOVERED: list[bool] = []  # filled once every module of this package is imported


def register_linear_search_mode(hooks: LinearSearchMode) -> LinearSearchMode:
    """Register stage two's hooks of ``hooks.mode`` (its module calls this at import)."""
    if hooks.mode.name in _HOOKS:
        raise ValueError(f"stage two's hooks of search mode {hooks.mode.name!r} registered twice")
    _HOOKS[hooks.mode.name] = hooks
    return hooks


def linear_search_mode(mode: SearchMode) -> LinearSearchMode:
    """Stage two's hooks of ``mode``."""
    if not _DISCOVERED:
        import_modules_of(__name__)
        _DISCOVERED.append(True)
    if mode.name not in _HOOKS:
        raise LookupError(f"search mode {mode.name!r} has no stage-two hooks: add "
                          f"featcache/linear/search_modes/<module>.py registering them")
    return _HOOKS[mode.name]
