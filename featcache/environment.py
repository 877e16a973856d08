"""Every environment variable featcache reads, each checked when read.

A value that makes no sense (``FEATCACHE_FSYNC=maybe``, ``FEATCACHE_PROGRESS_INTERVAL=-5``) is
refused in one line naming the variable, its value and what it takes, instead of being taken
as the default; the command line checks them all before any work starts
(:func:`check_environment`), so that a variable read only at the end of a long job (the flush
of the last file) cannot end it. An empty value counts as unset.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from featcache.errors import OptionError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what it takes (in words) and its parser."""

    name: str
    takes: str
    parse: Callable[[str], object]

    def raw(self) -> str | None:
        value = os.environ.get(self.name)
        return None if value is None or not value.strip() else value

    def value(self, default=None):
        """The parsed value, ``default`` when unset; OptionError when it makes no sense."""
        raw = self.raw()
        if raw is None:
            return default
        try:
            return self.parse(raw.strip())
        except (ValueError, OverflowError):
            shown = raw if len(raw) <= 40 else raw[:37] + "..."
            raise OptionError(f"${self.name} is {shown!r}: it takes {self.takes} (unset it for "
                              "the default)") from None


def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(text)
        return text.lower()
    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


def _count(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low or value >= 1 << 31:
            raise ValueError(text)
        return value
    return parse


def _threads(text: str) -> int | None:
    """OpenMP's thread count; a list of them (``4,2``, nested levels) leaves featcache's own
    count (None), as it always has."""
    values = [_count(1)(part) for part in text.split(",")]
    return values[0] if len(values) == 1 else None


def _path(text: str) -> str:
    if "\x00" in text:
        raise ValueError(text)
    return text


FLAG = "1 or 0 (also true/false, yes/no, on/off)"

CACHE = Variable("FEATCACHE_CACHE", "a folder path", _path)
STATE_DIR = Variable("FEATCACHE_STATE_DIR", "a folder path", _path)
FSYNC = Variable("FEATCACHE_FSYNC", FLAG, _flag)
OFFLINE = Variable("FEATCACHE_OFFLINE", FLAG, _flag)
CUDA_GRAPHS = Variable("FEATCACHE_CUDA_GRAPHS", FLAG, _flag)
GRAPH_STEPS = Variable("FEATCACHE_GRAPH_STEPS", "a whole number >= 1 (steps per CUDA graph)",
                       _count(1))
CUDA_GROUPS = Variable("FEATCACHE_CUDA_GROUPS",
                       "a whole number >= 1 (stage-two groups trained at once on a GPU)",
                       _count(1))
TRACEBACK = Variable("FEATCACHE_TRACEBACK", FLAG, _flag)
PROGRESS = Variable("FEATCACHE_PROGRESS", "bars, lines or off", _choice("bars", "lines", "off"))
PROGRESS_INTERVAL = Variable("FEATCACHE_PROGRESS_INTERVAL", "seconds, a number >= 0", _seconds)
TENSORBOARD = Variable("FEATCACHE_TENSORBOARD", "a folder path", _path)
OMP_THREADS = Variable("OMP_NUM_THREADS", "a whole number >= 1 (or OpenMP's list of them)",
                       _threads)
WORLD_SIZE = Variable("WORLD_SIZE", "a whole number >= 1 (torchrun sets it)", _count(1))
LOCAL_WORLD_SIZE = Variable("LOCAL_WORLD_SIZE", "a whole number >= 1 (torchrun sets it)",
                            _count(1))
RANK = Variable("RANK", "a whole number >= 0 (torchrun sets it)", _count(0))
LOCAL_RANK = Variable("LOCAL_RANK", "a whole number >= 0 (torchrun sets it)", _count(0))

#: every variable featcache reads (the paths of other tools, XDG_CACHE_HOME, HF_HOME,
#: TORCH_HOME, are theirs to check)
VARIABLES = (CACHE, STATE_DIR, FSYNC, OFFLINE, CUDA_GRAPHS, GRAPH_STEPS, CUDA_GROUPS, TRACEBACK,
             PROGRESS, PROGRESS_INTERVAL, TENSORBOARD, OMP_THREADS, WORLD_SIZE,
             LOCAL_WORLD_SIZE, RANK, LOCAL_RANK)


def check_environment() -> None:
    """Refuse the first variable of :data:`VARIABLES` whose value makes no sense, and a
    torchrun rank outside its world."""
    for variable in VARIABLES:
        variable.value()
    world, rank = WORLD_SIZE.value(1), RANK.value(0)
    if rank >= world:
        raise OptionError(f"$RANK is {rank} but $WORLD_SIZE is {world}: a rank is below the "
                          "world size (torchrun sets both)")
    local_world, local_rank = LOCAL_WORLD_SIZE.value(world), LOCAL_RANK.value(0)
    if local_rank >= local_world:
        raise OptionError(f"$LOCAL_RANK is {local_rank} but $LOCAL_WORLD_SIZE is {local_world}: "
                          "a local rank is below the local world size (torchrun sets both)")
