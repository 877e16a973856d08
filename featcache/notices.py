"""Notices said once per machine, after a command has done its work.

``--device auto`` on a machine without CUDA runs on the CPU. A library call says so each time
(a :class:`FeatcacheWarning`); the command line says it once per machine, and only after the
command has succeeded, so that it is never printed ahead of the command's real error
(:func:`said_after_command`, which the ``featcache`` group wraps around every command). The
marker files live under ``$FEATCACHE_STATE_DIR`` (default ``~/.cache/featcache``); where they
cannot be written the notice is said every time.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from featcache.environment import STATE_DIR
from featcache.errors import FeatcacheWarning

STATE_ENV = "FEATCACHE_STATE_DIR"
CPU_FALLBACK = "no CUDA GPU is available: --device auto runs on the CPU"
#: the notices held by the command in progress (None outside :func:`said_after_command`)
_held: set[str] | None = None


def state_dir() -> Path:
    """Where the command line remembers what it has said on this machine."""
    chosen = STATE_DIR.value()
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "featcache"


def cpu_fallback_marker() -> Path:
    """The file that says the CPU fallback was said on this machine."""
    return state_dir() / f"said-cpu-fallback-{socket.gethostname() or 'this-machine'}"


def notice_cpu_fallback() -> None:
    """``--device auto`` chose the CPU: held for the end of a command, else warned now."""
    if _held is not None:
        _held.add(CPU_FALLBACK)
        return
    warnings.warn(CPU_FALLBACK + " (pass --device cpu to say so and silence this)",
                  FeatcacheWarning, stacklevel=3)


@contextmanager
def said_after_command() -> Iterator[None]:
    """Hold the notices of the block; say each once per machine when the block succeeds."""
    global _held
    outer, _held = _held, set()
    try:
        yield
        held = _held
    finally:
        _held = outer
    if CPU_FALLBACK not in held:
        return
    marker = cpu_fallback_marker()
    if marker.exists():
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        ending = " (said once on this machine; --device cpu says so)"
    except OSError:
        ending = " (pass --device cpu to say so and silence this)"
    warnings.warn(CPU_FALLBACK + ending, FeatcacheWarning, stacklevel=3)
