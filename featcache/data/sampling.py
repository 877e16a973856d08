"""The protocol's seeded train/val split and single-positive observation process.

Both follow ``shared/PROTOCOL.md`` section 1 call for call, so that the same label matrix gives
bit-identical observed labels and splits to the reference code (Cole et al. 2021,
``preproc/generate_observed_labels.py`` and ``datasets.generate_split``).
"""

from __future__ import annotations

import numpy as np

from featcache.errors import InputError, plural

PROTOCOL_SEED = 1200
VAL_FRACTION = 0.2


def observe_uniform(labels: np.ndarray, num_pos: int = 1, num_neg: int = 0,
                    seed: int = PROTOCOL_SEED) -> np.ndarray:
    """Observe ``num_pos`` positives and ``num_neg`` negatives per row, uniformly at random.

    ``labels`` is a clean 0/1 matrix (N x L). A fresh ``np.random.RandomState(seed)`` walks the
    rows in order; for each row it shuffles the indices of the positives and keeps the first
    ``num_pos``, then shuffles the indices of the negatives and keeps the first ``num_neg``
    (``-1`` keeps all). The negatives are shuffled even when ``num_neg`` is 0: the reference
    does so, and skipping it would change every later row's draw.

    Returns an int8 matrix: 1 observed positive, -1 observed negative, 0 unobserved.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise InputError(f"label matrix must be 2-D (images x classes), got shape {labels.shape}")
    if num_pos < -1 or num_neg < -1:
        raise InputError(f"num_pos and num_neg must be -1 (all) or >= 0, got {num_pos}, {num_neg}")
    bad = ~np.isin(labels, (0, 1))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise InputError(
            f"label matrix must hold only 0 and 1; row {row}, class {col} holds {labels[row, col].item()!r}"
        )
    empty = np.flatnonzero(labels.sum(axis=1) == 0)
    if empty.size:
        raise InputError(
            f"{plural(empty.size, 'row has', 'rows have')} no positive label (first: row {empty[0]}); drop them "
            "before sampling (featcache prepare does this and reports the count)"
        )
    rng = np.random.RandomState(seed)
    observed = np.zeros(labels.shape, dtype=np.int8)
    for i, row in enumerate(labels):
        positives = np.nonzero(row == 1)[0]
        rng.shuffle(positives)
        observed[i, positives if num_pos == -1 else positives[:num_pos]] = 1
        negatives = np.nonzero(row == 0)[0]
        rng.shuffle(negatives)
        observed[i, negatives if num_neg == -1 else negatives[:num_neg]] = -1
    return observed


def split_train_val(num_rows: int, val_fraction: float = VAL_FRACTION,
                    seed: int = PROTOCOL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(num_rows)`` into sorted train and validation indices.

    ``n_val = round(val_fraction * N)``; ``perm = RandomState(seed).permutation(N)``;
    train = ``sort(perm[:N - n_val])``, val = ``sort(perm[-n_val:])``.
    """
    if num_rows < 2:
        raise InputError(f"cannot split {plural(num_rows, 'training row')} into train and validation sets")
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"validation fraction must be in (0, 1), got {val_fraction}")
    n_val = int(np.round(val_fraction * num_rows))
    if n_val == 0 or n_val == num_rows:
        raise InputError(
            f"a validation fraction of {val_fraction} leaves an empty split of {plural(num_rows, 'row')}"
        )
    perm = np.random.RandomState(seed).permutation(num_rows)
    return np.sort(perm[: num_rows - n_val]), np.sort(perm[-n_val:])


def rows_without_positive(labels: np.ndarray) -> np.ndarray:
    """Indices of the rows of a 0/1 matrix that have no positive label."""
    return np.flatnonzero(np.asarray(labels).sum(axis=1) == 0)
