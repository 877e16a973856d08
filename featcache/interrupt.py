"""Stopping long work cleanly: Ctrl-C (SIGINT) and SIGTERM.

The command line installs :func:`stop_signals` around every command. The first signal only
sets a flag and says so; every long loop (stage one's batches, stage two's steps, stage
three's steps and evaluation batches) calls :func:`check_stop` once per step, which raises
:class:`~featcache.errors.Interrupted` there: a point where everything finished (chunks,
epochs, losses) is already saved, so running the same command again resumes. The stage adds
what was kept and how to resume, and the command line prints that as one line and exits with
130 (SIGINT) or 143 (SIGTERM).

Worker processes forked by a command (stage two's groups) stop at their next step too: the
signal reaches them from the terminal, or is passed on by the main process. A second signal
exits at once: the temporary files being written (:func:`partial_file`) are removed, worker
processes are killed (they write no files), and the process ends with ``os._exit`` without
tearing down the interpreter. That teardown, with stage two's worker threads still inside
PyTorch, is what used to abort with "terminate called without an active exception" (SIGABRT).

How a signal is handled: nothing runs inside the signal handler. Python calls a Python-level
handler between two bytecodes of the main thread, also between two bytecodes of a handler still
running, so a handler written in Python nests when signals come faster than it returns (a flood
of SIGINT nested it to RecursionError, which ended the command, and the next signal met the
default handler). Inside :func:`stop_signals` the Python-level handler is a builtin that runs no
bytecode and does nothing (:data:`_RUN_NOTHING`): nothing can land inside it. The C-level handler
behind it writes each signal's number to a pipe (``signal.set_wakeup_fd``), and a watcher thread
reads the pipe and does the work above, one signal after the other, outside any handler. A forked
worker has no watcher thread (a fork copies only the forking thread): it gets a pipe of its own,
which :func:`check_stop` reads.

Python code that is not the command line (the API, notebooks) keeps Python's own Ctrl-C
behaviour; :func:`request_stop` lets it ask running loops to stop the same way.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from featcache.errors import Interrupted

#: signals handled, and the exit status of each (128 + the signal number, as shells report)
SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

# The stop request is a plain flag, not a threading.Event: request_stop must never wait for a
# lock (a nested signal handler once deadlocked inside Event.set). "pid": the process that runs
# the command (None outside stop_signals); "pipe": the (read, write) ends of the wakeup pipe in
# use in this process; "watcher": the thread reading it; "poll": this is a forked worker, whose
# check_stop reads its own pipe; "exiting": exit_now has begun.
_state: dict = {"signal": None, "pid": None, "stop": False, "pipe": None, "watcher": None,
                "poll": False, "exiting": False}
# No lock: set.add, set.discard and list(set) are each one step under the GIL, and exit_now
# must never wait for a lock the code it runs beside may hold.
_partial: set[str] = set()

#: the Python-level handler inside stop_signals: ``{}.get(signum, frame)``, a builtin, so it runs
#: no bytecode (no signal can land inside it, nothing nests) and does nothing; the signal itself
#: reaches the watcher through the wakeup pipe
_RUN_NOTHING = dict[int, object]().get
#: written to the wakeup pipe to end the watcher (no signal has number 0)
_END = b"\0"


def check_stop() -> None:
    """Raise :class:`Interrupted` if a stop was asked for; call it once per step of long loops."""
    if _state["poll"]:
        _poll_pipe()  # a forked worker: the signals it got wait in its pipe
    if _state["stop"]:
        signum = _state["signal"]
        name = SIGNAL_NAMES.get(signum, "a stop request")
        raise Interrupted(f"stopped by {name}", SIGNALS.get(signum, 130))


def request_stop(signum: int | None = None) -> None:
    """Ask every running loop to stop at its next step (what the first Ctrl-C does)."""
    _state["signal"] = signum
    _state["stop"] = True


def clear_stop() -> None:
    """Forget a stop request (a new command starts)."""
    _state["signal"] = None
    _state["stop"] = False


@contextmanager
def partial_file(path: str | os.PathLike) -> Iterator[None]:
    """Register a temporary file while it is being written: an immediate exit removes it."""
    key = os.fspath(path)
    while _state["exiting"]:  # exit_now runs beside this thread: start no file it would miss
        time.sleep(1.0)
    _partial.add(key)
    try:
        yield
    finally:
        _partial.discard(key)


@contextmanager
def stop_signals() -> Iterator[None]:
    """Handle SIGINT and SIGTERM as described in the module docstring, for the block.

    Outside the main thread (where Python cannot install handlers) the block runs unchanged.
    Nested inside another (a ``pipeline`` step runs a command), it leaves the outer block's
    handlers and stop request as they are: a step stopped by Ctrl-C stops the pipeline too.
    """
    if (threading.current_thread() is not threading.main_thread()
            or _state["pid"] == os.getpid()):
        yield
        return
    clear_stop()
    _state["pid"] = os.getpid()
    previous_fd = _open_pipe()
    watcher = threading.Thread(target=_watch, args=(_state["pipe"][0],), daemon=True,
                               name="featcache-signals")
    _state["watcher"] = watcher
    watcher.start()
    previous = {signum: signal.signal(signum, _RUN_NOTHING) for signum in SIGNALS}
    try:
        yield
    finally:
        # handlers first: a signal from here on meets the old handler, none is lost
        for signum, old in previous.items():
            signal.signal(signum, old)
        _end_watcher(previous_fd)
        _state["pid"] = None
        clear_stop()


def _open_pipe() -> int:
    """A fresh wakeup pipe for this process; the previous wakeup fd."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C-level handler never waits; a full pipe drops bytes
    _state["pipe"] = (read_end, write_end)
    return signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)


def _close_pipe() -> None:
    for fd in _state["pipe"] or ():
        try:
            os.close(fd)
        except OSError:
            pass
    _state["pipe"] = None


def _end_watcher(previous_fd: int) -> None:
    """Put the previous wakeup fd back, let the watcher handle the signals already in the pipe,
    and end it."""
    signal.set_wakeup_fd(previous_fd)
    write_end = _state["pipe"][1]
    while True:  # after every signal's byte; the pipe empties as the watcher reads
        try:
            os.write(write_end, _END)
            break
        except BlockingIOError:
            time.sleep(0.01)
    _state["watcher"].join()
    _state["watcher"] = None
    _close_pipe()


def _watch(read_end: int) -> None:
    """The watcher thread: each signal in the pipe, in order, until :data:`_END`."""
    while True:
        try:
            numbers = os.read(read_end, 512)
        except InterruptedError:
            continue
        except OSError:
            return
        for number in numbers:
            if number == _END[0]:
                return
            _on_signal(signal.Signals(number))


def _on_signal(signum: signal.Signals) -> None:
    """What a signal does (in the watcher thread, never inside a signal handler)."""
    if os.getpid() != _state["pid"]:
        # Not the command's process (a test stands in for a forked worker so): stop at the next
        # step, quietly; the main process speaks, and kills the workers on a second signal.
        request_stop(signum)
        return
    if _state["stop"]:
        exit_now(signum)
    # said before the stop is set: the command's own last line (after it stops) comes after it
    _write_stderr(f"featcache: {SIGNAL_NAMES[signum]}: stopping at the next safe point, keeping "
                  f"what is finished ({SIGNAL_NAMES[signum]} again to exit at once)")
    request_stop(signum)
    _forward(signum)


def _poll_pipe() -> None:
    """In a forked worker: the signals that reached it since the last look stop it (quietly,
    as :func:`_on_signal` does for a worker). DataLoader workers ignore SIGINT:
    ``ignore_in_worker``."""
    try:
        numbers = os.read(_state["pipe"][0], 512)
    except OSError:  # empty (non-blocking), or closed
        return
    for number in numbers:
        request_stop(number)


def _after_fork_in_child() -> None:
    """A process forked inside :func:`stop_signals` (stage two's workers, DataLoader workers)
    has no watcher thread and must not write into its parent's pipe: it gets a pipe of its own,
    read by :func:`check_stop` at each step."""
    inherited = _state["pipe"]
    if inherited is None:
        return
    try:
        _open_pipe()
    except (OSError, ValueError):  # keep the parent's pipe rather than lose the signals
        _state["pipe"] = inherited
        return
    for fd in inherited:
        os.close(fd)
    os.set_blocking(_state["pipe"][0], False)
    _state["watcher"] = None
    _state["poll"] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def exit_on_signals() -> None:
    """Outside :func:`stop_signals` (starting up, shutting down), SIGINT and SIGTERM exit at
    once: nothing is being written then that a clean stop would keep. The console entry point
    installs this for the whole process."""
    for signum in SIGNALS:
        signal.signal(signum, lambda number, _frame: exit_now(number, quiet=True))
    atexit.register(_ignore_signals_in_teardown)  # registered first, so it runs last


def _ignore_signals_in_teardown() -> None:
    """The interpreter's last steps (after the exit hooks) put Python's default handlers back,
    and a Ctrl-C landing there (a second Ctrl-C while a stopped command winds down, say) killed
    the process with the signal (status -2) instead of the status it was exiting with (130).
    The process is exiting already: let those signals pass."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def _children() -> list:
    """This process's live worker processes (none unless :mod:`multiprocessing` is in use:
    not imported here, so that the command line starts without it)."""
    module = sys.modules.get("multiprocessing")
    return module.active_children() if module is not None else []


def _forward(signum: int) -> None:
    """Pass the stop request on to worker processes (a ``kill -INT`` reaches only this one)."""
    try:
        children = _children()
    except Exception:  # never let bookkeeping break a stop
        return
    for child in children:
        try:
            os.kill(child.pid, signum)
        except (OSError, TypeError):
            pass


def die_with_parent() -> None:
    """In a forked worker: end when the process that forked it ends, even by ``kill -9``
    (Linux ``PR_SET_PDEATHSIG``; elsewhere a no-op). Without it an orphaned worker would wait
    for work forever, holding the command's output pipes."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def ignore_in_worker() -> None:
    """In a DataLoader worker: leave SIGINT to the main process (a terminal's Ctrl-C reaches
    the whole process group), which stops the loader itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def exit_now(signum: int, quiet: bool = False) -> None:
    """The second signal: remove partial files, end the workers, and exit without teardown.
    It may run in the watcher thread beside the command's own: no partial file starts once it
    has begun, and one registered meanwhile is removed by the second pass."""
    _state["exiting"] = True
    _remove_partial_files()
    try:  # killed, not asked: workers write no file, and must not outlive the command
        children = _children()
        for child in children:
            child.kill()
        for child in children:  # reaped, not left as zombies
            child.join(timeout=1.0)
    except Exception:  # exiting anyway
        pass
    _remove_partial_files()
    if not quiet:
        _write_stderr(f"featcache: {SIGNAL_NAMES.get(signum, 'signal')} again: exiting now; "
                      "finished work is kept (run the same command again to resume)")
    os._exit(SIGNALS.get(signum, 130))


def _remove_partial_files() -> None:
    for path in list(_partial):
        try:
            Path(path).unlink(missing_ok=True)
        except OSError:
            pass


def _write_stderr(text: str) -> None:
    # os.write, not print: a signal handler may run while the main thread is inside a print
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
