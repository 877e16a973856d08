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

Every numeric dataset carries a checksum per HDF5 chunk (HDF5's Fletcher32 filter:
:func:`checksum_filter`), which HDF5 checks on every read of the chunk; a chunk whose bytes
changed after it was written (a failing disk, a bad copy) is refused by :func:`read_checked`
in one line naming the file, the rows and the command that makes it again, instead of being
read as other numbers. Files written before checksums (no filter) are read as before.

Each kind of file declares its layout once (a :class:`DatasetSpec` per dataset: the kind of
its values, its shape, and for labels the values allowed); :func:`read_layout` checks the
whole layout and reads the datasets a reader asks for in one pass, each refusal one line.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from featcache.errors import InputError, plural
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


# ------------------------------------------------------------------------------ layouts
#: what a dataset's values must be: text, or numbers of these numpy kinds
KINDS = {"text": "text", "number": "numbers", "integer": "integers", "float": "floating-point numbers"}
_NUMPY_KINDS = {"number": "biuf", "integer": "biu", "float": "f"}


#: the advice that ends an error about a damaged file, or what makes it (asked only then)
Remake = str | Callable[[], str]


@dataclass(frozen=True)
class WholeNumbers:
    """What a dataset of numbers may hold, checked when :func:`read_layout` reads it: whole
    numbers, with ``allowed`` only the consecutive integers ``allowed[0]..allowed[-1]``;
    ``rule`` says so in the error ("labels are 0, 1")."""

    rule: str
    allowed: tuple[int, ...] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a featcache HDF5 file: the kind of its values (:data:`KINDS`) and its
    shape as named dimensions (``("train rows", "classes")``), the same name meaning the same
    length everywhere in the file; ``optional`` datasets may be absent; ``rule``: what its
    shape means, said when it has another number of dimensions; ``values``: the whole numbers
    it may hold (None: any value of its kind)."""

    kind: str
    dims: tuple[str, ...]
    optional: bool = False
    rule: str = ""
    values: WholeNumbers | None = None


def check_layout(h5: h5py.File, layout: Mapping[str, DatasetSpec], path: str | os.PathLike,
                 remake: Remake, sizes: Mapping[str, int] | None = None
                 ) -> dict[str, int]:
    """Check that ``h5`` holds the datasets of ``layout`` with their kinds and shapes (the
    values are not read); returns the length of each named dimension. A file that does not is
    refused in one line naming ``path``, the dataset, what it holds and what it should, then
    ``remake`` (the advice, or what makes it, asked only then). ``sizes``: lengths known
    beforehand (from another file)."""
    bound = dict(sizes or {})

    def refuse(problem: str) -> InputError:
        return InputError(f"{path}: {problem}; {_advice(remake)}")

    for key, spec in layout.items():
        item = h5.get(key)
        if item is None:
            if spec.optional:
                continue
            raise refuse(f"missing a required key, /{key}")
        if not isinstance(item, h5py.Dataset):
            raise refuse(f"/{key} is a group, expected a dataset of {KINDS[spec.kind]}")
        if not _kind_fits(item.dtype, spec.kind):
            raise refuse(f"/{key} holds {_dtype_text(item.dtype)}, expected {KINDS[spec.kind]}")
        if item.ndim != len(spec.dims):
            raise refuse(f"/{key} has shape {item.shape}; " + (spec.rule or (
                f"expected {len(spec.dims)} dimension{'s' if len(spec.dims) != 1 else ''} "
                f"({' x '.join(spec.dims)})")))
        for name, length in zip(spec.dims, item.shape, strict=True):
            if name in bound and bound[name] != length:
                raise refuse(f"/{key} has shape {item.shape}: its {name} are {length}, but the "
                             f"file's other datasets have {bound[name]}")
            bound.setdefault(name, int(length))
    return bound


def read_layout(h5: h5py.File, layout: Mapping[str, DatasetSpec], path: str | os.PathLike,
                remake: Remake, read: Collection[str]) -> dict[str, np.ndarray]:
    """Check ``h5`` against ``layout`` (:func:`check_layout`), then read the datasets named in
    ``read`` that the file holds, in the layout's order: text as an array of str, numbers
    through :func:`read_checked` with their :class:`WholeNumbers` checked. A value that is not
    allowed is refused in one line naming ``path``, the dataset, the value, its row (and
    class) and the rule, then ``remake``."""
    check_layout(h5, layout, path, remake)
    arrays = {}
    for key, spec in layout.items():
        if key not in read or key not in h5:
            continue
        if spec.kind == "text":
            arrays[key] = h5[key].asstr()[()]
            continue
        arrays[key] = values = read_checked(h5[key], path, remake)
        if spec.values is not None:
            _check_values(values, spec.values, f"{path}: /{key}", remake)
    return arrays


def _check_values(values: np.ndarray, rule: WholeNumbers, named: str, remake: Remake) -> None:
    """Refuse the first value that ``rule`` does not allow (``named``: the file and dataset;
    the columns of a matrix are classes in every featcache file)."""
    first = _first_not_allowed(values, rule.allowed)
    if first is None:
        return
    where = np.unravel_index(first, values.shape)
    found = values.reshape(-1)[first].item()
    shown = f"row {where[0]}" + (f", class {where[1]}" if len(where) > 1 else "")
    raise InputError(f"{named} holds {found!r} at {shown}; {rule.rule}; {_advice(remake)}")


def _advice(remake: Remake) -> str:
    return remake() if callable(remake) else remake


def format_version(attrs) -> int:
    """The ``format_version`` attribute as an integer; -1 when absent or not a whole number
    (a damaged or foreign file, refused by the caller as another version)."""
    value = attrs.get("format_version", -1)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return -1
    return int(number) if number.is_integer() else -1


def _kind_fits(dtype: np.dtype, kind: str) -> bool:
    if kind == "text":
        return h5py.check_string_dtype(dtype) is not None
    return dtype.kind in _NUMPY_KINDS[kind]


def _dtype_text(dtype: np.dtype) -> str:
    if h5py.check_string_dtype(dtype) is not None:
        return "text"
    if dtype.kind in "biuf":
        return f"{dtype.name} numbers"
    return f"values of type {dtype}"


def _first_not_allowed(values: np.ndarray, allowed: tuple[int, ...] | None = None) -> int | None:
    """The first flat position of ``values`` that is not a whole number (or, with ``allowed``,
    the consecutive integers ``allowed[0]..allowed[-1]``), None when every value is. Integer
    arrays are tested by their minimum and maximum, without temporaries."""
    flat = values.reshape(-1)
    if flat.size == 0:
        return None
    if flat.dtype.kind in "biu":
        if allowed is None or (flat.min() >= allowed[0] and flat.max() <= allowed[-1]):
            return None
        bad = (flat < allowed[0]) | (flat > allowed[-1])
    else:
        bad = ~np.isfinite(flat) | (flat != np.round(flat))
        if allowed is not None:
            bad |= (flat < allowed[0]) | (flat > allowed[-1])
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


# ------------------------------------------------------------------------------ checksums
def checksum_filter(shape: tuple[int, ...] | None = None) -> dict:
    """``create_dataset`` keywords that give a dataset of ``shape`` a checksum per chunk
    (Fletcher32; HDF5 needs chunks, which it chooses when not given); none for an empty or
    scalar dataset, which has no chunk to check."""
    if shape is not None and (len(shape) == 0 or 0 in shape):
        return {}
    return {"fletcher32": True}


def read_checked(dataset: h5py.Dataset, path: str | os.PathLike, remake: Remake, start: int = 0,
                 stop: int | None = None) -> np.ndarray:
    """Rows ``start:stop`` of ``dataset`` (all of a scalar one); a chunk that fails its
    checksum (or, in a file without checksums, does not decompress) is refused with
    :func:`damage_message` (``remake``: the advice, or what makes it, asked only then). Other
    read errors are raised as they are."""
    try:
        return dataset[()] if dataset.ndim == 0 else dataset[start:stop]
    except OSError as exc:
        rows = failing_rows(dataset, start, stop)
        if not rows:
            raise
        raise InputError(damage_message(path, dataset, rows, _advice(remake))) from exc


def failing_rows(dataset: h5py.Dataset, start: int = 0, stop: int | None = None
                 ) -> list[tuple[int, int]]:
    """(first, last) rows of the chunks of ``dataset[start:stop]`` that cannot be read,
    adjacent ones merged; empty for a dataset without chunks."""
    if dataset.chunks is None or dataset.ndim == 0:
        return []
    start, stop, _ = slice(start, stop).indices(dataset.shape[0])
    if start >= stop:
        return []
    region = (slice(start, stop), *(slice(0, n) for n in dataset.shape[1:]))
    failed: list[tuple[int, int]] = []
    for chunk in dataset.iter_chunks(region):
        try:
            dataset[chunk]
        except OSError:
            first, last = chunk[0].start, chunk[0].stop - 1
            if failed and failed[-1][1] + 1 >= first:  # continues (or overlaps) the last one
                failed[-1] = (failed[-1][0], max(failed[-1][1], last))
            else:
                failed.append((first, last))
    return failed


def damage_message(path: str | os.PathLike, dataset: h5py.Dataset,
                   rows: list[tuple[int, int]], remake: str) -> str:
    """One line: which file, dataset and rows are damaged, and the command that makes it
    again (``remake``: "make it again: `featcache ...`")."""
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in rows[:5])
    if len(rows) > 5:
        shown += f", … ({plural(sum(b - a + 1 for a, b in rows), 'row')} in all)"
    why = "fail their checksum" if dataset.fletcher32 else "cannot be decoded"
    return (f"{path} is damaged: {dataset.name} rows {shown} {why} (its bytes changed after it "
            f"was written: a failing disk or an incomplete copy); {remake}")
