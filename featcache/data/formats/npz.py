"""Precomputed feature sets in one ``.npz`` file (as in ``shared/data/*/*.npz``).

Keys: ``X_train``, ``X_test`` (float features, one row per example), ``Y_train``, ``Y_test``
(0/1 multi-hot labels) and ``label_names``; ``feature_names`` is optional. There are no images:
rows get the synthetic ids ``train/000017`` and ``test/000004`` (the row in the file), which
stay attached to a row when others are dropped.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from featcache.data.formats import SourceDataset, SourceSplit, first_few, require_file
from featcache.errors import InputError

REQUIRED_KEYS = ("X_train", "X_test", "Y_train", "Y_test", "label_names")


def read_npz(path: str | os.PathLike, name: str) -> tuple[SourceDataset, dict[str, np.ndarray]]:
    """The labels of an npz feature set as a dataset, and its features per official split."""
    path = require_file(path, "feature file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [key for key in REQUIRED_KEYS if key not in npz.files]
            if missing:
                raise InputError(f"{path} lacks the key(s) {', '.join(missing)}; a feature set "
                                 f"needs {', '.join(REQUIRED_KEYS)} (feature_names optional)")
            arrays = {key: npz[key] for key in REQUIRED_KEYS}
            feature_names = npz["feature_names"] if "feature_names" in npz.files else None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable .npz file (truncated or damaged?): {exc}") from None
    except ValueError as exc:
        raise InputError(f"{path} could not be read without unpickling objects ({exc}); store "
                         "label_names as a string array, not as Python objects") from None
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
        raise InputError(f"{path}: feature_names has {len(feature_names)} names but the "
                         f"features have {features['train'].shape[1]} columns")
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
        raise InputError(f"{path}: {key} holds NaN or Inf in {broken.size} rows (rows "
                         f"{first_few([str(r) for r in broken])}); fix or remove them first")
    return x


def _check_labels(path: Path, split: str, y: np.ndarray, rows: int, classes: int) -> np.ndarray:
    key = f"Y_{split}"
    if y.ndim != 2:
        raise InputError(f"{path}: {key} has shape {y.shape}; expected (examples, classes)")
    if y.shape[0] != rows:
        raise InputError(f"{path}: {key} has {y.shape[0]} rows but X_{split} has {rows}")
    if y.shape[1] != classes:
        raise InputError(f"{path}: {key} has {y.shape[1]} columns but label_names names "
                         f"{classes} classes")
    bad = np.argwhere((y != 0) & (y != 1))
    if bad.size:
        row, col = bad[0]
        raise InputError(f"{path}: {key} row {row}, column {col} holds {y[row, col].item()!r}; labels "
                         f"must be 0 or 1 ({len(bad)} entries are not)")
    return y.astype(np.uint8)
