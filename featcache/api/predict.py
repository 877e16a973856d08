"""``featcache predict``: a trained run's probabilities for a features file or for images.

Inputs (:func:`read_features_input`): a featcache features file (``features-<tag>.h5``; its
rows are its images, official train then test, rows flagged bad left out with a warning), or
an array file: ``.npy`` (one 2-D array) or ``.npz`` with ``X`` (optional ``ids`` or
``images`` naming the rows, ``classes`` or ``label_names`` naming the classes it was labelled
with) or a feature set's ``X_train`` / ``X_test``. :func:`check_input` refuses an input that
does not fit the run: another width, another backbone, weights or image transform, or labels
of other classes.

Outputs (:func:`write_predictions`): CSV, ``image`` then one probability column per class
(plus ``labels`` with ``--top-k`` / ``--threshold`` / ``--sets``), or JSON lines, one object per
row.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from featcache.data.featurefile import load_features
from featcache.data.formats.npz import check_feature_matrix, load_numpy, npz_array, open_npz
from featcache.data.labelfile import load_labels
from featcache.errors import FeatcacheWarning, InputError, OptionError, plural
from featcache.fileio import atomic_output, sha256_file
from featcache.tables import csv_text

FORMATS = ("csv", "jsonl")


@dataclass
class FeaturesInput:
    """Rows of features to score: their names, the array, and what the file says of itself."""

    path: Path
    ids: list[str]
    features: np.ndarray
    classes: list[str] | None = None  # the classes its labels name, when it has any
    identity: dict = field(default_factory=dict)  # backbone, weights, transform (.h5 files)


def read_features_input(path: str | Path, split: str = "all") -> FeaturesInput:
    """Read a features file or an array file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"features file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".h5", ".hdf5"):
        return _read_featcache(path, split)
    if suffix == ".npy":
        array = load_numpy(path, ".npy array")
        if not isinstance(array, np.ndarray):
            raise InputError(f"{path} is a .npz archive under a .npy name; rename it to .npz")
        return FeaturesInput(path, [f"row/{i:06d}" for i in range(len(array))],
                             check_feature_matrix(path, "the array", array))
    if suffix == ".npz":
        return _read_npz(path, split)
    raise InputError(f"{path}: give a featcache features file (.h5) or a .npy / .npz array")


def _read_featcache(path: Path, split: str) -> FeaturesInput:
    features = load_features(path)
    ids, parts = [], []
    for name in _splits(split):
        array, bad = features.official(name)
        with h5py.File(path, "r") as h5:
            images = list(h5[name]["images"].asstr()[()])
        if bad.any():
            left = [images[i] for i in np.flatnonzero(bad)]
            warnings.warn(f"{path}: {plural(len(left), f'{name} row is', f'{name} rows are')} flagged as unreadable images and "
                          f"left out (first: {', '.join(left[:3])})", FeatcacheWarning,
                          stacklevel=3)
        ids += [image for image, flagged in zip(images, bad, strict=True) if not flagged]
        parts.append(array[~bad])
    attrs = features.attrs
    identity = {key: attrs.get(key) for key in ("backbone", "weights", "weights_sha256",
                                                "image_size", "transform")}
    return FeaturesInput(path, ids, np.concatenate(parts).astype(np.float32),
                         _labels_classes(path, attrs.get("labels_sha256")), identity)


def _labels_classes(path: Path, sha256: str | None) -> list[str] | None:
    """The classes of the labels file a features file was built from (beside it), if found."""
    labels = path.parent / "labels.h5"
    if sha256 and labels.is_file() and sha256_file(labels) == sha256:
        return list(load_labels(labels).classes)
    return None


def _read_npz(path: Path, split: str) -> FeaturesInput:
    with open_npz(path) as npz:
        keys = set(npz.files)
        if "X" in keys:
            array = check_feature_matrix(path, "X", npz_array(npz, "X", path))
            names = next((npz_array(npz, k, path) for k in ("ids", "images") if k in keys), None)
            ids = ([str(n) for n in names] if names is not None
                   else [f"row/{i:06d}" for i in range(len(array))])
            if len(ids) != len(array):
                raise InputError(f"{path}: ids names {plural(len(ids), 'row')} but X has {len(array)}")
        elif {"X_train", "X_test"} & keys:
            parts = [(name, check_feature_matrix(path, f"X_{name}",
                                                 npz_array(npz, f"X_{name}", path)))
                     for name in _splits(split) if f"X_{name}" in keys]
            array = np.concatenate([a for _, a in parts])
            ids = [f"{name}/{i:06d}" for name, a in parts for i in range(len(a))]
        else:
            raise InputError(f"{path} holds no X array (keys: {', '.join(sorted(keys))}); "
                             "store the features as X")
        labels = next((npz_array(npz, k, path) for k in ("classes", "label_names") if k in keys),
                      None)
    classes = None if labels is None else [str(c) for c in np.asarray(labels).reshape(-1)]
    return FeaturesInput(path, ids, array, classes)


def _splits(split: str) -> tuple[str, ...]:
    if split not in ("all", "train", "test"):
        raise OptionError(f"--split {split!r}: choose all, train or test")
    return ("train", "test") if split == "all" else (split,)


def check_input(run, given: FeaturesInput, other_classes: bool = False) -> None:
    """Refuse ``given`` when it does not fit ``run`` (width, backbone and weights, transform,
    classes), with the reason and what to do."""
    where = f"run {run.path}"
    if run.stage == "finetune" and given.identity:
        raise InputError(f"{where} is fine-tuned: its head sits on its own fine-tuned network, "
                         f"not on the cached features of {given.path}; predict from images")
    if given.features.shape[1] != run.feature_dim:
        raise InputError(f"{given.path} holds {given.features.shape[1]}-d features but {where} "
                         f"takes {run.feature_dim}-d {run.backbone} features")
    identity = given.identity
    if identity:
        about = run.about
        for key, what in (("backbone", "another backbone"), ("weights_sha256", "other weights")):
            if identity.get(key) != about.get(key):
                raise InputError(
                    f"{given.path} holds {identity.get('backbone')} features of "
                    f"{identity.get('weights')} weights (sha256 "
                    f"{str(identity.get('weights_sha256'))[:12]}…), but {where} was trained on "
                    f"{about.get('backbone')} features of {about.get('weights')} weights (sha256 "
                    f"{str(about.get('weights_sha256'))[:12]}…): {what}. Extract "
                    "features with the run's backbone and weights, or pass the images")
        if about.get("transform") and identity.get("transform") != about.get("transform"):
            raise InputError(f"{given.path} was extracted with another image transform "
                             f"({identity.get('transform')}) than {where}'s features "
                             f"({about.get('transform')})")
    if given.classes is not None and given.classes != run.classes and not other_classes:
        raise InputError(f"{given.path} is labelled with classes {_short(given.classes)} but "
                         f"{where} predicts {_short(run.classes)}: wrong run for this data? "
                         "Pass --other-classes to score it anyway")


def _short(names: Sequence[str]) -> str:
    shown = ", ".join(names[:6])
    return f"[{shown}{', ...' if len(names) > 6 else ''}] ({len(names)})"


# ---------------------------------------------------------------------- output
def chosen_labels(probs: np.ndarray, classes: Sequence[str], top_k: int | None,
                  threshold: float | None) -> list[list[tuple[str, float]]]:
    """Per row, the classes kept by ``top_k`` and/or ``threshold``, most probable first."""
    out = []
    for row in probs:
        order = np.argsort(-row, kind="stable")
        if top_k is not None:
            order = order[:top_k]
        out.append([(classes[i], float(row[i])) for i in order
                    if threshold is None or row[i] >= threshold])
    return out


def set_labels(probs: np.ndarray, classes: Sequence[str],
               sets: np.ndarray) -> list[list[tuple[str, float]]]:
    """Per row, the classes of its label set (``sets``: bool (n, L)), most probable first."""
    out = []
    for row, members in zip(probs, np.asarray(sets, dtype=bool), strict=True):
        order = np.argsort(-row, kind="stable")
        out.append([(classes[i], float(row[i])) for i in order if members[i]])
    return out


def prediction_text(ids: Sequence[str], probs: np.ndarray, classes: Sequence[str],
                    fmt: str = "csv", top_k: int | None = None,
                    threshold: float | None = None, sets: np.ndarray | None = None) -> str:
    """CSV (``image``, a probability column per class, ``labels`` when filtering) or JSON
    lines (``{"image", "probabilities"}``, or ``{"image", "labels": [{"class", "probability"}]}``
    when filtering); ``sets`` (bool (n, L), e.g. conformal label sets) filters like them."""
    if fmt not in FORMATS:
        raise OptionError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if top_k is not None and top_k < 1:
        raise OptionError(f"--top-k must be at least 1, got {top_k}")
    if sets is not None and (top_k is not None or threshold is not None):
        raise OptionError("label sets choose each row's labels themselves: give --sets without "
                          "--top-k and --threshold")
    filtering = top_k is not None or threshold is not None
    kept = chosen_labels(probs, classes, top_k, threshold) if filtering else None
    if sets is not None:
        kept = set_labels(probs, classes, sets)
    out = io.StringIO()
    if fmt == "csv":
        header = ["image", *classes] + (["labels"] if kept is not None else [])
        return csv_text([header] + [
            [name, *(f"{p:.6g}" for p in row)]
            + ([";".join(c for c, _ in kept[i])] if kept is not None else [])
            for i, (name, row) in enumerate(zip(ids, probs, strict=True))])
    for i, (name, row) in enumerate(zip(ids, probs, strict=True)):
        record = ({"image": name, "labels": [{"class": c, "probability": p} for c, p in kept[i]]}
                  if kept is not None else
                  {"image": name, "probabilities": {c: float(p) for c, p in zip(classes, row,
                                                                                 strict=True)}})
        out.write(json.dumps(record) + "\n")
    return out.getvalue()


def write_text(text: str, out: str, overwrite: bool = False) -> None:
    """``text`` to stdout (``-``) or atomically to a file (refusing one that exists)."""
    if out == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with atomic_output(Path(out), overwrite=overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")


def guess_format(out: str, fmt: str | None) -> str:
    """``--format``, else from the output's ending (``.jsonl``/``.json``: JSON lines), else CSV."""
    if fmt is not None:
        return fmt
    return "jsonl" if Path(out).suffix.lower() in (".jsonl", ".json", ".ndjson") else "csv"
