"""The features file ``<cache>/<dataset>/features-<backbone>.h5``: what stage two reads.

Layout (format ``featcache-features``, version 1)::

    /train/features   (N, D) float32 or float16, rows in the order of the labels file's /train
    /train/images     (N,)   utf-8, the same image paths as the labels file (checked on load)
    /train/bad        (N,)   uint8, 1 where the image could not be read (``--skip-bad``); such
                              rows hold NaN, never a silent zero
    /test/...         the same for the official test split

Optional (``featcache features --text`` / ``--crops GxG`` with a vision-language backbone)::

    /text/embeddings  (L, E) float32, L2-normalised class-prompt embeddings, classes in the
                      labels file's order (prompt ensemble: mean of the normalised template
                      embeddings, normalised again)
    /text/classes     (L,)   utf-8 class names as put in the prompts
    /train/crops      (N, G*G, E) the backbone's output on each official training image's
                      G x G grid of tiles (row-major; AEVLP's local views), same dtype as features

and the root attributes ``text`` (JSON: templates, source, tokenizer) and ``crops_grid`` (G).

Spatial files (``spatial-<tag>.h5``, ``featcache features --spatial``) are features files whose
row i is image i's last feature map laid out (H, W, D) in C order, with the root attributes
``spatial_shape`` = [H, W, D] and ``layout`` = ``spatial`` (pooled files have neither): float16,
compressed (lzf or gzip, byte shuffle) chunks of whole rows of a few MB.

Root attributes: ``format``, ``format_version``, ``complete`` (True only in a finished file),
``backbone``, ``feature_dim``, ``dtype``, ``weights`` and ``weights_sha256``, ``transform``
(JSON), ``torch_version``, ``torchvision_version``, ``labels_sha256`` (the labels file it was
built from), ``featcache_version``, ``created``, and any extra provenance the writer passes.
A file is only ever written whole through :func:`~featcache.data.featurewrite.write_features`
(atomic rename, after an up-front check that the disk can hold it), so a file under the final
name is complete; stage one keeps its in-progress work elsewhere. Features are stored in chunks of 1024 rows, so a
block of consecutive rows is one sequential read. Each chunk of every numeric dataset carries a
Fletcher32 checksum, checked by HDF5 when the chunk is read (:func:`featcache.hdf5.read_checked`
names the rows of a chunk that fails and the command that makes the file again); files written
before checksums have none and are read as before.

Readers: :func:`load_features` reads everything into a :class:`FeatureSet`;
:func:`open_features` checks the file and returns a :class:`FeatureFile` that reads blocks of
rows on demand (out-of-core stage two), and ``write_features`` accepts row blocks, so
neither side needs the whole file in memory.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache.data.labelfile import ImageNames, LabelSet
from featcache.errors import InputError, plural
from featcache.fileio import sha256_file
from featcache.hdf5 import DatasetSpec, decode_attrs, format_version, read_checked, read_layout
from featcache.paths import cache_root, feature_file_tag, features_files_in

FORMAT = "featcache-features"
FORMAT_VERSION = 1
OFFICIAL_SPLITS = ("train", "test")
SPATIAL = "spatial"
#: the datasets of a features file, their kinds and shapes (checked when it is opened)
_ROWS = "a features file holds one row of features per image (rows, width)"
LAYOUT = {
    "train/features": DatasetSpec("float", ("training images", "features per image"), rule=_ROWS),
    "train/images": DatasetSpec("text", ("training images",)),
    "train/bad": DatasetSpec("number", ("training images",)),
    "test/features": DatasetSpec("float", ("test images", "features per image"), rule=_ROWS),
    "test/images": DatasetSpec("text", ("test images",)),
    "test/bad": DatasetSpec("number", ("test images",)),
    "text/embeddings": DatasetSpec("float", ("classes", "text embedding width"), optional=True),
    "text/classes": DatasetSpec("text", ("classes",), optional=True),
    "train/crops": DatasetSpec("float", ("training images", "tiles", "crop embedding width"),
                               optional=True),
}


@dataclass
class FeatureSet:
    """Features of the official train and test splits, aligned with a labels file."""

    train: np.ndarray
    test: np.ndarray
    train_bad: np.ndarray
    test_bad: np.ndarray
    attrs: dict = field(default_factory=dict)
    path: Path | None = None
    sha256: str | None = None

    @property
    def dim(self) -> int:
        return int(self.train.shape[1])

    @property
    def backbone(self) -> str:
        return str(self.attrs.get("backbone", "unknown"))

    def official(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(features, bad-row mask) of the official ``train`` or ``test`` split."""
        if name == "train":
            return self.train, self.train_bad
        if name == "test":
            return self.test, self.test_bad
        raise InputError(f"unknown official split {name!r}; choose train or test")


@dataclass
class TextEmbeddings:
    """A features file's class-prompt embeddings: (L, E) float32, L2-normalised."""

    embeddings: np.ndarray
    classes: list[str]
    attrs: dict


def read_text_embeddings(path: str | os.PathLike) -> TextEmbeddings | None:
    """The class-prompt embeddings of a finished features file, or None when it has none."""
    path = Path(path)
    attrs = read_feature_attrs(path)
    with h5py.File(path, "r") as h5:
        if "text/embeddings" not in h5:
            return None
        embeddings = read_checked(h5["text/embeddings"], path,
                                  remake_features(features_command(path, attrs), attrs))
        return TextEmbeddings(embeddings.astype(np.float32),
                              list(h5["text/classes"].asstr()[()]), dict(attrs.get("text") or {}))


def vision_language_files(folder: str | os.PathLike) -> dict[str, bool]:
    """The features files of a dataset folder that hold class-prompt text embeddings (what
    ``featcache pseudo-label`` reads), by tag, each with whether it has tile embeddings too
    (``--crops``, which the aevlp rule needs); files that cannot be opened are left out."""
    found = {}
    for path in features_files_in(Path(folder)):
        try:
            with h5py.File(path, "r") as h5:
                if "text/embeddings" in h5:
                    found[feature_file_tag(path)] = "train/crops" in h5
        except OSError:
            continue
    return found


def read_train_rows(path: str | os.PathLike, key: str, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of ``/train/<key>`` (``features`` or ``crops``) as float32."""
    with h5py.File(path, "r") as h5:
        if f"train/{key}" not in h5:
            raise InputError(f"{path} has no /train/{key}; extract it with `featcache features "
                             + ("--crops GxG`" if key == "crops" else "`"))
        attrs = decode_attrs(h5.attrs)
        remake = remake_features(features_command(path, attrs), attrs)
        return read_checked(h5[f"train/{key}"], path, remake, start, stop).astype(np.float32)


def remake_features(command: str, attrs: Mapping) -> str:
    """``make it again: `featcache features ... --overwrite``` for the features or spatial
    file made by ``command`` (:func:`features_command`; ``attrs``: its root attributes)."""
    spatial = " --spatial" if attrs.get("layout") == SPATIAL else ""
    return f"make it again: `{command}{spatial} --overwrite`"


def damaged(path: Path, exc: OSError, labels: LabelSet | None = None, what: str = "is not a "
            "readable HDF5 file") -> InputError:
    """The error for a features file HDF5 cannot read, with the fix: the import command for a
    set imported from features (known from ``labels``), else the command that made it."""
    source = labels.provenance.get("sources", [{}])[0].get("file") if labels is not None else None
    if labels is not None and labels.provenance.get("source_format") == "npz" and source:
        attrs = {"source_npz": source, "labels_dataset": labels.dataset,
                 "backbone": feature_file_tag(path)}
        fix = f"make it again: `{features_command(path, attrs)} --overwrite`"
    else:
        fix = ("make it again with the command that made it and --overwrite (`featcache "
               "features --dataset ... --overwrite` with the same --backbone, --weights and "
               "--image-size)")
    return InputError(f"{path} {what} (truncated or corrupt?): {exc}; {fix}")


def features_command(path: str | os.PathLike, attrs: Mapping) -> str:
    """The command that made the features file ``path`` (``attrs``: its root attributes), with
    the options it was made with: ``featcache features --dataset D [--backbone B] [--weights W]
    [--image-size S] ...``, or ``featcache prepare features --npz FILE --name D`` for a set
    imported from features. Callers add ``--overwrite`` or ``--spatial``."""
    path = Path(path)
    dataset = str(attrs.get("labels_dataset") or path.parent.name)
    backbone = str(attrs.get("backbone", "resnet50"))
    root = path.parent.parent
    cache = ([] if root.resolve() == cache_root().resolve() else ["--cache", str(root)])
    if attrs.get("source_npz"):
        words = ["prepare", "features", "--npz", str(attrs["source_npz"]), "--name", dataset,
                 *(["--backbone", backbone] if backbone != "imported" else [])]
        return shlex.join(["featcache", *words, *cache])
    words = ["features", "--dataset", dataset,
             *(["--backbone", backbone] if backbone != "resnet50" else [])]
    weights = attrs.get("weights")
    if weights == "file":  # a checkpoint file: its name is all the features file keeps
        words += ["--weights", str(attrs.get("weights_file") or "CHECKPOINT")]
    elif weights not in (None, "", "none") and not (backbone == "resnet50"
                                                  and weights == "IMAGENET1K_V1"):
        words += ["--weights", str(weights)]
    if attrs.get("image_size"):
        words += ["--image-size", str(attrs["image_size"])]
    if path.stem.endswith("-protocol"):
        words += ["--preprocess", "protocol"]
    if attrs.get("dtype") == "float16" and attrs.get("layout") != SPATIAL:
        words += ["--dtype", "float16"]
    return shlex.join(["featcache", *words, *cache])


def read_feature_attrs(path: str | os.PathLike) -> dict:
    """The root attributes of a features file (JSON strings decoded); validates the format."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"features file {path} does not exist; run `featcache features` first")
    try:
        with h5py.File(path, "r") as h5:
            return _attrs(path, h5)
    except OSError as exc:
        raise damaged(path, exc) from exc


def load_features(path: str | os.PathLike, labels: LabelSet | None = None) -> FeatureSet:
    """Read a finished features file; with ``labels``, check that it was built from them.

    Errors name the file and what is wrong: not finished, built from another labels file,
    row counts or image lists that differ, NaN or Inf in rows not flagged as bad.
    """
    with open_features(path, labels) as file:
        arrays = {name: file.read(name) for name in OFFICIAL_SPLITS}
        for name in OFFICIAL_SPLITS:
            file.check_finite(name, arrays[name])
        return FeatureSet(
            train=arrays["train"], test=arrays["test"], train_bad=file.bad["train"],
            test_bad=file.bad["test"], attrs=file.attrs, path=file.path, sha256=file.sha256,
        )


@dataclass
class FeatureFile:
    """A finished features file, checked against its labels, whose rows are read on demand.

    What out-of-core training uses instead of :class:`FeatureSet`: the metadata, the bad-row
    flags and the sha256 are read when it is opened; features only by :meth:`read` (one
    contiguous block of rows per call, a sequential read). The HDF5 handle is opened lazily
    in each process (handles do not survive ``fork``) and closed by :meth:`close`.
    """

    path: Path
    attrs: dict
    sha256: str | None
    shapes: dict[str, tuple[int, int]]
    dtype: np.dtype
    bad: dict[str, np.ndarray]
    chunk_rows: int  # height of the features datasets' HDF5 chunks (a good read block)
    command: str  # the command that made it (:func:`features_command`)
    _handle: h5py.File | None = field(default=None, repr=False)
    _pid: int | None = field(default=None, repr=False)

    @property
    def dim(self) -> int:
        return int(self.shapes["train"][1])

    @property
    def backbone(self) -> str:
        return str(self.attrs.get("backbone", "unknown"))

    @property
    def spatial_shape(self) -> tuple[int, int, int] | None:
        """(H, W, D) of a spatial file (row i reshapes to H x W x D, C order), None when pooled."""
        return spatial_shape(self.path, self.attrs, self.dim)

    @property
    def remake(self) -> str:
        """The advice that makes the file again (``make it again: `...```)."""
        return remake_features(self.command, self.attrs)

    def rows(self, name: str) -> int:
        """Rows of the official split ``name``."""
        return int(self.shapes[name][0])

    def read(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the official split ``name`` at the file's dtype."""
        if name not in OFFICIAL_SPLITS:
            raise InputError(f"unknown official split {name!r}; choose train or test")
        try:
            return read_checked(self._h5()[name]["features"], self.path, self.remake, start, stop)
        except OSError as exc:
            raise damaged(self.path, exc, what="could not be read") from exc

    def check_finite(self, name: str, array: np.ndarray | None = None, start: int = 0,
                     block_rows: int = 65536) -> None:
        """Refuse NaN or Inf in rows not flagged as bad (in ``array``, rows ``start`` on, or
        reading the whole split block by block), naming the rows."""
        if array is None:
            for first in range(0, self.rows(name), block_rows):
                self.check_finite(name, self.read(name, first, first + block_rows), first)
            return
        finite = np.isfinite(array).all(axis=1)
        broken = np.flatnonzero(~finite & ~self.bad[name][start:start + len(array)]) + start
        if broken.size:
            shown = ", ".join(str(r) for r in broken[:5])
            raise InputError(
                f"{self.path}: {plural(broken.size, f'{name} row holds', f'{name} rows hold')} NaN "
                f"or Inf features ({'row' if broken.size == 1 else 'rows'} {shown}"
                f"{', …' if broken.size > 5 else ''}); {self.remake}"
            )

    def _h5(self) -> h5py.File:
        if self._handle is None or self._pid != os.getpid():
            self._handle, self._pid = h5py.File(self.path, "r"), os.getpid()
        return self._handle

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle = self._pid = None

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:  # a handle is never pickled
        return {**self.__dict__, "_handle": None, "_pid": None}


def open_features(path: str | os.PathLike, labels: LabelSet | None = None) -> FeatureFile:
    """Open and check a finished features file without reading its features.

    With ``labels``, checks that it was built from them (sha256, row counts, image lists);
    errors name the file and what is wrong.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"features file {path} does not exist; run `featcache features` first")
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise damaged(path, exc, labels) from exc
    with h5:
        attrs = _attrs(path, h5)
        command = features_command(path, attrs)
        if labels is not None and labels.sha256 is not None and attrs.get("labels_sha256") != labels.sha256:
            raise InputError(_other_labels_message(path, h5, attrs, labels, command))
        try:
            flags = read_layout(h5, LAYOUT, path, remake_features(command, attrs),
                                [f"{name}/bad" for name in OFFICIAL_SPLITS])
            if labels is not None:
                for name in OFFICIAL_SPLITS:
                    part = labels.test if name == "test" else labels.train
                    _check_images(path, name, h5[name]["images"], part.images, labels.path)
        except KeyError as exc:
            raise InputError(f"{path} is missing a required key: {exc}") from exc
        except OSError as exc:
            raise damaged(path, exc, labels, "could not be read") from exc
        datasets = [h5[name]["features"] for name in OFFICIAL_SPLITS]
        shapes = {name: (int(d.shape[0]), int(d.shape[1]))
                  for name, d in zip(OFFICIAL_SPLITS, datasets, strict=True)}
        chunk_rows = max(d.chunks[0] if d.chunks else 1024 for d in datasets)
        dtype = datasets[-1].dtype
    spatial_shape(path, attrs, shapes["train"][1])
    return FeatureFile(path=path, attrs=attrs, sha256=sha256_file(path), shapes=shapes,
                       dtype=np.dtype(dtype), chunk_rows=int(chunk_rows), command=command,
                       bad={name: flags[f"{name}/bad"].astype(bool) for name in OFFICIAL_SPLITS})


def _check_images(path: Path, name: str, images: h5py.Dataset, expected, labels_path) -> None:
    """The features file's image paths of split ``name`` are the labels file's, row by row
    (compared a block at a time: a million paths never held at once)."""
    if len(images) != len(expected):
        raise InputError(
            f"{path}: /{name} has {plural(len(images), 'row')} but {labels_path} has "
            f"{plural(len(expected), f'{name} image')} (class count or split mismatch?)")
    for start in range(0, len(expected), ImageNames.BLOCK):
        stop = min(start + ImageNames.BLOCK, len(expected))
        ours = np.asarray(images.asstr()[start:stop], dtype=object)
        theirs = np.asarray(expected[start:stop], dtype=object)
        differ = np.flatnonzero(ours != theirs)
        if differ.size:
            row = differ[0]
            raise InputError(f"{path}: /{name} row {start + row} is {ours[row]!r} but the labels "
                             f"file has {theirs[row]!r}")


def _other_labels_message(path: Path, h5: h5py.File, attrs: dict, labels: LabelSet,
                          command: str) -> str:
    """Why a features file (made by ``command``) does not belong to ``labels``, and what to
    do: features of another dataset, of other images, or of the same images whose labels were
    prepared again."""
    built_for = attrs.get("labels_dataset")
    redo = f"`{command} --overwrite`"
    if built_for and built_for != labels.dataset:
        return (f"{path} holds features of dataset {built_for!r}, not of {labels.dataset!r} "
                f"({labels.path}); use the features of {labels.dataset!r} (extract them with "
                f"`featcache features --dataset {labels.dataset}`), or pass --dataset {built_for}")
    try:
        same_images = all(
            np.array_equal(h5[name]["images"].asstr()[()].astype(object),
                           (labels.test if name == "test" else labels.train).images)
            for name in OFFICIAL_SPLITS)
    except (KeyError, OSError, ValueError):
        same_images = False
    if same_images:
        return (f"{labels.path} was prepared again after {path} was extracted (the same images, "
                "other labels: another seed, observation or class list); featcache ties features "
                f"to the labels file they were made for: run {redo}, or put back the labels file "
                f"with sha256 {str(attrs.get('labels_sha256'))[:12]}…")
    return (f"{path} was extracted for other images than those of {labels.path} (its labels "
            f"file had sha256 {str(attrs.get('labels_sha256'))[:12]}…, this one "
            f"{str(labels.sha256)[:12]}…: images added, dropped or reordered since); run {redo}")


def spatial_shape(path, attrs: dict, width: int) -> tuple[int, int, int] | None:
    """(H, W, D) of a spatial features file, None for a pooled one (no ``layout``); InputError
    when the attributes do not describe rows of ``width`` values."""
    layout, shape = attrs.get("layout"), attrs.get("spatial_shape")
    if layout is None and shape is None:
        return None
    if layout != SPATIAL:
        raise InputError(f"{path}: attribute layout is {layout!r}; a features file is pooled (no "
                         f"layout) or {SPATIAL!r}")
    try:
        height, cols, depth = (int(v) for v in (() if shape is None else shape))
    except (TypeError, ValueError):
        raise InputError(f"{path}: a spatial file needs spatial_shape = [H, W, D], got "
                         f"{shape!r}") from None
    if min(height, cols, depth) < 1 or height * cols * depth != int(width):
        raise InputError(f"{path}: spatial_shape {[height, cols, depth]} holds "
                         f"{height * cols * depth} values per image but its rows are {width} wide; "
                         "the file is damaged or was written by another tool: re-extract it with "
                         "`featcache features --spatial --overwrite`")
    return height, cols, depth


def _attrs(path: Path, h5: h5py.File) -> dict:
    if h5.attrs.get("format") != FORMAT:
        raise InputError(f"{path} is not a featcache features file (attribute 'format' is "
                         f"{h5.attrs.get('format')!r}, expected {FORMAT!r})")
    if format_version(h5.attrs) != FORMAT_VERSION:
        raise InputError(f"{path} has features format version {h5.attrs.get('format_version')}; "
                         f"this featcache reads version {FORMAT_VERSION}")
    if not bool(h5.attrs.get("complete", False)):
        raise InputError(f"{path} is not a finished features file; run `featcache features` "
                         "again to finish it")
    return decode_attrs(h5.attrs)
