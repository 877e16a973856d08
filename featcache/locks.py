"""One writer per output: run folders, features files and labels files are locked while written.

The lock of ``<dir>/<name>`` is the hidden file ``<dir>/.<name>.lock``, held with the operating
system's file lock (``flock``, through the ``filelock`` library) for as long as the process
writes. The kernel releases it when the process ends, however it ends (``kill -9`` included),
so a stale lock never blocks anyone; DataLoader workers forked meanwhile do not inherit it
(``filelock`` 4 closes it in forked children). The file records its holder (pid, host, start
time, command), so that a second writer is told, in one line, who holds it and what to do.
Whoever takes the lock removes the hidden temporary files of that output left by writers that
were killed (:func:`featcache.fileio.remove_leftovers`; a live process's are kept).
The file is removed on release, while still locked (so that a process that opened it
meanwhile finds it unlinked and starts over, as ``filelock`` does); a killed process leaves it
behind, unlocked and harmless.

On a read-only file system (a shared, mounted or archived cache), or in a folder this user may
not write (a cache shared read-only, permission denied), no lock file can be made, and none is
needed to read: this process can write nothing there. The lock is then not taken
(:attr:`OutputLock.read_only`), so that a finished output can still be read; a command that
goes on to write fails on its first write, which the command line reports in one line
(:func:`featcache.fileio.read_only_message`). A lock path that is not a lock file (a folder, a
loop of symbolic links) is refused in one line saying how to remove it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import inspect
import json
import os
import shlex
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from featcache.errors import FeatcacheWarning, LockedError
from featcache.fileio import remove_leftovers

#: a lock that cannot be made where nothing can be written, by this user at least: a
#: read-only file system, or a folder this user may not write (a cache shared read-only)
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
#: a lock path that is not a lock file, and how to remove it
BROKEN = {errno.EISDIR: "is a folder", errno.ELOOP: "is a loop of symbolic links"}
BROKEN_FIX = {errno.EISDIR: "rmdir", errno.ELOOP: "rm"}
#: filelock 4 records the holder through ``on_acquired`` and closes the lock in forked
#: children; older releases (which PyTorch may have installed) lock all the same, without both
_MODERN_FILELOCK = "on_acquired" in inspect.signature(FileLock.__init__).parameters


def lock_path(target: str | os.PathLike) -> Path:
    """``<dir>/.<name>.lock``: the lock file of ``target`` (a file or a folder)."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


def holder_record() -> dict:
    """Who this process is: what a lock file records of its holder."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("__main__.py", "-m", "-c"):
        program = "featcache"
    command = " ".join([program, *sys.argv[1:]])
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command if len(command) <= 200 else command[:197] + "..."}


def describe_holder(path: Path) -> str:
    """``pid 123 on host h since 2026-11-23T10:00:00+00:00, running `featcache ...```."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "a process that did not say who it is"
    return (f"pid {record.get('pid', '?')} on {record.get('host', '?')} since "
            f"{record.get('since', '?')}, running `{record.get('command', '?')}`")


class OutputLock:
    """Exclusive, non-blocking lock of one output; a context manager.

    ``advice`` finishes the refusal's message ("wait for it to finish, or choose another
    --run-id"). Re-entering the same object nests (the lock is released by the outermost exit).
    """

    def __init__(self, target: str | os.PathLike, advice: str):
        self.target = Path(target)
        self.path = lock_path(self.target)
        self.advice = advice
        self._lock: FileLock | None = None
        self._depth = 0
        self._made_dir = False
        self.read_only = False  # taken on a read-only file system: no lock, nothing written

    def __repr__(self) -> str:
        return f"OutputLock({str(self.target)!r})"

    @property
    def held(self) -> bool:
        return self._depth > 0

    def acquire(self) -> OutputLock:
        if self._depth:
            self._depth += 1
            return self
        self._made_dir = not self.path.parent.exists()
        modern: dict[str, Any] = ({"preserve_lock_file": True, "on_acquired": _record_holder}
                                  if _MODERN_FILELOCK else {})
        lock = FileLock(self.path, timeout=0, thread_local=False, **modern)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire(blocking=False)
        except Timeout:
            raise LockedError(f"{self.target} is being written by another featcache process "
                              f"({describe_holder(self.path)}); {self.advice}") from None
        except OSError as exc:
            if exc.errno in UNWRITABLE:
                self._lock, self._depth, self._made_dir, self.read_only = None, 1, False, True
                return self
            if exc.errno in BROKEN:
                raise LockedError(f"{self.path}, the lock file of {self.target}, {BROKEN[exc.errno]}"
                                  f" (made by hand, or by another tool): remove it "
                                  f"(`{BROKEN_FIX[exc.errno]} {shlex.quote(str(self.path))}`) and "
                                  "run the command again") from None
            if exc.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            warnings.warn(f"cannot lock {self.target} on this file system ({exc.strerror}): a "
                          "second process writing it at the same time would not be detected",
                          FeatcacheWarning, stacklevel=2)
            self._lock = None
        else:
            self._lock = lock
            remove_leftovers(self.target)  # ours to clean now: no live writer holds the lock
        self._depth = 1
        return self

    def release(self) -> None:
        if not self._depth:
            return
        self._depth -= 1
        if self._depth:
            return
        if self._lock is not None:
            # Unlinked while still held: a process that opened the file meanwhile finds an
            # unlinked file once it gets the lock, and filelock makes it start over on the path.
            self.path.unlink(missing_ok=True)
            self._lock.release()
            self._lock = None
        if self._made_dir:  # leave no empty folder behind (a refused prepare, a failed run)
            try:
                self.path.parent.rmdir()
            except OSError:
                pass

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *_exc) -> None:
        self.release()


def _record_holder(fd: int) -> None:
    data = json.dumps(holder_record()).encode() + b"\n"
    try:  # best effort: a full disk must not stop the lock from protecting the output
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass
