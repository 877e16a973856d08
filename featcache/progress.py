"""Progress for every long step, suited to where it goes: bars on a terminal, lines in a log.

On a terminal :func:`progress` is a tqdm bar on stderr. When stderr is not a terminal (a log
file, a batch job, CI), redrawn bars would flood the log, so the same object prints a start
line, one plain line at most every 30 seconds, and an end line with the rate (a bar with
nothing to do prints nothing)::

    features features-resnet50: start, 5000 img
    features features-resnet50: 45% 2250/5000 [01:00<01:13, 37.4img/s]
    features features-resnet50: done, 5000 img in 02:14 (37.3 img/s)

Every count names what it counts: items left out are counted as skipped (:meth:`Bar.skip`:
"done, 3 img and 2 skipped"), and a total that grew on the way says so ("done, 175 epochs
(25 known at the start)").

``FEATCACHE_PROGRESS=bars|lines|off`` forces a style; ``FEATCACHE_PROGRESS_INTERVAL`` sets the
seconds between lines (default 30).
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from featcache.environment import PROGRESS, PROGRESS_INTERVAL
from featcache.errors import plural

PROGRESS_ENV = "FEATCACHE_PROGRESS"
INTERVAL_ENV = "FEATCACHE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
LINE_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def progress_style(stream=None) -> str:
    """``bars`` on a terminal, ``lines`` elsewhere, or what ``$FEATCACHE_PROGRESS`` says."""
    forced = PROGRESS.value()
    if forced is not None:
        return str(forced)
    stream = stream or sys.stderr
    try:
        return "bars" if stream.isatty() else "lines"
    except (AttributeError, ValueError):
        return "lines"


def line_interval() -> float:
    return float(PROGRESS_INTERVAL.value(DEFAULT_INTERVAL))


def progress(iterable=None, *, total=None, desc: str | None = None, unit: str = "it",
             disable: bool = False, leave: bool = True, position: int | None = None,
             mininterval: float = 0.5, **kwargs) -> Bar:
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
    return Bar(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=leave,
                position=position, file=sys.stderr, mininterval=mininterval, **kwargs)


def say(message: str) -> None:
    """A status line on stderr that does not break a progress bar drawn there."""
    tqdm.write(message, file=sys.stderr)


#: units that are abbreviations: never a plural ``s``
ABBREVIATED = ("it", "img", "B", "s")


class Bar(tqdm):
    """A tqdm bar that also counts the items it left out: they advance the bar (it measures
    the way through the list) and are shown as skipped, never as done."""

    skipped = 0

    def skip(self, n: int) -> None:
        """Count ``n`` of the items this bar is (or will be) updated with as skipped."""
        if n:
            self.skipped += n
            self.set_postfix(skipped=self.skipped, refresh=False)


class LogLines(Bar):
    """tqdm for logs: whole lines (never a carriage return or a cursor movement): a start line,
    a status line at most every ``mininterval`` seconds (none when one more step ends the bar),
    and an end line with the rate when the bar closes (kept or not); a bar with nothing to do
    (total 0) prints nothing."""

    disable: bool  # tqdm's, set by its __init__

    def __init__(self, *args, **kwargs):
        self._last_line = -float("inf")
        self._started = False
        self._step = 0  # the last update's size
        self._announced: float | None = None  # the total the start line said
        super().__init__(*args, **kwargs)

    def update(self, n=1):
        self._step = n
        return super().update(n)

    def _write(self, text: str) -> None:
        self.fp.write(text.strip() + "\n")
        getattr(self.fp, "flush", lambda: None)()

    def _label(self) -> str:
        return self.desc.rstrip(": ") or "progress"

    def _count(self, n: int) -> str:
        unit = (self.unit or "it").strip()
        return f"{n} {unit}" if unit in ABBREVIATED else plural(n, unit)

    def display(self, msg=None, pos=None):
        if msg == "" or self.total == 0:  # tqdm clearing a bar / nothing to do: no line
            return False
        now = self._time()
        if not self._started:
            self._started, self._last_line = True, now
            self._announced = self.total
            total = f", {self._count(self.total)}" if self.total else ""
            self._write(f"{self._label()}: start{total}")
            return False
        if now - self._last_line < self.mininterval:
            return False
        if self.total and self.total - self.n <= self._step:
            # one more step finishes the bar and the end line says so: a status line here
            # ("99% 448/450", then "done, 450 img") would read as if the bar had stopped
            return False
        self._last_line = now
        self._write(msg or self.__str__())
        return False

    def clear(self, nolock=False):
        pass

    def close(self):
        if self.disable:
            return
        self.disable = True
        self._decr_instances(self)
        if self.total == 0 or not self._started:
            return
        elapsed = self._time() - self.start_t
        unit = (self.unit or "it").strip()
        rate = f"{self.n / elapsed:.1f} {unit}/s" if elapsed > 0 else f"- {unit}/s"
        spent = self.format_interval(round(elapsed))
        skipped = f" and {self.skipped} skipped" if self.skipped else ""
        if self.total and self._announced and self.total != self._announced:
            skipped += f" ({self._announced} known at the start)"
        if self.total is not None and self.n < self.total:
            self._write(f"{self._label()}: stopped at {self.n} of {self._count(self.total)}"
                        f"{f' ({self.skipped} skipped)' if self.skipped else ''} after {spent} "
                        f"({rate})")
        else:
            self._write(f"{self._label()}: done, {self._count(self.n - self.skipped)}{skipped} "
                        f"in {spent} ({rate})")
