"""HDF5 conventions shared by the labels and features files: how they are written, and how
attributes are stored.

Small files (labels, pseudo-labels) are built in memory and then written with plain writes
(:func:`write_hdf5_atomic`): a write that fails on a full disk inside HDF5 can leave the
library in a state that crashes the process later (a segfault was seen while assembling a
features file), whereas a failed plain write is an ordinary, clean error. Features files may be
larger than memory, so they are written row block by row block instead
(:func:`featcache.data.featurewrite.write_features`), after an up-front check that the disk can
hold the estimated size, through a :class:`StreamingSink` that keeps a failed write from HDF5. Scalars and strings are stored as they are; dicts and lists as JSON
strings, decoded back on read.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import h5py
import numpy as np

from featcache.fileio import refuse_existing, write_bytes_atomic


def write_hdf5_atomic(path: str | os.PathLike, fill: Callable[[h5py.File], None],
                      overwrite: bool = False) -> Path:
    """Build an HDF5 file in memory with ``fill(h5)``, then write it to ``path`` atomically
    (refused before any work when it exists and ``overwrite`` is off; a full disk is refused
    before the first byte, with the size needed)."""
    path = Path(path)
    refuse_existing(path, overwrite)
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        fill(h5)
    return write_bytes_atomic(path, buffer.getbuffer(), overwrite=overwrite)


class StreamingSink(io.RawIOBase):
    """The file a large HDF5 file is streamed into (h5py's file-object driver), whose writes
    never fail inside HDF5.

    A write that fails (a disk filled by another process after the up-front space check) is
    kept in :attr:`error` and it and later writes are dropped; the writer calls
    :meth:`raise_failure` after each block (HDF5 may also hold chunks back until it closes), so
    the file is closed by HDF5 without an I/O error, and leaving the ``with`` block raises the
    failed write's ``OSError`` (``atomic_output`` turns it into a ``DiskFullError`` and removes
    the file). Letting HDF5 see the failed write instead left it
    in a state that crashed the process at clean-up (a segfault, reproduced on a full tmpfs).
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self._file = open(path, "w+b", buffering=0)  # noqa: SIM115 - closed by close()
        self.error: OSError | None = None
        self._end = 0  # the file's size as HDF5 sees it (dropped writes count)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            return self._file.seek(self._end + offset)
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        if self.error is None:
            try:
                while done < view.nbytes:  # a short write is continued (the next one fails)
                    written = self._file.write(view[done:])
                    if not written:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    done += written
            except OSError as exc:
                self.error = exc
        self._file.seek(view.nbytes - done, io.SEEK_CUR)  # the rest dropped, as if written
        self._end = max(self._end, self._file.tell())
        return view.nbytes

    def truncate(self, size: int | None = None) -> int:
        size = self.tell() if size is None else size
        if self.error is None:
            try:
                self._file.truncate(size)
            except OSError as exc:
                self.error = exc
        self._end = size
        return size

    def flush(self) -> None:
        pass  # unbuffered

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def __exit__(self, kind, exc, traceback) -> None:
        """Close; a write that failed is the error that counts (HDF5's own errors after a
        dropped write, or a clean close after one, become that write's ``OSError``)."""
        self.close()
        if self.error is not None and exc is not self.error and (
                exc is None or isinstance(exc, Exception)):
            raise self.error from exc

    def raise_failure(self) -> None:
        """Raise the first failed write's error, if any."""
        if self.error is not None:
            raise self.error


def encode_attr(value):
    """A value HDF5 can hold: dicts, lists and tuples become JSON text."""
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) else value


def decode_attrs(attrs, skip: Iterable[str] = ()) -> dict:
    """Attributes as plain Python values (JSON text decoded, numpy scalars unwrapped)."""
    skip = set(skip)
    out = {}
    for key, value in attrs.items():
        if key in skip:
            continue
        if isinstance(value, str) and value[:1] in "[{":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        elif isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out
