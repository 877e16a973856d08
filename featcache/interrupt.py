"""Stopping work cleanly: Ctrl-C (SIGINT) and SIGTERM, in every command.

The command line installs :func:`stop_signals` around every command. Work that polls for a
stop runs inside :func:`safe_points` (stage one, two and three, ``predict``'s and ``cam``'s
image loops): there the first signal only sets a flag and says so, and every long loop (stage
one's batches, stage two's steps, stage three's steps and evaluation batches) calls
:func:`check_stop` once per step, which raises :class:`~featcache.errors.Interrupted` there: a
point where everything finished (chunks, epochs, losses) is already saved, so running the same
command again resumes. The stage adds what was kept and how to resume, and the command line
prints that as one line and exits with 130 (SIGINT) or 143 (SIGTERM).

Everywhere else (every other command: ``prepare``, ``table``, ``report``, ``info``, ...; a
long command's set-up) the first signal stops the command at once (:class:`SignalStop`, raised
by the handler): every output is written to a temporary name and renamed only once complete
(:mod:`featcache.fileio`), so the previous output is left as it was and no partial file stays.
Steps that must not be separated (moving an old output aside and the new one in) run inside
:func:`uninterrupted`, which holds a stop back until they are done.

Worker processes forked by a command (stage two's groups) stop at their next step too: the
signal reaches them from the terminal, or is passed on by the main process. A second signal
exits at once: the temporary files being written (:func:`partial_file`) are removed, worker
processes are killed (they write no files), and the process ends with ``os._exit`` without
tearing down the interpreter. That teardown, with stage two's worker threads still inside
PyTorch, is what used to abort with "terminate called without an active exception" (SIGABRT).

Python code that is not the command line (the API, notebooks) keeps Python's own Ctrl-C
behaviour; :func:`request_stop` lets it ask running loops to stop the same way.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from featcache.errors import Interrupted

#: signals handled, and the exit status of each (128 + the signal number, as shells report)
SIGNALS: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNAL_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}

#: seconds a DataLoader worker outlives a SIGTERM at most (:func:`ignore_in_worker`)
WORKER_GRACE_SECONDS = 60

# The stop request is a plain flag, not a threading.Event: the signal handler sets it, and a
# second signal landing while the first handler was inside Event.set (which holds a lock that
# is not re-entrant) deadlocked the process in the nested handler.
_state: dict = {"signal": None, "pid": None, "stop": False, "deferred": 0, "held": 0}
# No lock: set.add, set.discard and list(set) are each one step under the GIL, and the signal
# handler (exit_now) must never wait for a lock the code it interrupted may hold.
_partial: set[str] = set()


class SignalStop(BaseException):
    """A signal that stopped a command at once (outside :func:`safe_points`). A BaseException,
    as KeyboardInterrupt is, so that no ``except Exception`` on its way swallows it; the
    command line reports it as :meth:`interrupted` says."""

    def __init__(self, signum: int | None):
        known = signum if signum in SIGNALS else signal.SIGINT
        super().__init__(f"stopped by {SIGNAL_NAMES[known] if signum else 'a stop request'}")
        self.exit_code = SIGNALS[known]

    def interrupted(self) -> Interrupted:
        """The one-line interruption the command line prints."""
        return Interrupted(f"{self}; no file was left half-written (an output is replaced only "
                           "once it is complete): run the same command again", self.exit_code)


def check_stop() -> None:
    """Raise :class:`Interrupted` if a stop was asked for; call it once per step of long loops."""
    if _state["stop"]:
        signum = _state["signal"]
        name = SIGNAL_NAMES.get(signum, "a stop request")
        raise Interrupted(f"stopped by {name}", SIGNALS.get(signum, 130))


@contextmanager
def on_stop(detail: str) -> Iterator[None]:
    """A stop inside the block says ``detail`` too (what was kept, what to run again)."""
    try:
        yield
    except Interrupted as exc:
        raise exc.adding(detail) from None
    except SignalStop as exc:
        raise Interrupted(str(exc), exc.exit_code).adding(detail) from None


@contextmanager
def safe_points() -> Iterator[None]:
    """Work inside the block calls :func:`check_stop` at its safe points: a first signal
    there waits for the next one (instead of stopping the command at once)."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Steps that must happen together (an old output moved aside, the new one moved in): a
    signal during the block stops the command right after it, not in between."""
    _state["held"] += 1
    try:
        yield
    finally:
        _state["held"] -= 1
    if (_state["stop"] and not _state["held"] and not _state["deferred"]
            and _state["pid"] == os.getpid()):
        raise SignalStop(_state["signal"])


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
    previous = {}

    def handler(signum, _frame):
        if os.getpid() != _state["pid"]:
            # A forked worker (stage two's groups): stop at its next step too, quietly; the main
            # process speaks, and kills the workers on a second signal (:func:`exit_now`; were a
            # worker to exit first, the main process would see a broken pool, not a stop).
            # DataLoader workers ignore SIGINT: ``ignore_in_worker``.
            request_stop(signum)
            return
        if _state["stop"]:
            exit_now(signum)
        request_stop(signum)
        _forward(signum)
        if not _state["deferred"]:  # no loop polls for the stop: stop here, now
            if _state["held"]:
                return  # at the end of the uninterrupted block
            raise SignalStop(signum)
        _write_stderr(f"featcache: {SIGNAL_NAMES[signum]}: stopping at the next safe point, keeping "
               f"what is finished ({SIGNAL_NAMES[signum]} again to exit at once)")

    clear_stop()
    _state["pid"] = os.getpid()
    _state["deferred"] = _state["held"] = 0
    for signum in SIGNALS:
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        _state["pid"] = None
        clear_stop()


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
    """In a DataLoader worker: leave Ctrl-C and SIGTERM to the main process, which stops the
    loader at its next batch and ends the workers itself (a terminal's Ctrl-C, ``timeout``, a
    batch scheduler or ``kill -TERM -PGID`` reach the whole process group, and the main process
    passes a signal sent to it alone on to its workers).

    PyTorch's own SIGTERM handler ended the worker at once, and the main process then failed
    with "DataLoader worker ... exited unexpectedly" instead of stopping cleanly. A worker
    whose main process is gone still ends on SIGTERM; PyTorch's loader ends a worker that
    lingers at shutdown once its batch is done, and a second Ctrl-C kills the workers. As a
    last resort, a worker still alive :data:`WORKER_GRACE_SECONDS` after a SIGTERM ends itself
    (its main process, which ends the loader within seconds of a stop, would otherwise wait
    for it at exit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def on_sigterm(_signum: int, _frame: object) -> None:
        if os.getppid() != parent:
            os._exit(SIGNALS[signal.SIGTERM])
        signal.alarm(WORKER_GRACE_SECONDS)  # SIGALRM's default action ends the process

    signal.signal(signal.SIGTERM, on_sigterm)


def exit_now(signum: int, quiet: bool = False) -> None:
    """The second signal: remove partial files, end the workers, and exit without teardown."""
    for path in list(_partial):
        try:
            Path(path).unlink(missing_ok=True)
        except OSError:
            pass
    try:  # killed, not asked: workers write no file, and must not outlive the command
        children = _children()
        for child in children:
            child.kill()
        for child in children:  # reaped, not left as zombies
            child.join(timeout=1.0)
    except Exception:  # exiting anyway
        pass
    if not quiet:
        _write_stderr(f"featcache: {SIGNAL_NAMES.get(signum, 'signal')} again: exiting now; "
                      "finished work is kept (run the same command again to resume)")
    os._exit(SIGNALS.get(signum, 130))


def _write_stderr(text: str) -> None:
    # os.write, not print: a signal handler may run while the main thread is inside a print
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
