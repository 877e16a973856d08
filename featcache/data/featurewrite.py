"""Writing features files (the format: :mod:`featcache.data.featurefile`): a whole file
atomically, its rows streamed block by block so that a file larger than memory can be written
(after an up-front check that the disk holds it), optionally compressed in chunks of whole rows
(spatial maps); and class-prompt embeddings added to a finished file."""

from __future__ import annotations

import datetime as _dt
import itertools
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np

from featcache import __version__
from featcache.data.featurefile import (
    FORMAT,
    FORMAT_VERSION,
    OFFICIAL_SPLITS,
    read_feature_attrs,
    spatial_shape,
)
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, plural
from featcache.fileio import atomic_output, require_space
from featcache.hdf5 import StreamingSink, checksum_filter, encode_attr

#: rows per HDF5 chunk of /<split>/features
BLOCK_ROWS = 1024
COMPRESSIONS = (None, "lzf", "gzip")
GZIP_LEVEL = 1  # level 1 keeps nearly all of gzip's saving on feature maps at twice level 4's speed


def write_features(path: str | os.PathLike, labels: LabelSet,
                   features: Mapping[str, np.ndarray | Iterable[np.ndarray]], attrs: dict,
                   bad: dict[str, np.ndarray] | None = None, overwrite: bool = False,
                   dtype: str = "float32", extra: Mapping[str, np.ndarray] | None = None,
                   compression: str | None = None, chunk_bytes: int | None = None) -> Path:
    """Write a complete features file atomically.

    ``features`` maps ``train`` and ``test`` to arrays whose rows follow ``labels``, or to
    iterables of row blocks (consecutive rows, written as they come: a file larger than
    memory); ``bad`` optionally flags unreadable rows (which must hold NaN). ``attrs`` must
    name at least the ``backbone``. The labels file's sha256 is recorded so that stage two can
    refuse a mismatch. ``extra`` maps HDF5 paths (``text/embeddings``, ``train/crops``) to
    further arrays. ``compression`` (``lzf`` or ``gzip``, with HDF5's byte shuffle; default none)
    and ``chunk_bytes`` (HDF5 chunks of whole rows of about that size; default
    :data:`BLOCK_ROWS` rows) are for wide rows such as spatial maps; pooled files use neither.
    A spatial file's attributes (``spatial_shape``, ``layout``) are checked against the width.
    """
    path = Path(path)
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r}: choose one of {COMPRESSIONS}")
    if "backbone" not in attrs:
        raise ValueError("write_features needs attrs['backbone']")
    if labels.sha256 is None:
        raise ValueError("write_features needs a LabelSet loaded from disk (labels.sha256 unset)")
    bad = bad or {}
    sources, dims = _split_sources(labels, features)
    spatial_shape(path, attrs, dims[0])  # a spatial file's attributes against the width
    # refused before the first byte when the disk cannot hold it (a file built row block by
    # row block may be larger than memory, so it is written as it comes, not built first)
    needed = (features_file_bytes([*labels.train.images, *labels.test.images], dims[0], dtype)
              + sum(np.asarray(array).nbytes for array in (extra or {}).values()))
    require_space(path.parent, needed, f"to write {path.name}")
    text = h5py.string_dtype("utf-8")
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    with (atomic_output(path, overwrite=overwrite, needed=needed) as tmp,
          StreamingSink(tmp) as sink, h5py.File(sink, "w") as h5):
        h5.attrs["format"] = FORMAT
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["dtype"] = dtype
        h5.attrs["labels_sha256"] = labels.sha256
        h5.attrs["labels_dataset"] = labels.dataset
        h5.attrs["featcache_version"] = __version__
        h5.attrs["created"] = now
        for key, value in attrs.items():
            h5.attrs[key] = encode_attr(value)
        h5.attrs["feature_dim"] = dims[0]  # the rows' real width, whatever ``attrs`` said
        for name in OFFICIAL_SPLITS:
            part = labels.test if name == "test" else labels.train
            group = h5.create_group(name)
            _write_rows(group, name, len(part.images), *sources[name], dtype, sink,
                        compression, chunk_bytes)
            group.create_dataset("images", data=np.asarray(part.images, dtype=object), dtype=text)
            flags = (np.zeros(len(part.images), dtype=np.uint8) if name not in bad
                     else bad[name].astype(np.uint8))
            group.create_dataset("bad", data=flags, **checksum_filter(flags.shape))
        write_extra(h5, extra or {})
        h5.attrs["complete"] = True
    return path


def _split_sources(labels: LabelSet, features: Mapping[str, np.ndarray | Iterable[np.ndarray]]
                   ) -> tuple[dict[str, tuple[np.ndarray, Iterable]], list[int]]:
    """Each split's first row block and the rest, and the splits' widths (checked equal)."""
    sources, dims = {}, []
    for name in OFFICIAL_SPLITS:
        rows = len(labels.test if name == "test" else labels.train)
        array = features[name]
        if isinstance(array, np.ndarray) and (array.ndim != 2 or array.shape[0] != rows):
            raise InputError(f"{name} features have shape {array.shape}; the labels file has "
                             f"{plural(rows, f'{name} row')}")
        sources[name] = _first_block(name, array)
        dims.append(int(sources[name][0].shape[1]))
    if dims[0] != dims[1]:
        raise InputError(f"train and test features differ in width: {sorted(set(dims))}")
    return sources, dims


def features_file_bytes(images: Sequence[object] | np.ndarray, dim: int,
                        dtype: str = "float32") -> int:
    """About how large a features file of ``images`` (all splits) x ``dim`` will be."""
    names = sum(len(str(name).encode()) for name in images)
    return len(images) * (dim * np.dtype(dtype).itemsize + 1 + 16) + names + (64 << 10)


def _first_block(name: str, source: np.ndarray | Iterable[np.ndarray]
                 ) -> tuple[np.ndarray, Iterable]:
    """The first row block of one split's features (it gives the width) and the rest."""
    blocks = iter([source] if isinstance(source, np.ndarray) else source)
    first = next(blocks, None)
    if first is None or np.ndim(first) != 2:
        raise InputError(f"{name} features: expected rows of features (a 2-D array or 2-D blocks)")
    return first, blocks


def hdf5_filters(compression: str | None) -> dict:
    """The h5py filters of features stored with ``compression`` (one of :data:`COMPRESSIONS`):
    the byte shuffle before lzf or gzip, gzip at :data:`GZIP_LEVEL`."""
    if compression is None:
        return {}
    filters = {"compression": compression, "shuffle": True}
    if compression == "gzip":
        filters["compression_opts"] = GZIP_LEVEL
    return filters


def chunk_rows(rows: int, width: int, dtype: str | np.dtype, chunk_bytes: int) -> int:
    """Rows in one HDF5 chunk of whole rows of about ``chunk_bytes`` (at least 1, at most
    ``rows``)."""
    return max(1, min(rows, chunk_bytes // (width * np.dtype(dtype).itemsize)))


def _write_rows(group: h5py.Group, name: str, rows: int, first: np.ndarray, rest: Iterable,
                dtype: str, sink: StreamingSink, compression: str | None = None,
                chunk_bytes: int | None = None) -> None:
    """Write the features of one split, block by block as they come (stopping at the first
    block that did not fit on the disk)."""
    width = int(first.shape[1])
    height = (min(rows, BLOCK_ROWS) if chunk_bytes is None
              else chunk_rows(rows, width, dtype, chunk_bytes))
    dataset = group.create_dataset("features", shape=(rows, width), dtype=dtype,
                                   chunks=(height, width), **hdf5_filters(compression),
                                   **checksum_filter())
    filled = 0
    for block in itertools.chain([first], rest):
        block = np.asarray(block, dtype=dtype)
        if block.ndim != 2 or block.shape[1] != width or filled + len(block) > rows:
            raise InputError(f"{name} features: a block of shape {block.shape} does not continue "
                             f"the {rows} x {width} rows of the labels file's {name} split")
        dataset[filled:filled + len(block)] = block
        sink.raise_failure()
        filled += len(block)
    if filled != rows:
        raise InputError(f"{name} features: the blocks hold {plural(filled, 'row')}; the labels file has "
                         f"{plural(rows, f'{name} row')}")


def write_extra(h5: h5py.File, extra: Mapping[str, np.ndarray]) -> None:
    """Write (or replace) arrays at HDF5 paths; string arrays as utf-8."""
    for key, array in extra.items():
        if key in h5:
            del h5[key]
        array = np.asarray(array)
        if array.dtype.kind in "OUS":
            h5.create_dataset(key, data=array.astype(object), dtype=h5py.string_dtype("utf-8"))
        elif array.ndim >= 2 and array.shape[0]:
            h5.create_dataset(key, data=array, chunks=(min(len(array), 256), *array.shape[1:]),
                              **checksum_filter(array.shape))
        else:
            h5.create_dataset(key, data=array, **checksum_filter(array.shape))


def add_text_embeddings(path: str | os.PathLike, embeddings: np.ndarray, classes: Iterable[str],
                        text_attrs: dict) -> Path:
    """Add (or replace) a finished features file's class-prompt embeddings, atomically: the
    file is copied to a temporary name beside it (after checking that the disk holds the
    copy), completed and renamed over the original."""
    path = Path(path)
    read_feature_attrs(path)
    embeddings = np.asarray(embeddings, dtype=np.float32)
    needed = path.stat().st_size + embeddings.nbytes + (64 << 10)
    require_space(path.parent, needed, f"to add class-prompt embeddings to {path.name}")
    with atomic_output(path, overwrite=True, needed=needed) as tmp:
        shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+") as h5:
            write_extra(h5, {"text/embeddings": embeddings,
                             "text/classes": np.asarray(list(classes), dtype=object)})
            h5.attrs["text"] = encode_attr(text_attrs)
    return path
