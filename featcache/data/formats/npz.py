"""Precomputed feature sets in one ``.npz`` file (as in ``shared/data/*/*.npz``).

Keys: ``X_train``, ``X_test`` (float features, one row per example), ``Y_train``, ``Y_test``
(0/1 multi-hot labels) and ``label_names``; ``feature_names`` is optional. There are no images:
rows get the synthetic ids ``train/000017`` and ``test/000004`` (the row in the file), which
stay attached to a row when others are dropped.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from featcache.data.formats import SourceDataset, SourceSplit, first_few, require_file
from featcache.errors import InputError, plural

REQUIRED_KEYS = ("X_train", "X_test", "Y_train", "Y_test", "label_names")


def read_npz(path: str | os.PathLike, name: str) -> tuple[SourceDataset, dict[str, np.ndarray]]:
    """The labels of an npz feature set as a dataset, and its features per official split."""
    path = require_file(path, "feature file")
    with open_npz(path) as npz:
        missing = [key for key in REQUIRED_KEYS if key not in npz.files]
        if missing:
            hint = (" (label_names: one class name per column of Y_train, e.g. "
                    "label_names=np.array(['cat', 'dog', ...]))" if "label_names" in missing else "")
            raise InputError(f"{path} lacks the {'key' if len(missing) == 1 else 'keys'} {', '.join(missing)}{hint}; a feature set "
                             f"needs {', '.join(REQUIRED_KEYS)} (feature_names optional); it "
                             f"holds {', '.join(sorted(npz.files)) or 'no arrays'}")
        arrays = {key: npz_array(npz, key, path) for key in REQUIRED_KEYS}
        feature_names = (npz_array(npz, "feature_names", path)
                         if "feature_names" in npz.files else None)
    classes = [str(label) for label in np.asarray(arrays["label_names"]).reshape(-1)]
    features, splits = {}, {}
    for split in ("train", "test"):
        x, y = arrays[f"X_{split}"], arrays[f"Y_{split}"]
        features[split] = check_feature_matrix(path, f"X_{split}", x)
        splits[split] = SourceSplit(
            [f"{split}/{row:06d}" for row in range(len(x))],
            _check_labels(path, split, y, len(x), len(classes)),
        )
    if features["train"].shape[1] != features["test"].shape[1]:
        raise InputError(f"{path}: X_train has {features['train'].shape[1]} features per row "
                         f"but X_test has {features['test'].shape[1]}")
    if len(set(classes)) != len(classes):
        repeated = sorted({c for c in classes if classes.count(c) > 1})
        raise InputError(f"{path}: label_names repeats {first_few(repeated)}")
    if feature_names is not None and len(feature_names) != features["train"].shape[1]:
        raise InputError(f"{path}: feature_names has {plural(len(feature_names), 'name')} but the "
                         f"features have {plural(features['train'].shape[1], 'column')}")
    dataset = SourceDataset(
        name=name,
        source_format="npz",
        classes=classes,
        train=splits["train"],
        test=splits["test"],
        image_root=None,
        source_files=[path],
        details={"feature_names": 0 if feature_names is None else len(feature_names)},
    )
    return dataset, features


@contextmanager
def open_npz(path: Path) -> Iterator:
    """``np.load(path)`` without unpickling; a damaged file is one clear error."""
    npz = load_numpy(path, ".npz file")
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise InputError(f"{path} is a single .npy array, not a .npz archive of named arrays; "
                         "save it with np.savez")
    with npz:
        yield npz


def load_numpy(path: str | os.PathLike, what: str) -> Any:
    """``np.load(path)`` without unpickling (an array, or an open .npz archive). A file that is
    no NumPy file (a text file renamed ``.npz``), holds Python objects or is damaged is one
    InputError naming ``path`` and ``what`` it should be; never numpy's advice to unpickle."""
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"{path} is not a readable {what}: {numpy_reason(exc)}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable {what} (truncated or damaged?): "
                         f"{exc or type(exc).__name__}") from None


def numpy_reason(exc: ValueError) -> str:
    """Why numpy refused a file, without its advice to load it "unsafely" (unpickling a file
    can run any code it holds)."""
    text = str(exc)
    if "pickled" in text:  # numpy found neither the .npy magic nor a zip archive
        return ("it starts with neither a .npy header nor a zip archive (a text or other file "
                "under a NumPy name?); featcache reads arrays saved with np.save or np.savez")
    if "allow_pickle" in text:
        return ("it holds Python objects, which featcache does not unpickle (a file could run "
                "code that way); save a plain array, e.g. np.array(values, dtype=str) for names")
    return text


def npz_array(npz, key: str, path: Path) -> np.ndarray:
    """Array ``key`` of an open npz; one clear error when it holds Python objects (a list of
    strings saved as an object array) or is damaged."""
    try:
        return npz[key]
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise InputError(f"{path}: {key} could not be read ({exc})") from None
        raise InputError(f"{path}: {key} holds Python objects, which featcache does not unpickle "
                         f"(a file could run code that way); save it as a plain array, e.g. "
                         f"{key}=np.array(values, dtype=str) for names") from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"{path}: {key} is damaged ({exc})") from None


def check_feature_matrix(path: Path, key: str, x: np.ndarray) -> np.ndarray:
    """``x`` (array ``key`` of ``path``) as float32 rows x features; refused when it is not
    2-D, empty, not real numbers, or holds NaN or Inf (the error names the rows)."""
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"{path}: {key} has shape {x.shape}; expected (examples, features)")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise InputError(f"{path}: {key} has dtype {x.dtype}; expected real numbers")
    x = x.astype(np.float32, copy=False)
    broken = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if broken.size:
        raise InputError(f"{path}: {key} holds NaN or Inf in {plural(broken.size, 'row')} "
                         f"({'row' if broken.size == 1 else 'rows'} "
                         f"{first_few([str(r) for r in broken])}); fix or remove "
                         f"{'it' if broken.size == 1 else 'them'} first")
    return x


def _check_labels(path: Path, split: str, y: np.ndarray, rows: int, classes: int) -> np.ndarray:
    key = f"Y_{split}"
    if y.ndim != 2:
        raise InputError(f"{path}: {key} has shape {y.shape}; expected (examples, classes)")
    if y.shape[0] != rows:
        raise InputError(f"{path}: {key} has {plural(y.shape[0], 'row')} but X_{split} has {rows}")
    if y.shape[1] != classes:
        raise InputError(f"{path}: {key} has {plural(y.shape[1], 'column')} but label_names names "
                         f"{plural(classes, 'class', 'classes')}")
    bad = np.argwhere((y != 0) & (y != 1))
    if bad.size:
        row, col = bad[0]
        raise InputError(f"{path}: {key} row {row}, column {col} holds {y[row, col].item()!r}; labels "
                         f"must be 0 or 1 ({plural(len(bad), 'entry is', 'entries are')} not)")
    return y.astype(np.uint8)
