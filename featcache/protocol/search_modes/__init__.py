"""Stage two's search modes (``featcache train-linear --search NAME``) as registered objects.

A mode is how stage two searches a loss's heads: the papers' protocol (:mod:`.protocol`), or the
wider field's linear-probe conventions (:mod:`.probe`). What the command line, stage three and
the API need to know of a mode lives here, below the stages: its name and help, its default
grid, what its runs' heads expect of their input rows, whether such a head can start
fine-tuning or become an ``SPMLClassifier``, and which mode a finished run used (its settings
record the mode's name; the default mode's runs record none). Stage two's own hooks (the losses
it takes, its spec, data transform and refit) are in :mod:`featcache.linear.search_modes`.

Each mode is one module of this package that calls :func:`register_search_mode`; every module
here is imported on first use, so adding one is all it takes. Nothing outside a mode's module
compares a mode's name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from featcache.discovery import import_modules_of
from featcache.errors import InputError, OptionError


class SearchMode:
    """A search mode as every part of featcache sees it; subclasses override what differs."""

    #: ``--search``'s value, and what a run's settings record (``settings.search``)
    name: str = ""
    #: its part of ``--search``'s help ("" for the default mode, which the others describe)
    help: str = ""
    #: the default mode: its runs record no mode (their fingerprints predate the modes)
    default: bool = False
    #: what its runs' heads expect of their input rows (best.pt ``features_transform``; None:
    #: the backbone's features as they are)
    features_transform: str | None = None
    #: the base learning rates of its grid when ``--lr`` is not given (None: the protocol's)
    learning_rates: tuple[float, ...] | None = None
    #: whether it searches weight decays (``--weight-decay``), and that option's help
    searches_weight_decay: bool = False
    weight_decay_help: str = ""
    #: why it takes no ``--weight-decay`` (when it searches none)
    without_weight_decay: str = ""

    def head_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (n, D) as its runs' heads score them."""
        return rows

    def linear_init_refusal(self, where: str) -> str | None:
        """Why a run of this mode (``where``) cannot start fine-tuning (None: it can)."""
        return None

    def estimator_refusal(self, where: str) -> str | None:
        """Why a run of this mode cannot become an ``SPMLClassifier`` (None: it can)."""
        return None

    @property
    def linear_init(self) -> bool:
        """Whether its runs' heads can start fine-tuning (LinearInit)."""
        return self.linear_init_refusal("a run") is None

    def __repr__(self) -> str:
        return f"<search mode {self.name}>"


_MODES: dict[str, SearchMode] = {}
_DISCOVERED: list[bool] = []  # filled once every module of this package is imported


def register_search_mode(mode: SearchMode) -> SearchMode:
    """Register ``mode`` under its name (its module calls this at import)."""
    if not mode.name or mode.name in _MODES:
        raise ValueError(f"search mode {mode.name!r} is unnamed or registered twice")
    _MODES[mode.name] = mode
    return mode


def search_modes() -> list[SearchMode]:
    """Every registered mode: the default first, then the others by name."""
    if not _DISCOVERED:
        import_modules_of(__name__)
        _DISCOVERED.append(True)
    return sorted(_MODES.values(), key=lambda mode: (not mode.default, mode.name))


def search_mode_names() -> list[str]:
    """``--search``'s choices, the default first."""
    return [mode.name for mode in search_modes()]


def default_search_mode() -> SearchMode:
    """The mode ``--search`` takes when not given (the papers' protocol)."""
    return next(mode for mode in search_modes() if mode.default)


def search_mode(name: str | None) -> SearchMode:
    """The mode ``--search name`` names (None: the default mode; OptionError for an unknown
    name)."""
    if name is None:
        return default_search_mode()
    found = {mode.name: mode for mode in search_modes()}
    if name not in found:
        raise OptionError(f"--search {name!r}: choose one of {', '.join(found)}")
    return found[name]


def search_help() -> str:
    """``--search``'s help: each mode's own part."""
    return "; ".join(f"'{mode.name}': {mode.help}" for mode in search_modes() if mode.help)


def weight_decay_help() -> str:
    """``--weight-decay``'s help: the part of each mode that searches weight decays."""
    return " ".join(f"--search {mode.name}: {mode.weight_decay_help}" for mode in search_modes()
                    if mode.searches_weight_decay)


def check_search(name: str | None, weight_decays: Sequence[float] | None) -> SearchMode:
    """The mode ``--search name`` names; refuse ``--weight-decay`` for a mode that searches
    none, and decays that are negative or not finite."""
    mode = search_mode(name)
    if weight_decays is None:
        return mode
    if not mode.searches_weight_decay:
        owners = ", ".join(f"--search {other.name}" for other in search_modes()
                           if other.searches_weight_decay)
        raise OptionError(f"--weight-decay belongs to {owners} ({mode.without_weight_decay})")
    if not weight_decays or any(not (math.isfinite(v) and v >= 0) for v in weight_decays):
        raise OptionError(f"--weight-decay needs finite values >= 0, got {list(weight_decays)}")
    return mode


def recorded_search_mode(document: Mapping, where: str = "the run") -> SearchMode:
    """The mode a finished run used, from its results document (``settings.search``; a run of
    the default mode records none)."""
    name = (document.get("settings") or {}).get("search")
    if name is None:
        return default_search_mode()
    found = {mode.name: mode for mode in search_modes()}
    if name not in found:
        raise InputError(f"{where} was trained with --search {name!r}, which this featcache "
                         f"does not know (it knows {', '.join(found)}); use the featcache that "
                         "made it")
    return found[name]
