"""Pseudo-label files ``<cache>/<dataset>/pseudo-labels-<name>.h5``: made by ``featcache
pseudo-label`` from a features file's vision-language similarities, read by the losses that
need them (VLPL, GPR).

Layout (format ``featcache-pseudo-labels``, version 1)::

    /train/pseudo   (N, L) int8: 1 pseudo-positive, -1 pseudo-negative, 0 none; rows follow the
                    labels file's official /train rows (validation rows included)
    /train/images   (N,)   utf-8, the labels file's training image paths (checked on load)

Root attributes: ``format``, ``format_version``, ``name``, ``rule`` and ``params`` (JSON: every
value the rule used), ``labels_sha256`` (the labels file it belongs to), ``features_path`` and
``features_sha256`` (the similarities' source), ``backbone``, ``stats`` (JSON: counts, and
precision/recall against the clean labels when the labels file has them), ``created``,
``featcache_version``. The labels file itself is never modified (its sha256 identifies every
features file and run built on it); the pseudo-labels live beside it and are written whole,
atomically.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache import __version__
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError, OptionError
from featcache.fileio import sha256_file
from featcache.hdf5 import (
    DatasetSpec,
    WholeNumbers,
    checksum_filter,
    decode_attrs,
    encode_attr,
    format_version,
    read_layout,
    write_hdf5_atomic,
)

FORMAT = "featcache-pseudo-labels"
FORMAT_VERSION = 1
PREFIX = "pseudo-labels-"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: the datasets of a pseudo-label file, their kinds, shapes and values
LAYOUT = {"train/pseudo": DatasetSpec("number", ("training images", "classes"),
                                      values=WholeNumbers("pseudo-labels are 1, 0 and -1",
                                                          (-1, 0, 1))),
          "train/images": DatasetSpec("text", ("training images",))}


@dataclass
class PseudoLabels:
    """A pseudo-label matrix over the official training rows, with its provenance."""

    matrix: np.ndarray  # (N, L) int8
    attrs: dict = field(default_factory=dict)
    path: Path | None = None
    sha256: str | None = None

    @property
    def name(self) -> str:
        return str(self.attrs.get("name", ""))

    def identity(self) -> dict:
        """What runs record about the pseudo-labels they trained with."""
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256,
                "rule": self.attrs.get("rule"), "params": self.attrs.get("params"),
                "features_sha256": self.attrs.get("features_sha256")}


def check_name(name: str) -> str:
    """A pseudo-label set's name: letters, digits, ``.``, ``_``, ``-``."""
    if not _NAME.match(name or ""):
        raise OptionError(f"pseudo-label name {name!r}: use letters, digits, '.', '_' and '-' "
                          "(it becomes part of a file name)")
    return name


def pseudo_labels_path(labels_path: str | os.PathLike, name: str) -> Path:
    """``pseudo-labels-<name>.h5`` beside the labels file."""
    return Path(labels_path).parent / f"{PREFIX}{check_name(name)}.h5"


def write_pseudo_labels(path: str | os.PathLike, labels: LabelSet, matrix: np.ndarray,
                        attrs: dict, overwrite: bool = False) -> Path:
    """Write a pseudo-label file for ``labels``' official training rows, atomically."""
    path = Path(path)
    matrix = np.asarray(matrix)
    expected = (len(labels.train), labels.num_classes)
    if matrix.shape != expected:
        raise InputError(f"pseudo-labels have shape {matrix.shape}; {labels.path} needs {expected}")
    if not np.isin(matrix, (-1, 0, 1)).all():
        raise InputError("pseudo-labels must be 1, 0 or -1")
    if labels.sha256 is None:
        raise ValueError("write_pseudo_labels needs a LabelSet loaded from disk")

    def fill(h5: h5py.File) -> None:
        h5.attrs["format"] = FORMAT
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["labels_sha256"] = labels.sha256
        h5.attrs["featcache_version"] = __version__
        h5.attrs["created"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        for key, value in attrs.items():
            h5.attrs[key] = encode_attr(value)
        group = h5.create_group("train")
        group.create_dataset("pseudo", data=matrix.astype(np.int8), **checksum_filter(matrix.shape))
        group.create_dataset("images", data=np.asarray(labels.train.images, dtype=object),
                             dtype=h5py.string_dtype("utf-8"))

    return write_hdf5_atomic(path, fill, overwrite=overwrite)


def _remake(path: Path) -> str:
    """The command that makes the damaged pseudo-label file ``path`` again."""
    name = path.stem.removeprefix("pseudo-labels-")
    rule = name if name in ("vlpl", "aevlp") else "RULE"
    named = "" if rule == name else f" --name {name}"
    return (f"make it again: `featcache pseudo-label --dataset {path.parent.name} --rule {rule}"
            f"{named} --overwrite`")


def read_pseudo_attrs(path: str | os.PathLike) -> dict:
    """The root attributes of a pseudo-label file (validated format)."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            return _attrs(path, h5)
    except OSError as exc:
        raise InputError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}; "
                         f"{_remake(path)}") from exc


def load_pseudo_labels(path: str | os.PathLike, labels: LabelSet) -> PseudoLabels:
    """Read a pseudo-label file and check that it belongs to ``labels``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"pseudo-label file {path} does not exist; make it with `featcache "
                         "pseudo-label`")
    try:
        with h5py.File(path, "r") as h5:
            attrs = _attrs(path, h5)
            if attrs.get("labels_sha256") != labels.sha256:
                raise InputError(
                    f"{path} was made for a labels file with sha256 "
                    f"{str(attrs.get('labels_sha256'))[:12]}…, not {labels.path}; run `featcache "
                    f"pseudo-label --dataset {labels.dataset} --rule {attrs.get('rule')} "
                    "--overwrite` again")
            arrays = read_layout(h5, LAYOUT, path, _remake(path), LAYOUT)
            matrix = arrays["train/pseudo"].astype(np.int8, copy=False)
            images = arrays["train/images"]
    except KeyError as exc:
        raise InputError(f"{path} is missing a required key: {exc}") from exc
    except OSError as exc:
        raise InputError(f"{path} could not be read (truncated or corrupt?): {exc}; "
                         f"{_remake(path)}") from exc
    if matrix.shape != (len(labels.train), labels.num_classes) or \
            (np.asarray(images, dtype=object) != labels.train.images).any():
        raise InputError(f"{path}: its rows are not {labels.path}'s training images")
    return PseudoLabels(matrix=matrix, attrs=attrs, path=path, sha256=sha256_file(path))


def available_pseudo_labels(labels: LabelSet) -> dict[str, Path]:
    """Pseudo-label files beside ``labels``' file that belong to it, by name."""
    if labels.path is None:
        return {}
    found = {}
    for path in sorted(Path(labels.path).parent.glob(f"{PREFIX}*.h5")):
        try:
            attrs = read_pseudo_attrs(path)
        except InputError:
            continue
        if attrs.get("labels_sha256") == labels.sha256:
            found[path.stem.removeprefix(PREFIX)] = path
    return found


def _attrs(path: Path, h5: h5py.File) -> dict:
    if h5.attrs.get("format") != FORMAT:
        raise InputError(f"{path} is not a featcache pseudo-label file")
    if format_version(h5.attrs) != FORMAT_VERSION:
        raise InputError(f"{path} has pseudo-label format version "
                         f"{h5.attrs.get('format_version')}; this featcache reads {FORMAT_VERSION}")
    return decode_attrs(h5.attrs)
