"""Observed negatives drawn on the fly, for losses that need them (``iu``) on data prepared
without ``--num-neg``."""

from __future__ import annotations

import numpy as np

from featcache.data.labelfile import LabelSet
from featcache.data.sampling import PROTOCOL_SEED, observe_uniform
from featcache.errors import InputError


def observed_with_negatives(labels: LabelSet, rows: np.ndarray, observed: np.ndarray,
                            num_neg: int) -> tuple[np.ndarray, str]:
    """The observed labels of official-train ``rows`` with ``num_neg`` negatives per row, and a note.

    Uses the protocol sampler on the official clean train labels, exactly as the reference
    generator run with ``--num-neg``; the observed positives do not change (the negatives are
    shuffled with the same draws whatever ``num_neg`` is), which is checked against ``observed``.
    """
    clean = labels.train.clean
    if clean is None:
        raise InputError(
            f"{labels.path} has no clean training labels to draw observed negatives from; "
            "prepare the dataset with --num-neg 1 instead"
        )
    seed = int(labels.provenance.get("obs_seed", PROTOCOL_SEED))
    if labels.provenance.get("observation") == "given":
        return _beside_given(labels, clean, rows, observed, num_neg, seed)
    num_pos = int(labels.provenance.get("num_pos", 1))
    drawn = observe_uniform(clean, num_pos=num_pos, num_neg=num_neg, seed=seed)[rows]
    if not np.array_equal(np.clip(drawn, 0, None), np.clip(np.asarray(observed), 0, None)):
        raise InputError(
            f"{labels.path}: re-drawing the observations with num_neg={num_neg} changed the "
            "observed positives (were the labels prepared with another seed?)"
        )
    return drawn, f"observed negatives drawn on the fly: num_neg={num_neg}, seed={seed}"


def _beside_given(labels: LabelSet, clean: np.ndarray, rows: np.ndarray, observed: np.ndarray,
                  num_neg: int, seed: int) -> tuple[np.ndarray, str]:
    """Given observations (L48's target variant) keep every observed entry; each official
    training row gets ``num_neg`` more negatives drawn uniformly among its unobserved clean
    negatives with ``RandomState(seed)`` (rows in order, so a row's draw does not depend on
    ``rows``)."""
    rng = np.random.RandomState(seed)
    given = np.asarray(labels.train.observed)
    drawn = given.copy()
    for row in range(len(given)):
        candidates = np.flatnonzero((clean[row] == 0) & (given[row] == 0))
        drawn[row, rng.permutation(candidates)[:num_neg]] = -1
    drawn = drawn[rows]
    if not np.array_equal(drawn[np.asarray(observed) != 0], np.asarray(observed)[
            np.asarray(observed) != 0]):
        raise InputError(f"{labels.path}: the observed labels given do not match the file's")
    return drawn, (f"observed negatives drawn on the fly beside the given observations: "
                   f"num_neg={num_neg} among each row's unobserved clean negatives, seed={seed}")
