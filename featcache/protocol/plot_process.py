"""Figures drawn by a process forked before torch is imported, so matplotlib loads meanwhile.

``featcache train-linear`` spends its first seconds importing torch, on one core; matplotlib's
own import (about a second on the development machine) used to come after the search, before
``curves.png`` could be drawn. :func:`start` forks a small process while the command is still
light: it imports matplotlib at once, on another core, then draws each figure the command
sends it (:func:`featcache.protocol.plots.plot_series` sends its drawing there while it runs), one
at a time, the same function on the same arguments, so the same file. :func:`send` returns at
once (the command goes on, e.g. with a run's statistics, while the figure is drawn on the other
core) and the :class:`Drawing` it returns waits for the answer. A figure is sent as the
function that draws it (pickled by name, imported by the drawing process when it first needs
it) and its arguments, so this module knows no figure and imports no module that draws one. An error while drawing comes back
and rises in the command; a drawing process that is gone (killed) is replaced by drawing in
the command itself. It ignores Ctrl-C (the command's to handle), ends with the command (even
``kill -9``: :func:`~featcache.interrupt.die_with_parent`) and when the command closes its end.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import signal
import sys
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from featcache.interrupt import die_with_parent

#: the running drawing process: (pid of the process that started it, its end of the pipe, it)
_running: list[tuple[int, Connection, Any]] = []
#: figures sent and not answered yet, oldest first (the answers come in the order sent)
_unanswered: deque[Drawing] = deque()


def start(force: bool = False) -> bool:
    """Fork the drawing process (once) where ``fork`` exists; only while torch is not imported
    yet (then there is an import to overlap), unless ``force``. True when one runs."""
    if _running:
        return True
    if "fork" not in multiprocessing.get_all_start_methods() or (
            "torch" in sys.modules and not force):
        return False
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, ours), daemon=True,
                              name="featcache-plots")
    # Ctrl-C is blocked across the fork: one arriving before the new process ignores it stays
    # pending there (then ignored) instead of killing it; the command gets its own at once.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    theirs.close()
    _running.append((os.getpid(), ours, process))
    atexit.register(stop)
    return True


class Drawing:
    """A figure sent to the drawing process: :meth:`wait` for its answer."""

    def __init__(self) -> None:
        self.answer: tuple[bool, BaseException | None] | None = None
        self.gone = False  # the process ended before answering: nothing was drawn

    def wait(self) -> bool:
        """Wait until the figure is drawn: True; False when the drawing process is gone (the
        caller draws it itself). An error while drawing rises here."""
        while self.answer is None and not self.gone:
            if not _unanswered:  # not sent from here (a forked copy of the command's)
                self.gone = True
                break
            _receive()
        if self.gone:
            return False
        done, error = self.answer or (True, None)
        if not done and error is not None:
            raise error
        return True


def send(function: Callable[..., object], *args: Any, **kwargs: Any) -> Drawing | None:
    """Start ``function(*args, **kwargs)`` (a module-level function: it is pickled by name) in
    the drawing process and return at once; None (nothing sent) when no drawing process serves
    this one."""
    if not _running or _running[0][0] != os.getpid():
        return None
    drawing = Drawing()
    try:
        _running[0][1].send((function, args, kwargs))
    except (EOFError, OSError):  # the process is gone: the caller draws itself
        stop()
        return None
    _unanswered.append(drawing)
    return drawing


def _receive() -> None:
    """The answer to the oldest figure not answered yet (every one of them is lost when the
    process is gone)."""
    try:
        answer = _running[0][1].recv()
    except (EOFError, OSError, IndexError):
        stop()
        return
    _unanswered.popleft().answer = answer


def stop() -> None:
    """Close the pipe (the drawing process then ends) and wait a moment for it."""
    while _unanswered:  # nothing will answer them now
        _unanswered.popleft().gone = True
    if not _running:
        return
    pid, connection, process = _running.pop()
    connection.close()
    if pid == os.getpid():
        process.join(timeout=5)


def _serve(connection: Connection, parents_end: Connection) -> None:
    parents_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the import this process is for)

    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            return
        name = "a figure"
        try:  # unpickling imports the drawing function's module: its failure goes back too
            function, args, kwargs = pickle.loads(message)
            name = getattr(function, "__name__", name)
            function(*args, **kwargs)
            reply: tuple[bool, BaseException | None] = (True, None)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the command
            reply = (False, exc)
        try:
            connection.send(reply)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            connection.send((False, RuntimeError(f"drawing {name} failed: {reply[1]!r}")))
