"""What featcache may do to the Python process when the process is its own (the command line)
and a library call may not. The console script's entry point claims it (:func:`claim`); in a
caller's own interpreter (the Python API, tests) :func:`freeze` does nothing.

:func:`freeze` is called at two points. Once a command has imported what it runs on (torch:
hundreds of thousands of objects that live until the process ends), the garbage collector stops
walking them (``gc.freeze``), so a full collection (the memory plan makes one) costs what the
command made, not what it imported, and forked workers share those pages instead of copying
them. When the command is over, the interpreter's last collections at exit would walk every
object again, all of them freed with the process anyway, so they are frozen first. The
interpreter then deletes none of the objects left (Python never promised ``__del__`` at exit):
featcache closes what it writes where it writes it, exit hooks (``atexit``,
``weakref.finalize``) still run, and HDF5 closes its files in its own exit hook.
"""

from __future__ import annotations

import gc

_OWNED = [False]


def claim() -> None:
    """This process runs one featcache command and ends with it (the console script's entry)."""
    _OWNED[0] = True


def owned() -> bool:
    """Whether :func:`claim` was called in this process."""
    return _OWNED[0]


def freeze() -> None:
    """In featcache's own process, the collector leaves every object made so far alone from
    here on (they live until the process ends): once a command's imports are done, and at its
    end. Elsewhere nothing happens."""
    if _OWNED[0]:
        gc.freeze()
