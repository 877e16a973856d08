"""``ZeroShotClassifier``: CLIP's zero-shot scores as a scikit-learn estimator (no training).

The baseline of ``train-linear --loss all``'s ``zero-shot`` row
(:mod:`featcache.linear.zeroshot`) for arrays: the score of an image for a class is the cosine
between its image embedding (a row of ``X``) and the class-prompt embedding. ``fit`` learns
nothing; it checks the inputs and sets scikit-learn's fitted attributes, so the estimator
scores and compares beside :class:`~featcache.api.estimator.SPMLClassifier` (``score`` is the
same protocol mAP).

>>> zero = ZeroShotClassifier.from_features("cache/voc/features-clip-vit-b32.h5")  # doctest: +SKIP
>>> zero.fit(X_train).score(X_test, Y_test)                                        # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from featcache.api.scoring import protocol_map
from featcache.api.targets import label_matrix
from featcache.data.featurefile import read_text_embeddings
from featcache.errors import InputError, OptionError, plural
from featcache.linear.zeroshot import zero_shot_scores


class ZeroShotClassifier(ClassifierMixin, BaseEstimator):
    """Zero-shot multi-label scores from class-prompt embeddings.

    Parameters
    ----------
    text_embeddings : array (n_classes, n_features)
        One class-prompt embedding per class, in the image embeddings' space (a features
        file's ``/text/embeddings``: :meth:`from_features` reads them).
    classes : sequence of str or None
        The class names (default ``0 .. n_classes - 1``).

    Attributes
    ----------
    coef_ : ndarray (n_classes, n_features)
        The L2-normalised class-prompt embeddings.
    classes_ : ndarray (n_classes,)
    n_features_in_ : int
    """

    def __init__(self, text_embeddings=None, classes=None):
        self.text_embeddings = text_embeddings
        self.classes = classes

    @classmethod
    def from_features(cls, path) -> ZeroShotClassifier:
        """The classifier of a features file made with ``featcache features --text``."""
        text = read_text_embeddings(path)
        if text is None:
            raise InputError(f"{path} has no class-prompt text embeddings; add them with "
                             "`featcache features --dataset ... --backbone ... --text`")
        return cls(text_embeddings=text.embeddings, classes=list(text.classes))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        tags.classifier_tags.multi_label = True
        tags.classifier_tags.multi_class = False
        return tags

    def fit(self, X, y=None):
        """Check ``X`` (n, n_features) (and ``y`` (n, n_classes) when given: 1, 0, -1) against
        the class-prompt embeddings; nothing is trained."""
        if self.text_embeddings is None:
            raise OptionError("ZeroShotClassifier needs text_embeddings (n_classes, n_features): "
                              "pass them, or use ZeroShotClassifier.from_features(path)")
        texts = np.asarray(self.text_embeddings, dtype=np.float32)
        if texts.ndim != 2 or not np.isfinite(texts).all():
            raise ValueError(f"text_embeddings must be a finite (n_classes, n_features) matrix, "
                             f"got shape {texts.shape}")
        X = validate_data(self, X, dtype=np.float32)
        if X.shape[1] != texts.shape[1]:
            raise ValueError(f"X has {X.shape[1]} features per row but the class-prompt "
                             f"embeddings have {texts.shape[1]}: they must share one space")
        if y is not None:
            label_matrix(np.asarray(y), "y", (-1, 0, 1), rows=len(X), classes=len(texts))
        names = list(self.classes) if self.classes is not None else list(range(len(texts)))
        if len(names) != len(texts):
            raise ValueError(f"{plural(len(names), 'class name')} for "
                             f"{plural(len(texts), 'class-prompt embedding')}")
        self.classes_ = np.array(names)
        self.coef_ = torch.nn.functional.normalize(torch.from_numpy(texts), dim=-1).numpy()
        return self

    def decision_function(self, X) -> np.ndarray:
        """Cosines (n, n_classes) between the rows of ``X`` and the class prompts."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float32)
        return zero_shot_scores(torch.from_numpy(X), torch.from_numpy(self.coef_)).numpy()

    def predict(self, X) -> np.ndarray:
        """0/1 predictions (n, n_classes): each row's best-scoring class (CLIP's zero-shot
        choice; cosines carry no calibrated threshold for further labels)."""
        scores = self.decision_function(X)
        out = np.zeros(scores.shape, dtype=np.int64)
        out[np.arange(len(scores)), scores.argmax(axis=1)] = 1
        return out

    def score(self, X, y, sample_weight=None) -> float:
        """mAP (percent) of the cosines against ``y``'s positives (its 1 entries), the
        protocol's metric as :meth:`SPMLClassifier.score <featcache.api.estimator.
        SPMLClassifier.score>` computes it."""
        if sample_weight is not None:
            raise OptionError("ZeroShotClassifier.score does not support sample_weight")
        scores = self.decision_function(X)
        targets = label_matrix(np.asarray(y), "y", (-1, 0, 1), rows=len(scores),
                                classes=len(self.classes_))
        return protocol_map(torch.from_numpy(scores), targets, [str(c) for c in self.classes_])
