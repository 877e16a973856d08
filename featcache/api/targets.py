"""What ``SPMLClassifier.fit`` takes as ``y``, read into featcache's observed-label matrix.

Two forms, told apart with scikit-learn's ``type_of_target``:

- **class labels** (``"labels"``): a 1-D array of ints or strings, the one observed positive
  of each row (scikit-learn's binary or multiclass target; a column vector is taken as 1-D with
  a ``DataConversionWarning``, as scikit-learn does). ``classes_`` are the labels sorted, or
  ``classes=`` in its order when some classes are never observed;
- **a label matrix** (``"matrix"``): (n, L) with 1 for an observed positive, 0 unobserved and
  -1 an observed negative (scikit-learn's multilabel-indicator target when it holds no -1).
  Rows with no observation at all (all 0) are left out with a warning, as ``featcache
  prepare`` leaves out images without a positive label.

Anything else (a continuous target, a matrix holding other values) is refused with
scikit-learn's "Unknown label type" wording.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import column_or_1d

from featcache.errors import FeatcacheWarning, plural

LABELS = "labels"
MATRIX = "matrix"
MATRIX_VALUES = "1 (observed positive), 0 (unobserved) and -1 (observed negative)"


@dataclass
class Target:
    """``y`` as read: its form, the observed matrix (n, L) int8 of the kept rows, the class
    names, and which of the given rows were kept (all but the all-zero rows of a matrix)."""

    form: str
    observed: np.ndarray
    classes: np.ndarray
    kept: np.ndarray


def read_target(y, classes=None, column_names=None) -> Target:
    """Read ``y`` (already checked by ``validate_data``: finite, one row per row of X)."""
    y = _dense(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y, warn=True)
    kind = type_of_target(y, input_name="y")
    if y.ndim == 1:
        if kind not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {kind!r}. SPMLClassifier takes class labels "
                             "(ints or strings: the observed positive of each row) or a label "
                             f"matrix (n_samples, n_classes) of {MATRIX_VALUES}")
        names = _label_classes(y, classes)
        return Target(LABELS, one_hot(y, names, "y"), names, np.ones(len(y), dtype=bool))
    if y.ndim != 2:
        raise ValueError(f"y must be class labels (n_samples,) or a label matrix "
                         f"(n_samples, n_classes); got shape {y.shape}")
    matrix = label_matrix(y, "y", (-1, 0, 1))
    names = _matrix_classes(matrix.shape[1], classes, column_names)
    empty = np.logical_not(matrix.any(axis=1))  # rows without an observed label
    if empty.all():
        raise ValueError("y has no observed label in any row (every entry is 0): nothing to "
                         "train on")
    if empty.any():
        rows = np.flatnonzero(empty)
        shown = ", ".join(map(str, rows[:5])) + (", ..." if rows.size > 5 else "")
        warnings.warn(f"y: left out {rows.size} of {plural(len(matrix), 'row')} with no observed label "
                      f"(all 0; rows {shown}), as featcache prepare leaves out images without a "
                      "positive label", FeatcacheWarning, stacklevel=4)
    return Target(MATRIX, matrix[~empty], names, ~empty)


def one_hot(labels, classes: np.ndarray, name: str) -> np.ndarray:
    """Class labels as an (n, L) int8 matrix with the observed positive of each row set."""
    labels = np.asarray(labels)
    position = {label: i for i, label in enumerate(classes.tolist())}
    found, inverse = np.unique(labels, return_inverse=True)
    inverse = inverse.reshape(-1)
    unknown = np.array([label not in position for label in found.tolist()])[inverse]
    if unknown.any():
        row = int(np.argmax(unknown))
        raise ValueError(f"{name} row {row} holds the label {labels[row].item()!r}, which is not "
                         f"among the classes {_short(classes)}")
    columns = np.array([position[label] for label in found.tolist()], dtype=np.int64)
    out = np.zeros((len(labels), len(classes)), dtype=np.int8)
    out[np.arange(len(labels)), columns[inverse]] = 1
    return out


def label_matrix(y, name: str, allowed: tuple[int, ...], rows: int | None = None,
                 classes: int | None = None) -> np.ndarray:
    """``y`` as an int8 (n, L) matrix of ``allowed`` values; the error names what is wrong
    (values outside ``allowed``: scikit-learn's "Unknown label type")."""
    y = _dense(y)
    if y.ndim != 2:
        raise ValueError(f"{name} must be a 2-D label matrix (n_samples, n_classes) with "
                         f"{MATRIX_VALUES}; got shape {y.shape}")
    if rows is not None and y.shape[0] != rows:
        raise ValueError(f"{name} has {plural(y.shape[0], 'row')} but its features have {rows}")
    if classes is not None and y.shape[1] != classes:
        raise ValueError(f"{name} has {plural(y.shape[1], 'column')} but the classifier has {plural(classes, 'class', 'classes')}")
    numeric = y.dtype.kind in "biuf"
    bad = ~np.isin(y, allowed) if numeric else np.ones(y.shape, dtype=bool)
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise ValueError(f"Unknown label type: {name} row {row}, column {column} holds "
                         f"{y[row, column].item()!r}; a label matrix may hold only "
                         f"{', '.join(map(str, allowed))}")
    return y.astype(np.int8)


def targets_for(y, classes: np.ndarray, name: str, rows: int) -> np.ndarray:
    """Evaluation labels as an (n, L) matrix: class labels (the observed positives), or a
    label matrix whose 1 entries are the positives."""
    y = _dense(y)
    if y.ndim == 1:
        if len(y) != rows:
            raise ValueError(f"{name} has {plural(len(y), 'label')} but its features have "
                             f"{plural(rows, 'row')}")
        return one_hot(y, classes, name)
    return label_matrix(y, name, (-1, 0, 1), rows=rows, classes=len(classes))


def _dense(y) -> np.ndarray:
    if scipy.sparse.issparse(y):
        return y.toarray()
    return np.asarray(y)


def _label_classes(y: np.ndarray, classes) -> np.ndarray:
    if classes is None:
        return np.unique(y)
    names = np.asarray(classes)
    if names.ndim != 1 or len(names) == 0:
        raise ValueError(f"classes must be a non-empty list of labels, got {classes!r}")
    if len(np.unique(names)) != len(names):
        raise ValueError(f"classes names a label twice: {_short(names)}")
    return names


def _matrix_classes(width: int, classes, column_names) -> np.ndarray:
    if classes is not None:
        names = np.asarray(classes)
        if names.shape != (width,):
            raise ValueError(f"classes names {plural(names.size, 'class', 'classes')} but y has "
                             f"{plural(width, 'column')}")
        if column_names is not None and list(column_names) != names.tolist():
            raise ValueError(f"classes {_short(names)} differ from y's column names "
                             f"{_short(np.asarray(column_names))}")
        return names
    if column_names is not None:
        return np.asarray(column_names)
    return np.arange(width)


def _short(names: np.ndarray) -> str:
    shown = ", ".join(repr(n) for n in names.tolist()[:6])
    return f"[{shown}{', ...' if len(names) > 6 else ''}]"
