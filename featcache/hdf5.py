"""HDF5 conventions shared by the labels and features files: how they are written, and how
attributes are stored.

Small files (labels, pseudo-labels) are built in memory and then written with plain writes
(:func:`write_hdf5_atomic`): a write that fails on a full disk inside HDF5 can leave the
library in a state that crashes the process later (a segfault was seen while assembling a
features file), whereas a failed plain write is an ordinary, clean error. Features files may be
larger than memory, so they are written row block by row block instead
(:func:`featcache.data.featurefile.write_features`), after an up-front check that the disk can
hold the estimated size. Scalars and strings are stored as they are; dicts and lists as JSON
strings, decoded back on read.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import h5py
import numpy as np

from featcache.errors import OutputExistsError
from featcache.fileio import write_bytes_atomic


def write_hdf5_atomic(path: str | os.PathLike, fill: Callable[[h5py.File], None],
                      overwrite: bool = False) -> Path:
    """Build an HDF5 file in memory with ``fill(h5)``, then write it to ``path`` atomically
    (refused before any work when it exists and ``overwrite`` is off; a full disk is refused
    before the first byte, with the size needed)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} already exists; pass --overwrite to replace it")
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        fill(h5)
    return write_bytes_atomic(path, buffer.getbuffer(), overwrite=overwrite)


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
