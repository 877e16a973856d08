"""The labels file ``<cache>/<dataset>/labels.h5``: what stages one to three read.

Layout (format ``featcache-labels``, version 1)::

    /classes               (L,)   utf-8 class names, protocol order
    /train/images          (N,)   utf-8 image paths relative to the ``image_root`` attribute
    /train/labels          (N, L) uint8 clean labels (absent when only single positives exist)
    /train/observed        (N, L) int8  1 observed positive, 0 unobserved, -1 observed negative
    /test/images           (M,)
    /test/labels           (M, L) uint8 clean labels (absent when the test set has none)
    /test/observed         (M, L) int8
    /split/train           (n,)   int64 rows of /train used for training (sorted)
    /split/val             (N-n,) int64 rows of /train used for validation (sorted)

Root attributes hold the provenance: dataset, image_root, source files with sha256, seeds,
observation parameters, counts (dropped rows included), the featcache version and the
creation time. Dict-valued attributes are stored as JSON strings.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache import __version__
from featcache.errors import InputError, plural
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

FORMAT = "featcache-labels"
FORMAT_VERSION = 1
#: the fix for a damaged labels file
REMAKE = ("make it again with the command that made it and --overwrite (`featcache prepare "
          "--help` lists the formats)")
SPLITS = ("train", "val", "test")
#: what the label matrices and split indices may hold
_OBSERVED = WholeNumbers("labels are -1, 0, 1", (-1, 0, 1))
_CLEAN = WholeNumbers("labels are 0, 1", (0, 1))
_ROWS = WholeNumbers("row indices are whole numbers")
#: the datasets of a labels file, their kinds, shapes and values (checked as it is read)
LAYOUT = {
    "classes": DatasetSpec("text", ("classes",)),
    "train/images": DatasetSpec("text", ("training images",)),
    "train/observed": DatasetSpec("number", ("training images", "classes"), values=_OBSERVED),
    "train/labels": DatasetSpec("number", ("training images", "classes"), optional=True,
                                values=_CLEAN),
    "test/images": DatasetSpec("text", ("test images",)),
    "test/observed": DatasetSpec("number", ("test images", "classes"), values=_OBSERVED),
    "test/labels": DatasetSpec("number", ("test images", "classes"), optional=True,
                               values=_CLEAN),
    "split/train": DatasetSpec("number", ("rows of /split/train",), values=_ROWS),
    "split/val": DatasetSpec("number", ("rows of /split/val",), values=_ROWS),
}


def remake_labels(path: str | os.PathLike, attrs) -> str:
    """How to make the labels file ``path`` (root attributes ``attrs``) again: the command
    recorded by ``featcache prepare`` (files made before it was recorded: :data:`REMAKE`)."""
    line = attrs.get("command_line")
    if not line:
        return REMAKE
    return (f"make it again: `{line}`, then the features extracted from it (they belong to the "
            "labels file they were made from)")


class ImageNames:
    """One split's image paths left in the labels file and read when indexed: what
    :func:`load_labels` gives with ``image_names=False`` (stage two reads a handful of them;
    a million paths as Python strings would take about 70 MB). Indexing (an integer, a slice,
    a boolean mask or rows) and :meth:`take` work as on the array of names."""

    #: names compared or read per file access when walking every row
    BLOCK = 1 << 16

    def __init__(self, path: Path, split: str, rows: np.ndarray | None = None, count: int = 0):
        self.path, self.split, self.rows = Path(path), split, rows
        self.count = len(rows) if rows is not None else count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"ImageNames({str(self.path)!r}, {self.split!r}, {plural(self.count, 'row')})"

    def take(self, rows: np.ndarray) -> ImageNames:
        """The names of ``rows`` (still unread)."""
        rows = np.asarray(rows, dtype=np.int64)
        return ImageNames(self.path, self.split, rows if self.rows is None else self.rows[rows])

    def __getitem__(self, key):
        wanted = np.arange(self.count)[key]
        if self.rows is not None:
            wanted = self.rows[wanted]
        scalar = np.ndim(wanted) == 0
        wanted = np.atleast_1d(wanted)
        unique = np.unique(wanted)
        with h5py.File(self.path, "r") as h5:
            names = h5[self.split]["images"].asstr()
            if unique.size and unique[-1] - unique[0] + 1 == unique.size:  # one run of rows
                read = names[int(unique[0]):int(unique[-1]) + 1]
            else:
                read = names[unique] if unique.size else []
        out = np.array(read, dtype=object)[np.searchsorted(unique, wanted)]
        return out[0] if scalar else out

    def __array__(self, dtype=None, copy=None):
        return self[:] if dtype is None else self[:].astype(dtype)

    def tolist(self) -> list[str]:
        return self[:].tolist()

    def __iter__(self):  # a block of :data:`BLOCK` names read at a time
        for start in range(0, self.count, self.BLOCK):
            yield from self[start:start + self.BLOCK]


@dataclass
class SplitLabels:
    """One official split: image paths, observed labels and (when known) clean labels."""

    images: np.ndarray | ImageNames
    observed: np.ndarray
    clean: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.images)

    def take(self, rows: np.ndarray) -> SplitLabels:
        return SplitLabels(
            self.images.take(rows),
            self.observed[rows],
            None if self.clean is None else self.clean[rows],
        )


@dataclass
class LabelSet:
    """Everything in a labels file, validated."""

    dataset: str
    classes: list[str]
    train: SplitLabels
    test: SplitLabels
    train_index: np.ndarray
    val_index: np.ndarray
    image_root: str | None = None
    provenance: dict = field(default_factory=dict)
    path: Path | None = None
    sha256: str | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def has_clean_train(self) -> bool:
        return self.train.clean is not None

    @property
    def has_clean_test(self) -> bool:
        return self.test.clean is not None

    @property
    def has_observed_negatives(self) -> bool:
        return bool((self.train.observed == -1).any())

    @property
    def k(self) -> float | None:
        """Mean number of positives per official training image (clean labels), or None."""
        if self.train.clean is None:
            value = self.provenance.get("k")
            return None if value is None else float(value)
        return float(self.train.clean.sum(axis=1).mean())

    @property
    def observation(self) -> dict:
        """How the observed training labels came about: ``rule`` (uniform, size, location,
        semantic, or given), the seed, and a biased sampler's inputs (from the provenance)."""
        record = {"rule": self.provenance.get("observation", "uniform")}
        if record["rule"] != "given":
            record["obs_seed"] = self.provenance.get("obs_seed")
        return {**record, **self.provenance.get("observer", {})}

    def split(self, name: str) -> SplitLabels:
        """Rows of one protocol split: ``train`` and ``val`` are parts of the official train set."""
        if name == "train":
            return self.train.take(self.train_index)
        if name == "val":
            return self.train.take(self.val_index)
        if name == "test":
            return self.test
        raise InputError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")

    def validate(self, where: str = "labels") -> None:
        """Check shapes, dtypes, values and split indices; raise InputError naming the key."""
        num_classes = len(self.classes)
        if num_classes == 0:
            raise InputError(f"{where}: no classes")
        if len(set(self.classes)) != num_classes:
            dupes = sorted({c for c in self.classes if self.classes.count(c) > 1})
            raise InputError(f"{where}: duplicate class names {dupes}")
        for name, part in (("train", self.train), ("test", self.test)):
            n = len(part.images)
            if n == 0:
                raise InputError(f"{where}: /{name} is empty")
            if part.observed.shape != (n, num_classes):
                raise InputError(
                    f"{where}: /{name}/observed has shape {part.observed.shape}, expected "
                    f"({n}, {num_classes}) (images x classes)"
                )
            if not _only_values(part.observed, (-1, 0, 1)):
                raise InputError(f"{where}: /{name}/observed holds values other than -1, 0, 1")
            if part.clean is not None:
                if part.clean.shape != (n, num_classes):
                    raise InputError(
                        f"{where}: /{name}/labels has shape {part.clean.shape}, expected "
                        f"({n}, {num_classes})"
                    )
                if not _only_values(part.clean, (0, 1)):
                    raise InputError(f"{where}: /{name}/labels holds values other than 0 and 1")
                row = _first_row(part.observed, part.clean)
                if row is not None:
                    raise InputError(
                        f"{where}: /{name} row {row} ({part.images[row]}) has an observed "
                        "positive that is negative in the clean labels"
                    )
            # names left in the file (image_names=False) are not compared: stage two never
            # reads them, and the stages that do load them whole
            if isinstance(part.images, np.ndarray) and len(set(part.images.tolist())) != n:
                seen, dupes = set(), []
                for image in part.images.tolist():
                    if image in seen:
                        dupes.append(image)
                    seen.add(image)
                raise InputError(f"{where}: /{name}/images lists {dupes[0]!r} more than once")
        n_train = len(self.train.images)
        for name, index in (("train", self.train_index), ("val", self.val_index)):
            if index.size == 0:
                raise InputError(f"{where}: /split/{name} is empty")
            if index.min() < 0 or index.max() >= n_train:
                raise InputError(f"{where}: /split/{name} indexes rows outside 0..{n_train - 1}")
        both = np.intersect1d(self.train_index, self.val_index)
        if both.size:
            raise InputError(f"{where}: row {both[0]} is in both /split/train and /split/val")


def write_labels(labels: LabelSet, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Validate ``labels`` and write them atomically to ``path``; return the path."""
    path = Path(path)
    labels.validate(where=str(path))
    provenance = dict(labels.provenance)
    provenance.setdefault("featcache_version", __version__)
    provenance.setdefault("created", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    k = labels.k
    if k is not None:
        provenance["k"] = k
    text = h5py.string_dtype("utf-8")

    def fill(h5: h5py.File) -> None:
        h5.attrs["format"] = FORMAT
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["dataset"] = labels.dataset
        h5.attrs["image_root"] = labels.image_root or ""
        for key, value in provenance.items():
            h5.attrs[key] = encode_attr(value)
        h5.create_dataset("classes", data=np.array(labels.classes, dtype=object), dtype=text)
        for name, part in (("train", labels.train), ("test", labels.test)):
            group = h5.create_group(name)
            group.create_dataset("images", data=np.asarray(part.images, dtype=object), dtype=text)
            group.create_dataset("observed", data=part.observed.astype(np.int8), compression="gzip",
                                 **checksum_filter(part.observed.shape))
            if part.clean is not None:
                group.create_dataset("labels", data=part.clean.astype(np.uint8), compression="gzip",
                                     **checksum_filter(part.clean.shape))
        split = h5.create_group("split")
        for name, index in (("train", labels.train_index), ("val", labels.val_index)):
            split.create_dataset(name, data=index.astype(np.int64), **checksum_filter(index.shape))

    write_hdf5_atomic(path, fill, overwrite=overwrite)
    return path


def _only_values(array: np.ndarray, allowed: tuple[int, ...]) -> bool:
    """Whether ``array`` holds only the consecutive integers ``allowed`` (integer arrays by
    their minimum and maximum: no temporaries the size of a million-row matrix)."""
    if array.size == 0:
        return True
    if np.issubdtype(array.dtype, np.integer):
        return bool(array.min() >= allowed[0] and array.max() <= allowed[-1])
    return bool(np.isin(array, allowed).all())


def _first_row(observed: np.ndarray, clean: np.ndarray, block: int = 1 << 16) -> int | None:
    """The first row with an observed positive that is negative in ``clean``, tested a block
    of rows at a time."""
    for start in range(0, len(observed), block):
        rows = slice(start, start + block)
        hits = ((observed[rows] == 1) & (clean[rows] == 0)).any(axis=1)
        if hits.any():
            return start + int(np.argmax(hits))
    return None


def _split_labels(h5: h5py.File, path: Path, name: str, arrays: dict[str, np.ndarray]
                  ) -> SplitLabels:
    """The official split ``name`` from the checked ``arrays`` of its labels file (its image
    paths left in the file when they were not read)."""
    clean = arrays.get(f"{name}/labels")
    images = arrays.get(f"{name}/images")
    return SplitLabels(
        images=(ImageNames(path, name, count=len(h5[name]["images"])) if images is None
                else np.asarray(images, dtype=object)),
        observed=arrays[f"{name}/observed"].astype(np.int8, copy=False),
        clean=None if clean is None else clean.astype(np.uint8, copy=False),
    )


def load_labels(path: str | os.PathLike, image_names: bool = True) -> LabelSet:
    """Read and validate a labels file; errors name the file and the key that is wrong.
    ``image_names=False`` leaves the image paths in the file (:class:`ImageNames`), read only
    where indexed: for stage two, which trains on rows and never opens an image."""
    path = Path(path)
    if not path.exists():
        raise InputError(
            f"labels file {path} does not exist; create it with `featcache prepare` "
            "(see `featcache prepare --help`)"
        )
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}; "
                         f"{REMAKE}") from exc
    with h5:
        if h5.attrs.get("format") != FORMAT:
            raise InputError(f"{path} is not a featcache labels file (attribute 'format' is "
                             f"{h5.attrs.get('format')!r}, expected {FORMAT!r})")
        version = format_version(h5.attrs)
        if version != FORMAT_VERSION:
            raise InputError(f"{path} has labels format version {version}; this featcache reads "
                             f"version {FORMAT_VERSION}. Re-create it with `featcache prepare`.")
        read = [key for key in LAYOUT if image_names or not key.endswith("/images")]
        try:
            arrays = read_layout(h5, LAYOUT, path, remake_labels(path, h5.attrs), read)
            parts = {name: _split_labels(h5, path, name, arrays) for name in ("train", "test")}
        except KeyError as exc:
            raise InputError(f"{path} is missing a required key: {exc}") from exc
        except OSError as exc:
            raise InputError(f"{path} could not be read (truncated or corrupt?): {exc}; "
                             f"{REMAKE}") from exc
        provenance = decode_attrs(h5.attrs, skip=("format", "format_version", "dataset", "image_root"))
        labels = LabelSet(
            dataset=str(h5.attrs.get("dataset", path.parent.name)),
            classes=list(arrays["classes"]),
            train=parts["train"],
            test=parts["test"],
            train_index=arrays["split/train"].astype(np.int64),
            val_index=arrays["split/val"].astype(np.int64),
            image_root=str(h5.attrs.get("image_root", "")) or None,
            provenance=provenance,
            path=path,
        )
    labels.validate(where=str(path))
    labels.sha256 = sha256_file(path)
    return labels
