"""The protocol's mAP for the Python API: :func:`protocol_map` (what ``score`` reports),
:func:`mean_average_precision_score` and :func:`map_scorer` for scikit-learn's model selection,
and the fold advice their coverage warning ends with."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from featcache.errors import FeatcacheWarning
from featcache.metrics import average_precision
from featcache.protocol.coverage import coverage


def protocol_map(probs: torch.Tensor, y: np.ndarray, classes: list[str],
                 warn: bool = True, advice: str = "") -> float:
    """mAP in percent over every class (AP 0 without positives), warning about such classes
    (``advice`` ends the warning)."""
    targets = torch.as_tensor(np.asarray(y) == 1, dtype=torch.float32)
    value = float(average_precision(probs.float().cpu(), targets).mean()) * 100.0
    note = coverage("scored", classes, targets.numpy()).missing_note(value)
    if warn and note:
        warnings.warn(note + advice, FeatcacheWarning, stacklevel=3)
    return value


def mean_average_precision_score(y_true, y_score) -> float:
    """The protocol's mAP in percent for scikit-learn's scorer interface (``y_true``: its 1
    entries are positives; ``y_score``: probabilities (n, L))."""
    y_true = np.asarray(y_true)
    if y_true.ndim != 2:
        raise ValueError(f"y_true must be a 2-D label matrix (n_samples, n_classes), got shape "
                         f"{y_true.shape}")
    scores = torch.as_tensor(np.asarray(y_score), dtype=torch.float32)
    return protocol_map(scores, y_true, [str(c) for c in range(y_true.shape[1])],
                        advice=FOLD_ADVICE)


#: the scorer's warning when a scored split lacks classes: in cross-validation that is a fold
#: of rows ordered by class (the training folds then lack those classes too)
FOLD_ADVICE = ("; in cross-validation this fold's score is misleading: rows ordered by class "
               "give folds without whole classes, so shuffle them: cv=KFold(n_splits=5, "
               "shuffle=True, random_state=0) (sklearn.model_selection)")


def map_scorer(estimator, X, y) -> float:
    """``GridSearchCV(SPMLClassifier(), {"lr": [...]}, scoring=map_scorer)``: the protocol's mAP
    (percent) of the estimator's probabilities against ``y``, class labels or a label matrix
    (``estimator.score``, which a Pipeline passes to its last step). A scored split without
    positives of some class warns with :data:`FOLD_ADVICE` (shuffle the folds)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = float(estimator.score(X, y))
    for warning in caught:
        message = str(warning.message)
        if issubclass(warning.category, FeatcacheWarning) and "scored split" in message:
            message += FOLD_ADVICE
        warnings.warn_explicit(message, warning.category, warning.filename, warning.lineno)
    return value
