"""``SPMLClassifier``: a scikit-learn estimator that trains one SPML linear head.

It runs stage two's own search (:func:`featcache.linear.search.run_search`) on a grid of one
point, so a fit is exactly a ``featcache train-linear`` configuration: the same loss classes,
the same seeded head initialisation and batch order, the same trainer, the same selection.
Labels follow featcache's convention: ``y`` is an (n, L) matrix with 1 for an observed
positive, 0 for unobserved and -1 for an observed negative.

- ``fit(X, y)`` trains ``epochs`` epochs and keeps the last one;
- ``fit(X, y, eval_set=(X_val, Y_val))`` keeps the epoch with the best mAP on the evaluation
  set (the protocol's selection: the first epoch reaching the maximum);
- ``validation_fraction=0.2`` instead holds out that share of the rows with the protocol's
  seeded split (``RandomState(1200)``) and selects on them, using ``y_full`` when given (clean
  validation) or their observed positives (the protocol's ``--val observed``); unlike
  ``eval_set`` it stays right inside a ``Pipeline`` (the held-out rows are transformed too).

Scores are mAP in percent, as everywhere in featcache, with the protocol's convention that a
class without positives counts as AP 0 (and a :class:`~featcache.errors.FeatcacheWarning`
naming those classes and giving the mAP over the others).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import make_scorer
from sklearn.utils.validation import check_is_fitted, validate_data

from featcache.data.sampling import split_train_val
from featcache.errors import FeatcacheWarning, LossNeedError, OptionError, plural
from featcache.linear.data import LinearData
from featcache.linear.heads import StackedBoostLU, StackedLinear
from featcache.linear.search import SearchSpec, run_search
from featcache.losses import loss_class
from featcache.metrics import average_precision
from featcache.protocol.coverage import coverage
from featcache.protocol.selection import LAST_EPOCH, check_early_stop
from featcache.runtime import pick_device

#: how the estimator names its labels in messages
SOURCE = "the y given to SPMLClassifier.fit"
#: what a loss that needs more than single positives can be given
NEED_HINT = ("SPMLClassifier.fit takes full labels as y_full=Y_full, observed negatives as "
             "-1 entries of y, pseudo-labels (1, 0, -1) as y_pseudo=P, and spatial feature maps "
             "as rows of X with SPMLClassifier(spatial_shape=(h, w, D))")


class SPMLClassifier(ClassifierMixin, BaseEstimator):
    """A linear head on fixed features trained with a single-positive multi-label loss.

    Parameters
    ----------
    loss : str
        A registered loss (``featcache losses`` lists them), e.g. ``"an-ls"``, ``"role"``.
    loss_params : dict or None
        Loss parameters (``{"eps_pos": 0.0}``); the rest take their defaults. ``k`` (EPR,
        ROLE), unless given, is the mean positives per row of ``y_full`` and of the
        validation labels, the way a labels file's ``k`` covers its training and validation
        rows (so the protocol's split reproduces ``train-linear``'s ``k``).
    lr, batch_size, epochs : float, int, int
        Adam's learning rate, the batch size (the last partial batch is dropped, as the
        reference does) and the number of epochs (the protocol: 25).
    seed : int
        Seeds the head's initialisation, the batch order and the loss's state exactly as
        ``featcache train-linear --seeds`` does.
    validation_fraction : float or None
        Hold out this share of the rows (the protocol's seeded split) to select the best
        epoch; None trains on every row and keeps the last epoch unless ``eval_set`` is given.
    early_stop : {"none", "kim", "zhou"}
        Early stopping on the validation mAP (needs validation data).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or ``"auto"`` (a GPU when there is one).
    progress : bool
        Show a progress bar while training.
    spatial_shape : tuple (h, w, D) or None
        The rows of ``X`` are feature maps of h x w positions of D channels, laid out (h, w, D)
        in C order (a spatial features file's rows): what the BoostLU losses (``ll-r+boostlu``
        ...) train on. ``coef_`` is then the 1 x 1 convolution (n_classes, D) and predictions
        are BoostLU's boosted logits.

    Attributes
    ----------
    coef_ : ndarray (n_classes, n_features)
    intercept_ : ndarray (n_classes,)
    classes_ : ndarray (n_classes,)
        Class names: the columns of a DataFrame ``y``, else ``0 .. n_classes - 1``.
    n_features_in_, feature_names_in_ : the input's width and column names (sklearn's).
    loss_params_ : dict
        Every loss parameter as used, defaults included.
    best_epoch_ : int
        The kept epoch, counted from 1.
    best_score_ : float or None
        Validation mAP (percent) at ``best_epoch_``; None without validation data.
    history_ : list of dict
        Per epoch: training loss and, with validation data, validation mAP.
    loss_state_ : dict of ndarray
        Per-example state the loss learned beside the head (ROLE's label estimates ``phi``).
    """

    def __init__(self, loss="an-ls", loss_params=None, lr=1e-3, batch_size=16, epochs=25,
                 seed=0, validation_fraction=None, early_stop="none", device="cpu",
                 progress=False, spatial_shape=None):
        self.loss = loss
        self.loss_params = loss_params
        self.lr = lr
        self.batch_size = batch_size
        self.epochs = epochs
        self.seed = seed
        self.validation_fraction = validation_fraction
        self.early_stop = early_stop
        self.device = device
        self.progress = progress
        self.spatial_shape = spatial_shape

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        tags.classifier_tags.multi_label = True
        tags.classifier_tags.multi_class = False
        return tags

    # ------------------------------------------------------------------ training
    def fit(self, X, y, *, eval_set=None, y_full=None, y_pseudo=None):
        """Train the head on features ``X`` (n, D) and observed labels ``y`` (n, L).

        ``eval_set=(X_val, Y_val)`` selects the best epoch by mAP on ``Y_val`` (its 1 entries
        are the positives: clean labels, or observed ones); ``y_full`` (n, L, 0/1) gives the
        full labels that oracle losses (``bce``) train on and from which ``k`` and observed
        negatives' availability follow; ``y_pseudo`` (n, L: 1, 0, -1) the pseudo-labels that
        ``vlpl`` and ``gpr`` train on (e.g. a ``featcache pseudo-label`` file's ``/train/pseudo``).
        """
        names = list(y.columns) if hasattr(y, "columns") else None
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float32)
        y = _label_matrix(y, "y", (-1, 0, 1))
        full = None
        if y_full is not None:
            full = _label_matrix(np.asarray(y_full), "y_full", (0, 1), rows=len(y),
                                 classes=y.shape[1])
            wrong = np.argwhere((y == 1) & (full == 0))
            if wrong.size:
                row, column = wrong[0]
                raise ValueError(f"y marks row {row}, class {column} as an observed positive but "
                                 "y_full says it is negative")
        pseudo = None
        if y_pseudo is not None:
            pseudo = _label_matrix(np.asarray(y_pseudo), "y_pseudo", (-1, 0, 1), rows=len(y),
                                   classes=y.shape[1])
        self._check_options()
        self.classes_ = np.array(names if names is not None else np.arange(y.shape[1]))
        data, variant = self._data(X, y, full, eval_set, pseudo)
        self._check_needs(data)
        spec = SearchSpec(loss=self.loss, learning_rates=[float(self.lr)],
                          batch_sizes=[int(self.batch_size)], params=dict(self.loss_params or {}),
                          seeds=[int(self.seed)], epochs=int(self.epochs), val_variant=variant,
                          early_stop=self.early_stop)
        head = run_search(data, spec, device=self._device(), progress=self.progress,
                          jobs=1).seeds[0].selected
        self.coef_ = head.weight.numpy().astype(np.float32)
        self.intercept_ = head.bias.numpy().astype(np.float32)
        self.loss_params_ = dict(head.config.param_dict)
        self.best_epoch_ = head.best_epoch + 1
        self.best_score_ = None if variant == LAST_EPOCH else float(head.best_val)
        self.loss_state_ = {name: value.numpy() for name, value in head.state.items()}
        self.history_ = [_history(record.to_json(), variant) for record in head.epochs]
        return self

    def _check_options(self) -> None:
        loss_class(self.loss)  # an unknown loss names the closest ones
        check_early_stop(self.early_stop)
        if self.validation_fraction is not None and not 0 < self.validation_fraction < 1:
            raise OptionError(f"validation_fraction must be in (0, 1) or None, got "
                              f"{self.validation_fraction!r}")
        for name in ("batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise OptionError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if not float(self.lr) > 0:
            raise OptionError(f"lr must be positive, got {self.lr!r}")
        if self.spatial_shape is not None and (
                len(tuple(self.spatial_shape)) != 3
                or any(int(v) < 1 for v in self.spatial_shape)):
            raise OptionError(f"spatial_shape must be (h, w, D) of positive sizes, got "
                              f"{self.spatial_shape!r}")
        if self.loss_params is not None and not isinstance(self.loss_params, dict):
            raise OptionError(f"loss_params must be a dict or None, got "
                              f"{type(self.loss_params).__name__}")

    def _data(self, X, y, full, eval_set, pseudo=None) -> tuple[LinearData, str]:
        """Training and validation splits, and the validation variant that selects."""
        train = (X, y, full)
        if eval_set is not None:
            if self.validation_fraction is not None:
                raise OptionError("pass either eval_set or validation_fraction, not both")
            if not isinstance(eval_set, (tuple, list)) or len(eval_set) != 2:
                raise OptionError("eval_set must be a pair (X_val, Y_val)")
            X_val = validate_data(self, eval_set[0], reset=False, dtype=np.float32)
            Y_val = _label_matrix(np.asarray(eval_set[1]), "eval_set's Y_val", (-1, 0, 1),
                                  rows=len(X_val), classes=y.shape[1])
            val = (X_val, Y_val, (Y_val == 1).astype(np.uint8))
            variant = "clean"
        elif self.validation_fraction is not None:
            kept, held = split_train_val(len(X), float(self.validation_fraction))
            train = (X[kept], y[kept], None if full is None else full[kept])
            pseudo = None if pseudo is None else pseudo[kept]
            val = (X[held], y[held], None if full is None else full[held])
            variant = "clean" if full is not None else "observed"
        else:
            val, variant = train, LAST_EPOCH
        attrs = {"backbone": "arrays"}
        if self.spatial_shape is not None:
            shape = [int(v) for v in self.spatial_shape]
            if X.shape[1] != shape[0] * shape[1] * shape[2]:
                raise ValueError(f"X has {X.shape[1]} features per row, but spatial_shape "
                                 f"{tuple(shape)} makes {shape[0] * shape[1] * shape[2]}")
            attrs.update(layout="spatial", spatial_shape=shape)
        data = LinearData.from_arrays(train, val, classes=[str(c) for c in self.classes_],
                                      source=SOURCE, attrs=attrs, device=self._device(),
                                      pseudo=pseudo)
        return data, variant

    def _check_needs(self, data: LinearData) -> None:
        """What the loss needs that these arrays lack, in one error naming it and the fix.

        Needs that featcache completes for a prepared labels file (observed negatives drawn
        with the protocol's sampler over the official training set) cannot be completed for
        arrays, whose rows are not the labels file's.
        """
        cls = loss_class(self.loss)
        facts = data.facts
        for need in cls.needs:
            reason = need.unmet(facts)
            if (reason is None and need.key == "observed_negatives"
                    and not facts.has_observed_negatives):
                reason = f"needs {need.description}"
            if reason is not None and need.key == "spatial_features":
                reason = "trains a BoostLU head on spatial feature maps, one (h, w, D) map per row"
            if reason is not None:
                raise LossNeedError(f"loss {self.loss!r} {reason} ({NEED_HINT})")
        given = set(self.loss_params or {})
        for key, param in cls.params.items():
            decided = param.from_data is not None and param.from_data(facts) is not None
            if param.default is None and key not in given and not decided:
                raise LossNeedError(
                    f"loss {self.loss!r} needs {key} ({param.help}): pass "
                    f"loss_params={{{key!r}: VALUE}}"
                    + (", or y_full (the data then decides it)" if param.from_data else ""))

    def _device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return pick_device(self.device)

    # ------------------------------------------------------------------ predicting
    def decision_function(self, X) -> np.ndarray:
        """Logits (n, L), computed as stage two evaluates its heads."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float32)
        if self.spatial_shape is None or loss_class(self.loss).head != "boostlu":
            return linear_logits(X, self.coef_, self.intercept_, self._device())
        height, width, _ = (int(v) for v in self.spatial_shape)
        return boostlu_logits(X, self.coef_, self.intercept_, height * width,
                              self.loss_params_["alpha"], self._device())

    def predict_proba(self, X) -> np.ndarray:
        """Probabilities (n, L), float32: the sigmoid of the logits (one independent label per
        class), the values stage two's evaluation ranks."""
        return torch.sigmoid(torch.from_numpy(self.decision_function(X))).numpy()

    def predict(self, X, threshold: float = 0.5) -> np.ndarray:
        """0/1 predictions (n, L): probability at least ``threshold``."""
        return (self.predict_proba(X) >= threshold).astype(np.int64)

    def score(self, X, y, sample_weight=None) -> float:
        """mAP (percent) of the predictions against ``y``'s positives (its 1 entries), with the
        protocol's conventions: AP as scikit-learn defines it, computed on float32
        probabilities as stage two does, and AP 0 for a class without positives (warned)."""
        if sample_weight is not None:
            raise OptionError("SPMLClassifier.score does not support sample_weight")
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float32)
        targets = _label_matrix(np.asarray(y), "y", (-1, 0, 1), rows=len(X),
                                classes=len(self.classes_))
        probs = torch.from_numpy(self.predict_proba(X))
        return protocol_map(probs, targets, [str(c) for c in self.classes_])


# ---------------------------------------------------------------------- shared helpers
def linear_logits(X: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                  device: torch.device | str = "cpu") -> np.ndarray:
    """Logits of one linear head (weight (L, D), bias (L,)) through stage two's own stacked
    head, so that predictions equal the ones its evaluation scored."""
    head = StackedLinear(
        torch.as_tensor(weight, dtype=torch.float32).t().contiguous()[None].to(device),
        torch.as_tensor(bias, dtype=torch.float32).reshape(1, 1, -1).to(device))
    with torch.no_grad():
        features = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=device)
        return head(features)[0].cpu().numpy()


def boostlu_logits(X: np.ndarray, weight: np.ndarray, bias: np.ndarray, positions: int,
                   alpha: float, device: torch.device | str = "cpu") -> np.ndarray:
    """Logits of one BoostLU head (the 1 x 1 convolution weight (L, D), bias (L,)) on rows of
    (h, w, D) maps of ``positions`` = h w positions, through stage two's stacked BoostLU head."""
    head = StackedBoostLU(
        torch.as_tensor(weight, dtype=torch.float32).t().contiguous()[None].to(device),
        torch.as_tensor(bias, dtype=torch.float32).reshape(1, 1, -1).to(device),
        positions=positions, alpha=[float(alpha)], trainable=False)
    features = torch.as_tensor(np.ascontiguousarray(X), dtype=torch.float32, device=device)
    return head.logits(features)[0].cpu().numpy()


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


#: ``GridSearchCV(SPMLClassifier(), {"lr": [...]}, scoring=map_scorer)``
map_scorer = make_scorer(mean_average_precision_score, response_method="predict_proba")


def _label_matrix(y: np.ndarray, name: str, allowed: tuple[int, ...], rows: int | None = None,
                  classes: int | None = None) -> np.ndarray:
    """``y`` as an int8 (n, L) matrix of ``allowed`` values; the error names what is wrong."""
    y = np.asarray(y)
    if y.ndim != 2:
        raise ValueError(f"{name} must be a 2-D label matrix (n_samples, n_classes) with 1 for an "
                         f"observed positive, 0 unobserved, -1 observed negative; got shape "
                         f"{y.shape}")
    if rows is not None and y.shape[0] != rows:
        raise ValueError(f"{name} has {plural(y.shape[0], 'row')} but its features have {rows}")
    if classes is not None and y.shape[1] != classes:
        raise ValueError(f"{name} has {plural(y.shape[1], 'column')} but the classifier has {plural(classes, 'class', 'classes')}")
    bad = ~np.isin(y, allowed)
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise ValueError(f"{name} row {row}, column {column} holds {y[row, column]!r}; it may "
                         f"hold only {', '.join(map(str, allowed))}")
    return y.astype(np.int8)


def _history(record: dict, variant: str) -> dict:
    """One epoch of ``history_``: without validation data, no validation numbers."""
    keep = ("epoch", "train_loss", "train_map") if variant == LAST_EPOCH else (
        "epoch", "train_loss", "val_map", "val_map_observed", "train_map")
    return {key: record.get(key) for key in keep}
