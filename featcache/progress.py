"""Progress for every long step, suited to where it goes: bars on a terminal, lines in a log.

On a terminal :func:`progress` is a tqdm bar on stderr. When stderr is not a terminal (a log
file, a batch job, CI), redrawn bars would flood the log, so the same object prints one plain
line at most every 30 seconds, plus a last one when a bar that is kept (``leave``) closes::

    features features-resnet50: 45% 2250/5000 [01:00<01:13, 37.4img/s]

``FEATCACHE_PROGRESS=bars|lines|off`` forces a style; ``FEATCACHE_PROGRESS_INTERVAL`` sets the
seconds between lines (default 30).
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

PROGRESS_ENV = "FEATCACHE_PROGRESS"
INTERVAL_ENV = "FEATCACHE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_style(stream=None) -> str:
    """``bars`` on a terminal, ``lines`` elsewhere, or what ``$FEATCACHE_PROGRESS`` says."""
    forced = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if forced in ("bars", "lines", "off"):
        return forced
    stream = stream or sys.stderr
    try:
        return "bars" if stream.isatty() else "lines"
    except (AttributeError, ValueError):
        return "lines"


def line_interval() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def progress(iterable=None, *, total=None, desc: str | None = None, unit: str = "it",
             disable: bool = False, leave: bool = True, position: int | None = None,
             mininterval: float = 0.5, **kwargs) -> tqdm:
    """A progress bar on stderr (see the module docstring); takes tqdm's arguments."""
    style = progress_style()
    if style == "off":
        disable = True
    if style == "lines":
        kwargs.pop("dynamic_ncols", None)
        kwargs.pop("smoothing", None)
        return LogLines(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=leave,
                        file=sys.stderr, mininterval=line_interval(), bar_format=LINE_FORMAT,
                        **kwargs)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=leave,
                position=position, file=sys.stderr, mininterval=mininterval, **kwargs)


def say(message: str) -> None:
    """A status line on stderr that does not break a progress bar drawn there."""
    tqdm.write(message, file=sys.stderr)


class LogLines(tqdm):
    """tqdm that prints whole lines, at most one per ``mininterval`` seconds (never a carriage
    return or a cursor movement), for logs."""

    def __init__(self, *args, **kwargs):
        self._last_line = -float("inf")
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if msg == "":  # tqdm clearing a bar: nothing to clear in a log
            return False
        now = self._time()
        final = self.disable  # close() has set it: the last line of a kept bar
        if not final and now - self._last_line < self.mininterval:
            return False
        self._last_line = now
        self.fp.write((msg or self.__str__()).strip() + "\n")
        getattr(self.fp, "flush", lambda: None)()
        return False

    def clear(self, nolock=False):
        pass

    def close(self):
        if self.disable:
            return
        leave = self.leave if self.leave is not None else True
        if leave and hasattr(self, "last_print_t"):
            self.disable = True
            self._decr_instances(self)
            self.display()
            return
        super().close()
