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

Root attributes: ``format``, ``format_version``, ``complete`` (True only in a finished file),
``backbone``, ``feature_dim``, ``dtype``, ``weights`` and ``weights_sha256``, ``transform``
(JSON), ``torch_version``, ``torchvision_version``, ``labels_sha256`` (the labels file it was
built from), ``featcache_version``, ``created``, and any extra provenance the writer passes.
A file is only ever written whole through :func:`write_features` (atomic rename), so a file
under the final name is complete; stage one keeps its in-progress work elsewhere.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache import __version__
from featcache.data.labelfile import LabelSet
from featcache.errors import InputError
from featcache.fileio import atomic_output, sha256_file
from featcache.hdf5 import decode_attrs, encode_attr

FORMAT = "featcache-features"
FORMAT_VERSION = 1
OFFICIAL_SPLITS = ("train", "test")


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


def write_features(path: str | os.PathLike, labels: LabelSet, features: dict[str, np.ndarray],
                   attrs: dict, bad: dict[str, np.ndarray] | None = None,
                   overwrite: bool = False, dtype: str = "float32",
                   extra: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write a complete features file atomically.

    ``features`` maps ``train`` and ``test`` to arrays whose rows follow ``labels``; ``bad``
    optionally flags unreadable rows (which must hold NaN). ``attrs`` must name at least the
    ``backbone``. The labels file's sha256 is recorded so that stage two can refuse a mismatch.
    ``extra`` maps HDF5 paths (``text/embeddings``, ``train/crops``) to further arrays.
    """
    path = Path(path)
    if "backbone" not in attrs:
        raise ValueError("write_features needs attrs['backbone']")
    if labels.sha256 is None:
        raise ValueError("write_features needs a LabelSet loaded from disk (labels.sha256 unset)")
    bad = bad or {}
    dims = set()
    for name in OFFICIAL_SPLITS:
        rows = len(labels.test if name == "test" else labels.train)
        array = features[name]
        if array.ndim != 2 or array.shape[0] != rows:
            raise InputError(f"{name} features have shape {array.shape}; the labels file has "
                             f"{rows} {name} rows")
        dims.add(array.shape[1])
    if len(dims) != 1:
        raise InputError(f"train and test features differ in width: {sorted(dims)}")
    text = h5py.string_dtype("utf-8")
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    with atomic_output(path, overwrite=overwrite) as tmp, h5py.File(tmp, "w") as h5:
        h5.attrs["format"] = FORMAT
        h5.attrs["format_version"] = FORMAT_VERSION
        h5.attrs["feature_dim"] = dims.pop()
        h5.attrs["dtype"] = dtype
        h5.attrs["labels_sha256"] = labels.sha256
        h5.attrs["labels_dataset"] = labels.dataset
        h5.attrs["featcache_version"] = __version__
        h5.attrs["created"] = now
        for key, value in attrs.items():
            h5.attrs[key] = encode_attr(value)
        for name in OFFICIAL_SPLITS:
            part = labels.test if name == "test" else labels.train
            group = h5.create_group(name)
            array = np.asarray(features[name], dtype=dtype)
            group.create_dataset("features", data=array, chunks=(min(len(array), 1024), array.shape[1]))
            group.create_dataset("images", data=np.asarray(part.images, dtype=object), dtype=text)
            flags = np.zeros(len(array), dtype=np.uint8) if name not in bad else bad[name].astype(np.uint8)
            group.create_dataset("bad", data=flags)
        write_extra(h5, extra or {})
        h5.attrs["complete"] = True
    return path


def write_extra(h5: h5py.File, extra: Mapping[str, np.ndarray]) -> None:
    """Write (or replace) arrays at HDF5 paths; string arrays as utf-8."""
    for key, array in extra.items():
        if key in h5:
            del h5[key]
        array = np.asarray(array)
        if array.dtype.kind in "OUS":
            h5.create_dataset(key, data=array.astype(object), dtype=h5py.string_dtype("utf-8"))
        elif array.ndim >= 2 and array.shape[0]:
            h5.create_dataset(key, data=array, chunks=(min(len(array), 256), *array.shape[1:]))
        else:
            h5.create_dataset(key, data=array)


def add_text_embeddings(path: str | os.PathLike, embeddings: np.ndarray, classes,
                        text_attrs: dict) -> Path:
    """Add (or replace) a finished features file's class-prompt embeddings, atomically: the
    file is copied to a temporary name beside it, completed and renamed over the original."""
    path = Path(path)
    read_feature_attrs(path)
    with atomic_output(path, overwrite=True) as tmp:
        shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+") as h5:
            write_extra(h5, {"text/embeddings": np.asarray(embeddings, dtype=np.float32),
                             "text/classes": np.asarray(list(classes), dtype=object)})
            h5.attrs["text"] = encode_attr(text_attrs)
    return path


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
        return TextEmbeddings(h5["text/embeddings"][()].astype(np.float32),
                              list(h5["text/classes"].asstr()[()]), dict(attrs.get("text") or {}))


def read_train_rows(path: str | os.PathLike, key: str, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of ``/train/<key>`` (``features`` or ``crops``) as float32."""
    with h5py.File(path, "r") as h5:
        if f"train/{key}" not in h5:
            raise InputError(f"{path} has no /train/{key}; extract it with `featcache features "
                             + ("--crops GxG`" if key == "crops" else "`"))
        return h5[f"train/{key}"][start:stop].astype(np.float32)


def read_feature_attrs(path: str | os.PathLike) -> dict:
    """The root attributes of a features file (JSON strings decoded); validates the format."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"features file {path} does not exist; run `featcache features` first")
    try:
        with h5py.File(path, "r") as h5:
            return _attrs(path, h5)
    except OSError as exc:
        raise InputError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}") from exc


def load_features(path: str | os.PathLike, labels: LabelSet | None = None) -> FeatureSet:
    """Read a finished features file; with ``labels``, check that it was built from them.

    Errors name the file and what is wrong: not finished, built from another labels file,
    row counts or image lists that differ, NaN or Inf in rows not flagged as bad.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"features file {path} does not exist; run `featcache features` first")
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}") from exc
    with h5:
        attrs = _attrs(path, h5)
        if labels is not None and labels.sha256 is not None and attrs.get("labels_sha256") != labels.sha256:
            raise InputError(
                f"{path} was built from a labels file with sha256 {str(attrs.get('labels_sha256'))[:12]}…, "
                f"but {labels.path} has sha256 {labels.sha256[:12]}…; the labels changed since the "
                "features were extracted. Re-run `featcache features` (or `featcache prepare "
                "features`) for this labels file."
            )
        arrays, flags = {}, {}
        try:
            for name in OFFICIAL_SPLITS:
                group = h5[name]
                arrays[name] = group["features"][()]
                flags[name] = group["bad"][()].astype(bool)
                if labels is not None:
                    part = labels.test if name == "test" else labels.train
                    images = group["images"].asstr()[()]
                    if len(images) != len(part.images):
                        raise InputError(
                            f"{path}: /{name} has {len(images)} rows but {labels.path} has "
                            f"{len(part.images)} {name} images (class count or split mismatch?)"
                        )
                    differ = np.flatnonzero(np.asarray(images, dtype=object) != part.images)
                    if differ.size:
                        row = differ[0]
                        raise InputError(
                            f"{path}: /{name} row {row} is {images[row]!r} but the labels file "
                            f"has {part.images[row]!r}"
                        )
        except KeyError as exc:
            raise InputError(f"{path} is missing a required key: {exc}") from exc
        except OSError as exc:
            raise InputError(f"{path} could not be read (truncated or corrupt?): {exc}") from exc
    for name in OFFICIAL_SPLITS:
        finite = np.isfinite(arrays[name]).all(axis=1)
        broken = np.flatnonzero(~finite & ~flags[name])
        if broken.size:
            shown = ", ".join(str(r) for r in broken[:5])
            raise InputError(
                f"{path}: {broken.size} {name} rows hold NaN or Inf features (rows {shown}"
                f"{', …' if broken.size > 5 else ''}); re-extract them with `featcache features "
                "--overwrite`"
            )
    return FeatureSet(
        train=arrays["train"], test=arrays["test"], train_bad=flags["train"],
        test_bad=flags["test"], attrs=attrs, path=path, sha256=sha256_file(path),
    )


def _attrs(path: Path, h5: h5py.File) -> dict:
    if h5.attrs.get("format") != FORMAT:
        raise InputError(f"{path} is not a featcache features file (attribute 'format' is "
                         f"{h5.attrs.get('format')!r}, expected {FORMAT!r})")
    if int(h5.attrs.get("format_version", -1)) != FORMAT_VERSION:
        raise InputError(f"{path} has features format version {h5.attrs.get('format_version')}; "
                         f"this featcache reads version {FORMAT_VERSION}")
    if not bool(h5.attrs.get("complete", False)):
        raise InputError(f"{path} is not a finished features file; run `featcache features` "
                         "again to finish it")
    return decode_attrs(h5.attrs)
