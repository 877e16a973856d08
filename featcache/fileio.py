"""Atomic file output, full disks, and content hashing.

Every file featcache writes goes through :func:`atomic_output`: the content is written to a
temporary name beside the target and renamed onto it only once complete, so an interrupted
job never leaves a half-written file under a name that looks finished.

A full device (``ENOSPC``), an exhausted quota (``EDQUOT``) or a file-size limit (``EFBIG``,
``ulimit -f``) while writing becomes one :class:`~featcache.errors.DiskFullError` that names the
file, the space free and the space needed; the partial file is removed and every finished
file is left as it was. Files built in memory (small HDF5 files, ``torch.save`` payloads) are written
with :func:`write_bytes_atomic`, which refuses before writing a byte when they cannot fit, and
whose only writes are plain Python writes: a failed write never reaches HDF5's or PyTorch's C++
writers (a failed HDF5 write once crashed the process, and ``torch.save`` to a path loses the
error's cause). Long jobs call :func:`require_space` first, with their estimated output size. A write refused
by a read-only file system (``EROFS``: a shared, mounted or archived cache) is said in one line
by :func:`read_only_message`.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import json
import os
import re
import resource
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from featcache.environment import FSYNC
from featcache.errors import DiskFullError, OutputExistsError
from featcache.interrupt import partial_file

#: errno values meaning "no room to write" (file-size limit, quota exhausted, device full), each
#: with how it reads inside messages of libraries that drop the errno (HDF5)
_DISK_FULL_MARKS = {errno.EFBIG: ("errno = 27", "File too large"),
                    errno.EDQUOT: ("errno = 122", "Disk quota exceeded"),
                    errno.ENOSPC: ("errno = 28", "No space left on device")}
DISK_FULL_ERRNOS = set(_DISK_FULL_MARKS)
DISK_FULL_TEXTS = tuple(mark for marks in _DISK_FULL_MARKS.values() for mark in marks)
#: free space kept in reserve by :func:`require_space` (file-system metadata, logs, other jobs)
MARGIN_BYTES = 64 << 20
WRITE_BLOCK = 16 << 20


def temporary_sibling(path: Path, tag: str = "tmp") -> Path:
    """A hidden name in the same directory as ``path`` (same filesystem, so rename is atomic)."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


#: a temporary name made by :func:`temporary_sibling`: ``.<name>.<tag>-<pid>``
TEMPORARY_NAME = re.compile(r"\.(?P<name>.+)\.(?P<tag>[a-z]+)-(?P<pid>\d+)")


def remove_leftovers(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of ``target`` (beside it, and inside it when it is a folder,
    at any depth) left by processes that are gone (``kill -9``, a power loss); the caller holds
    ``target``'s lock. A temporary file of a live process is kept. Returns the removed files."""
    target = Path(target)
    found = list(target.parent.glob(f".{glob.escape(target.name)}.*-*"))
    if target.is_dir() and not target.is_symlink():
        found += target.rglob(".*-*")
    removed = []
    for path in found:
        match = TEMPORARY_NAME.fullmatch(path.name)
        if match is None or not path.is_file() or path.is_symlink() or _alive(int(match["pid"])):
            continue
        try:
            path.unlink()
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, dead but not yet reaped, does
    not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process, or a pid we may not signal: alive
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def refuse_existing(path: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an existing output early, before any work is done (unless ``overwrite``)."""
    if Path(path).exists() and not overwrite:
        raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it")


@contextmanager
def atomic_output(path: str | os.PathLike, overwrite: bool = False,
                  needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path; on success rename it onto ``path``, on failure delete it.

    Refuses an existing ``path`` unless ``overwrite`` is set; the existing file is untouched
    until the new one is complete. A write that fails for want of space raises
    :class:`DiskFullError` (``needed``, when known, is quoted as the space required).
    """
    path = Path(path)
    refuse_existing(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        with partial_file(tmp):
            yield tmp
            _fsync_file(tmp)
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        written = _size(tmp)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # it could not be made either (a read-only file system)
            pass
        if is_disk_full(exc) and not isinstance(exc, DiskFullError):
            raise DiskFullError(disk_full_message(exc, path, needed, written)) from exc
        raise


def write_bytes_atomic(path: str | os.PathLike, data, overwrite: bool = True) -> Path:
    """Write ``data`` (bytes or a buffer) to ``path`` atomically, after checking that it fits."""
    path = Path(path)
    view = memoryview(data).cast("B")
    require_space(path.parent, view.nbytes, f"to write {path.name}")
    with atomic_output(path, overwrite=overwrite, needed=view.nbytes) as tmp, open(tmp, "wb") as out:
        for start in range(0, view.nbytes, WRITE_BLOCK):
            out.write(view[start:start + WRITE_BLOCK])
    return path


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_output(path, overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_text_if_changed(path: str | os.PathLike, text: str) -> Path:
    """:func:`write_text_atomic`, unless ``path`` already holds ``text``: a finished output
    shown again (a reused run's table) is left alone, so that it can be shown from a cache
    this user may only read."""
    path = Path(path)
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    return write_text_atomic(path, text)


def write_json_atomic(path: str | os.PathLike, obj, overwrite: bool = True) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", overwrite)


def save_torch_atomic(path: str | os.PathLike, payload, overwrite: bool = True) -> Path:
    """``torch.save(payload)`` to ``path`` atomically: serialised in memory, then written by
    :func:`write_bytes_atomic` (so a full disk gives a clear error, not a C++ one)."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return write_bytes_atomic(path, buffer.getbuffer(), overwrite=overwrite)


# ------------------------------------------------------------------------------ free space
def free_bytes(directory: str | os.PathLike) -> int:
    """Bytes an unprivileged user may still write on the device holding ``directory`` (the
    nearest existing parent is asked when it does not exist yet)."""
    directory = Path(directory).absolute()
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return shutil.disk_usage(directory).free


def file_size_limit() -> int | None:
    """The process's file-size limit in bytes (``ulimit -f``), or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def require_space(directory: str | os.PathLike, needed: int, what: str,
                  largest_file: int | None = None) -> int:
    """Refuse early (``DiskFullError``) when ``needed`` bytes do not fit in ``directory``, or
    when the largest file to write (``largest_file``, default ``needed``) exceeds the shell's
    file-size limit; returns the free bytes. ``what`` says what the space is for ("to extract
    the features of 5011 images")."""
    free = free_bytes(directory)
    if needed + (MARGIN_BYTES if needed > MARGIN_BYTES else 0) > free:
        raise DiskFullError(
            f"not enough free space in {directory} {what}: about {human_bytes(needed)} needed, "
            f"{human_bytes(free)} free. Free some space, or put the cache on a larger disk "
            "(--cache DIR or FEATCACHE_CACHE), then run the same command again")
    limit = file_size_limit()
    largest = needed if largest_file is None else largest_file
    if limit is not None and largest > limit:
        raise DiskFullError(
            f"the file-size limit of this shell (ulimit -f: {human_bytes(limit)}) is smaller than "
            f"the {human_bytes(largest)} file to write {what}; raise it (ulimit -f unlimited) and "
            "run the same command again")
    return free


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) means "no room to write"."""
    for link in _chain(exc):
        if isinstance(link, DiskFullError):
            return True
        if isinstance(link, OSError) and link.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(link, (OSError, RuntimeError)) and any(t in str(link) for t in DISK_FULL_TEXTS):
            return True
    return False


def disk_full_message(exc: BaseException, path: Path | None, needed: int | None = None,
                      written: int | None = None) -> str:
    """One line for a write that failed for want of space: which file (None: the error did
    not say), why, free and needed."""
    code = _errno_of(exc)
    if code == errno.EFBIG:
        limit = file_size_limit()
        cause = ("the file-size limit of this shell" + (f" (ulimit -f: {human_bytes(limit)})"
                                                         if limit is not None else "")
                 + " was reached")
        fix = "raise the limit (ulimit -f unlimited)"
    elif code == errno.EDQUOT:
        cause = "the disk quota is exhausted"
        fix = "free some space within your quota, or put the cache on another disk"
    elif path is None:
        cause = f"a device was full ({exc})"
        fix = "free some space, or put the cache on a larger disk (--cache DIR or FEATCACHE_CACHE)"
    else:
        cause = f"the device holding {path.parent} is full ({human_bytes(free_bytes(path.parent))} free)"
        fix = "free some space, or put the cache on a larger disk (--cache DIR or FEATCACHE_CACHE)"
    amount = (f"; about {human_bytes(needed)} needed" if needed else
              f"; more than the {human_bytes(written)} written so far is needed" if written else "")
    what = "an output file" if path is None else path
    return (f"could not write {what}: {cause}{amount}. The partial file was removed and finished "
            f"work is kept: {fix}, then run the same command again")


def human_bytes(count: int | float | None) -> str:
    """``1.5 GB``-style sizes (powers of 1000, as ``df -H`` and file managers show them)."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _errno_of(exc: BaseException) -> int | None:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in DISK_FULL_ERRNOS:
            return link.errno
        text = str(link)
        for code, marks in _DISK_FULL_MARKS.items():
            if any(mark in text for mark in marks):
                return code
    return None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


# ------------------------------------------------------------------------------ read-only
def is_read_only(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a write refused: by a read-only
    file system, or for want of permission (a file or folder this user may not write)."""
    return any(_refused_write(link) for link in _chain(exc))


def _refused_write(link: BaseException) -> bool:
    if not isinstance(link, OSError):
        return False
    if link.errno == errno.EROFS:
        return True
    if link.errno not in (errno.EACCES, errno.EPERM) or not link.filename:
        return False
    path = Path(os.fsdecode(link.filename))
    return not path.exists() or os.access(path, os.R_OK)  # made, or replaced: a write


def unreadable(exc: BaseException) -> str | None:
    """The file ``exc`` (or an exception it was raised from) could not read for want of
    permission, or None."""
    for link in _chain(exc):
        if (isinstance(link, OSError) and link.errno in (errno.EACCES, errno.EPERM)
                and link.filename and not _refused_write(link)):
            return os.fsdecode(link.filename)
    return None


def read_only_message(exc: BaseException, out_option: str | None = None) -> str:
    """One line for a write refused by a read-only file system or for want of permission: what
    could not be written, the cache (above a folder holding a dataset's ``labels.h5``) or
    folder that is read-only, and how to write elsewhere: ``out_option`` (``--out FILE``) when
    the command has one, else a writable cache (``--cache DIR``) holding a copy or links of the
    dataset's files."""
    refused = next((link for link in _chain(exc) if _refused_write(link)), None)
    where = getattr(refused, "filename", None)
    denied = getattr(refused, "errno", errno.EROFS) != errno.EROFS
    path = Path(os.fsdecode(where)).absolute() if where else None
    if path is not None and (target := re.fullmatch(r"\.(.+)\.(?:tmp|lock)-\d+|\.(.+)\.lock",
                                                    path.name)):
        path = path.with_name(target.group(1) or target.group(2))  # the output, not its helper
    dataset = (None if path is None else
               next((folder for folder in path.parents if (folder / "labels.h5").is_file()), None))
    state = "not writable by this user" if denied else "read-only"
    if path is None:
        what = "an output: " + ("permission denied" if denied else "the file system is read-only")
    elif dataset is not None:
        what = f"{path}: the cache {dataset.parent} is {state}"
    elif denied:
        what = f"{path}: {path.parent} is {state}"
    else:
        what = f"{path}: {path.parent} is on a read-only file system"
    if out_option:
        fix = f"write it elsewhere with {out_option}"
    else:
        fix = "put the outputs in a writable cache with --cache DIR (or FEATCACHE_CACHE=DIR)"
        if dataset is not None:
            fix += f", the dataset's files linked there first: `cp -rs {shlex.quote(str(dataset))} DIR/`"
    return f"cannot write {what}; {fix}"


# ------------------------------------------------------------------------------ hashing
def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def fsync_wanted() -> bool:
    """Whether finished files are flushed to the disk before their rename (default). Set
    ``FEATCACHE_FSYNC=0`` on a scratch disk: each write stays atomic (a crash or kill never
    leaves a half-file under a final name), but a power cut may lose the newest files or
    leave them empty."""
    return bool(FSYNC.value(True))


def _fsync_file(path: Path) -> None:
    if fsync_wanted() and path.is_file():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    if not fsync_wanted():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
