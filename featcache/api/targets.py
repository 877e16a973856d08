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

from featcache.data.classnames import code_points, same_text
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
    if y.ndim == 1:
        _check_label_values(y)
    kind = type_of_target(y, input_name="y")
    if y.ndim == 1:
        if kind not in ("binary", "multiclass"):
            raise ValueError(f"Unknown label type: {kind!r}. SPMLClassifier takes class labels "
                             "(ints or strings: the observed positive of each row) or a label "
                             f"matrix (n_samples, n_classes) of {MATRIX_VALUES}")
        names = _label_classes(y, classes)
        _check_several(names)
        return Target(LABELS, one_hot(y, names, "y"), names, np.ones(len(y), dtype=bool))
    if y.ndim != 2:
        raise ValueError(f"y must be class labels (n_samples,) or a label matrix "
                         f"(n_samples, n_classes); got shape {y.shape}")
    matrix = label_matrix(y, "y", (-1, 0, 1))
    names = _matrix_classes(matrix.shape[1], classes, column_names)
    _check_several(names)
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
    _warn_several_positives(matrix)
    return Target(MATRIX, matrix[~empty], names, ~empty)


def _warn_several_positives(matrix: np.ndarray) -> None:
    """A label matrix with several positives a row and no observed negative is most likely
    full labels (0 meaning absent), which a label matrix reads as several observed positives
    and the rest unobserved: not single-positive learning. Said once, with the two fixes."""
    several = int(((matrix == 1).sum(axis=1) > 1).sum())
    if several == 0 or (matrix == -1).any():
        return
    warnings.warn(
        f"y has several positives in {several} of {plural(len(matrix), 'row')} and no observed "
        "negative: full labels? A label matrix's 1 entries are observed positives and its 0 "
        "entries unobserved, so this trains on every positive, which is not single-positive "
        "learning. To learn from single positives, observe one a row and give the full labels "
        "as y_full: fit(X, observe_uniform(Y), y_full=Y) with "
        "featcache.data.sampling.observe_uniform (the protocol's sampler); if the rows really "
        "have several observed positives, this warning can be ignored", FeatcacheWarning,
        stacklevel=4)


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


def targets_for(y, classes: np.ndarray, name: str, rows: int,
                columns_follow_classes: bool = True) -> np.ndarray:
    """Evaluation labels as an (n, L) matrix: class labels (the observed positives), or a
    label matrix whose 1 entries are the positives.

    A matrix's columns must be matched to ``classes``: a DataFrame's by their names (put in
    ``classes`` order), a plain matrix's by position, which is refused unless
    ``columns_follow_classes`` (the estimator knows its column order: it was fitted on a matrix,
    given ``classes=``, or its classes are 0 .. L - 1): after class labels, ``classes_`` is
    their sorted order, not a matrix's."""
    if np.ndim(y) == 1:
        y = _dense(y)
        if len(y) != rows:
            raise ValueError(f"{name} has {plural(len(y), 'label')} but its features have "
                             f"{plural(rows, 'row')}")
        return one_hot(y, classes, name)
    return class_matrix(y, classes, name, (-1, 0, 1), rows, columns_follow_classes)


def class_matrix(y, classes: np.ndarray, name: str, allowed: tuple[int, ...], rows: int,
                 columns_follow_classes: bool = True) -> np.ndarray:
    """A label matrix whose columns are matched to ``classes`` (see :func:`targets_for`), as
    an int8 (n, L) matrix of ``allowed`` values."""
    column_names = list(y.columns) if hasattr(y, "columns") else None
    y = _dense(y)
    if column_names is not None and y.ndim == 2:
        y = y[:, _column_order(column_names, classes, name)]
    elif not columns_follow_classes:
        raise ValueError(f"{name} is a label matrix without column names, but the classifier "
                         f"was fitted on class labels: classes_ {_short(classes)} are their "
                         "sorted order, which need not be the matrix's column order. Pass "
                         f"{name} as a DataFrame whose columns name the classes, or as class "
                         "labels, or fit with classes=[...] in the matrix's column order")
    return label_matrix(y, name, allowed, rows=rows, classes=len(classes))


def _column_order(column_names: list, classes: np.ndarray, name: str) -> list[int]:
    """The position of each class of ``classes`` among a DataFrame's columns."""
    position = {str(column): i for i, column in enumerate(column_names)}
    wanted = [str(c) for c in classes.tolist()]
    missing = [c for c in wanted if c not in position]
    extra = [c for c in position if c not in set(wanted)]
    if missing or extra or len(position) != len(column_names):
        raise ValueError(f"{name}'s columns {_short(np.asarray(column_names))} are not the "
                         f"classes {_short(classes)}"
                         + (f": missing {_short(np.asarray(missing))}" if missing else "")
                         + (f", unknown {_short(np.asarray(extra))}" if extra else ""))
    return [position[c] for c in wanted]


def _check_label_values(y: np.ndarray) -> None:
    """Class labels that are all of one kind (ints or strings), none missing."""
    if y.dtype != object:
        return
    missing = [row for row, label in enumerate(y.tolist())
               if label is None or (isinstance(label, float) and label != label)]
    if missing:
        raise ValueError(f"y row {missing[0]} holds {y[missing[0]]!r}: every row needs its "
                         f"observed positive ({plural(len(missing), 'row')} without one); "
                         "leave those rows out, or give a label matrix whose all-0 rows are "
                         "left out with a warning")
    kinds = {"string" if isinstance(label, str) else
             "number" if isinstance(label, (int, float, np.number)) else type(label).__name__
             for label in y.tolist()}
    if len(kinds) > 1:
        raise ValueError(f"y mixes labels of the kinds {', '.join(sorted(kinds))}: give every "
                         "row's label as the same kind (all strings, or all ints)")


def _check_several(classes: np.ndarray) -> None:
    """One class is refused, as scikit-learn's classifiers refuse it: every row would be
    positive for it, and its mAP 100 by construction."""
    if len(classes) < 2:
        raise ValueError(f"y holds only one class ({_short(classes)}): a classifier needs at "
                         "least 2 classes (with one, every row is positive and mAP is 100 by "
                         "construction)")


def _dense(y) -> np.ndarray:
    if scipy.sparse.issparse(y):
        return y.toarray()
    return np.asarray(y)


def _check_names(names, what: str) -> None:
    """Class names a classifier can keep: each a string or a number (not None, NaN, a tuple
    of a MultiIndex column), told apart as text and once put in Unicode's composed form."""
    for index, name in enumerate(list(names)):
        if isinstance(name, (str, np.str_)) or (isinstance(name, (int, float, np.number))
                                                and not isinstance(name, (bool, np.bool_))
                                                and np.isfinite(name)):
            continue
        raise ValueError(f"{what} {index} is {name!r}: a class name is a string or a number; "
                         "name every class (a DataFrame's columns: df.columns = [...], a "
                         "MultiIndex flattened first)")
    texts = [str(name) for name in names]
    if len(set(texts)) != len(texts):
        seen: set[str] = set()
        twice = next(t for t in texts if t in seen or seen.add(t))  # type: ignore[func-returns-value]
        raise ValueError(f"{what}s name the class {twice!r} twice (as text): name each class once")
    same = same_text(texts)
    if same is not None:
        raise ValueError(f"{what}s {same[0]!r} ({code_points(same[0])}) and {same[1]!r} "
                         f"({code_points(same[1])}) are the same text in two Unicode spellings "
                         "(NFC and NFD): write them alike (unicodedata.normalize('NFC', name))")


def _label_classes(y: np.ndarray, classes) -> np.ndarray:
    if classes is None:
        names = np.unique(y)
        _check_names(names.tolist(), "y's class label")
        return names
    if not isinstance(classes, np.ndarray):
        _check_names(list(classes), "classes entry")
    names = np.asarray(classes)
    if names.ndim != 1 or len(names) == 0:
        raise ValueError(f"classes must be a non-empty list of labels, got {classes!r}")
    if len(np.unique(names)) != len(names):
        raise ValueError(f"classes names a label twice: {_short(names)}")
    return names


def _matrix_classes(width: int, classes, column_names) -> np.ndarray:
    if column_names is not None:
        _check_names(column_names, "y's column")
    if classes is not None:
        if not isinstance(classes, np.ndarray):
            _check_names(list(classes), "classes entry")
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
