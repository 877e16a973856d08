"""``SPMLClassifier``: a scikit-learn estimator that trains one SPML linear head.

It runs stage two's own search (:func:`featcache.linear.engine.search.run_search`) on a grid of one
point, so a fit is exactly a ``featcache train-linear`` configuration: the same loss classes,
the same seeded head initialisation and batch order, the same trainer, the same selection.

``y`` comes in either of two forms (:mod:`featcache.api.targets`):

- **class labels**: a 1-D array of ints or strings, the one observed positive of each row
  (scikit-learn's multiclass target). ``predict`` then gives one label per row (the most
  probable class), ``decision_function`` follows scikit-learn's shapes;
- **a label matrix** (n, L): 1 for an observed positive, 0 unobserved, -1 an observed
  negative (featcache's convention). ``predict`` then gives the 0/1 indicator matrix.

Either way ``predict_proba`` gives one independent probability per class (a row need not sum
to 1: an image may show several classes), ``predict_multilabel`` every class whose
probability is above ``threshold`` and, after a fit with validation rows, ``predict_sets(X,
level)`` conformal label sets calibrated on their observed positives (docs/label-sets.md).

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

import math
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.utils._param_validation import (
    Interval,
    InvalidParameterError,
    StrOptions,
    validate_parameter_constraints,
)
from sklearn.utils.validation import check_is_fitted, validate_data

from featcache.api.constraints import RegisteredNames, SpatialShape, loss_param_constraints
from featcache.api.head_logits import (  # noqa: F401 - re-exported: the estimator's own
    SIGMOID_BLOCK,
    head_logits,
    probabilities,
)
from featcache.api.label_sets import calibrated_rule
from featcache.api.scoring import protocol_map
from featcache.api.targets import LABELS, class_matrix, read_target, targets_for
from featcache.data.sampling import split_train_val
from featcache.errors import FeatcacheWarning, LossNeedError, OptionError, plural
from featcache.linear.data import LinearData
from featcache.linear.engine.search import SearchSpec, run_search
from featcache.losses import OBSERVED_NEGATIVES, SPATIAL_FEATURES, loss_class, loss_names
from featcache.protocol.label_sets import Calibration
from featcache.protocol.selection import EARLY_STOP_RULES, LAST_EPOCH
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
        Loss parameters (``{"eps_pos": 0.0}``), each checked against its range; the rest take
        their defaults. ``k`` (EPR, ROLE), unless given, is the mean positives per row of
        ``y_full`` and of the validation labels, the way a labels file's ``k`` covers its
        training and validation rows (so the protocol's split reproduces ``train-linear``'s ``k``).
    lr, batch_size, epochs : float, int, int
        Adam's learning rate, the batch size (the last partial batch is dropped, as the
        reference does; more than the training rows is clipped to them with a warning) and the
        number of epochs (the protocol: 25).
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
        ...) and IGNORE (``ignore``) train on. ``coef_`` is then the 1 x 1 convolution
        (n_classes, D) and predictions are BoostLU's boosted logits (IGNORE's: the mean of the
        class activation map, the linear head on the pooled map).
    classes : array-like or None
        The classes, in this order, when ``y`` does not show them all (a class never observed
        as a row's positive still gets its head); for a label matrix, the names of its columns.
        None: the labels of ``y`` sorted, or a matrix's column names (a DataFrame's) or
        ``0 .. L - 1``.
    threshold : float in [0, 1]
        ``predict_multilabel`` (and ``predict`` after a label matrix) predicts every class whose
        probability is above it.

    Attributes
    ----------
    coef_ : ndarray (n_classes, n_features)
    intercept_ : ndarray (n_classes,)
    classes_ : ndarray (n_classes,)
    target_form_ : {"labels", "matrix"}
        Which form of ``y`` the estimator was fitted on (what ``predict`` returns).
    n_features_in_, feature_names_in_ : the input's width and column names (sklearn's).
    batch_size_ : int
        The batch size trained with (``batch_size`` clipped to the training rows).
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
    calibration_ : Calibration or None
        The validation rows' probabilities and observed labels, what :meth:`predict_sets`
        calibrates on (None without validation rows).
    """

    _parameter_constraints: dict = {
        "loss": [RegisteredNames(loss_names)],
        "loss_params": [dict, None],
        "lr": [Interval(Real, 0, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "epochs": [Interval(Integral, 1, None, closed="left")],
        "seed": [Interval(Integral, 0, None, closed="left")],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither"), None],
        "early_stop": [StrOptions(set(EARLY_STOP_RULES))],
        "device": [str],
        "progress": ["boolean"],
        "spatial_shape": [SpatialShape(), None],
        "classes": ["array-like", None],
        "threshold": [Interval(Real, 0, 1, closed="both")],
    }

    def __init__(self, loss="an-ls", loss_params=None, lr=1e-3, batch_size=16, epochs=25,
                 seed=0, validation_fraction=None, early_stop="none", device="cpu",
                 progress=False, spatial_shape=None, classes=None, threshold=0.5):
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
        self.classes = classes
        self.threshold = threshold

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.target_tags.single_output = True  # class labels, one observed positive per row
        tags.target_tags.multi_output = True  # a label matrix
        tags.classifier_tags.multi_class = True
        tags.classifier_tags.multi_label = True
        return tags

    def _validate_params(self):
        """scikit-learn's checks of the constructor parameters, then each loss parameter's
        range; an unknown loss also names the closest registered ones."""
        try:
            super()._validate_params()
        except InvalidParameterError as exc:
            if isinstance(self.loss, str) and self.loss not in loss_names():
                try:
                    loss_class(self.loss)
                except OptionError as unknown:
                    raise InvalidParameterError(f"{exc} ({unknown})") from None
            raise
        validate_parameter_constraints(
            loss_param_constraints(self.loss), dict(self.loss_params or {}),
            caller_name=f"the loss {self.loss!r} (loss_params of SPMLClassifier)")

    # ------------------------------------------------------------------ training
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, *, eval_set=None, y_full=None, y_pseudo=None):
        """Train the head on features ``X`` (n, D) and ``y``: class labels (n,) or an observed
        label matrix (n, L) of 1, 0, -1.

        ``eval_set=(X_val, Y_val)`` selects the best epoch by mAP on ``Y_val`` (class labels,
        or a matrix whose 1 entries are the positives: clean labels, or observed ones);
        ``y_full`` (n, L, 0/1) gives the full labels that oracle losses (``bce``) train on and
        from which ``k`` and observed negatives' availability follow; ``y_pseudo`` (n, L: 1, 0,
        -1) the pseudo-labels that ``vlpl`` and ``gpr`` train on (e.g. a ``featcache
        pseudo-label`` file's ``/train/pseudo``). Their columns follow ``classes_`` (matched as
        :meth:`score` matches a label matrix's).
        """
        names = list(y.columns) if hasattr(y, "columns") else None
        X, y = validate_data(self, X, y, multi_output=True, dtype=np.float32)
        target = read_target(y, self.classes, names)
        rows = len(X)
        self.classes_, self.target_form_ = target.classes, target.form
        X, observed = X[target.kept], target.observed
        full = None
        if y_full is not None:
            full = class_matrix(y_full, self.classes_, "y_full", (0, 1), rows,
                                self._columns_follow_classes())[target.kept]
            wrong = np.argwhere((observed == 1) & (full == 0))
            if wrong.size:
                row, column = wrong[0]
                raise ValueError(f"y marks row {row}, class {column} as an observed positive but "
                                 "y_full says it is negative")
        pseudo = None
        if y_pseudo is not None:
            pseudo = class_matrix(y_pseudo, self.classes_, "y_pseudo", (-1, 0, 1), rows,
                                  self._columns_follow_classes())[target.kept]
        data, variant = self._data(X, observed, full, eval_set, pseudo)
        self._check_needs(data)
        self.batch_size_ = self._batch_size(len(data.train))
        spec = SearchSpec(loss=self.loss, learning_rates=[float(self.lr)],
                          batch_sizes=[self.batch_size_], params=dict(self.loss_params or {}),
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
        self.calibration_ = None if variant == LAST_EPOCH else Calibration(
            probabilities(self._head_logits(data.val.features.cpu().numpy())),
            data.val.observed.cpu().numpy().astype(np.int8), np.arange(len(data.val)),
            [str(c) for c in self.classes_])
        return self

    def _batch_size(self, rows: int) -> int:
        """``batch_size``, clipped (with a warning) to the training rows."""
        if self.batch_size <= rows:
            return int(self.batch_size)
        warnings.warn(f"batch_size={self.batch_size} is larger than the {plural(rows, 'training row')}: "
                      f"trained with batch_size={rows} (one batch per epoch)", FeatcacheWarning,
                      stacklevel=4)
        return rows

    def _data(self, X, y, full, eval_set, pseudo=None) -> tuple[LinearData, str]:
        """Training and validation splits, and the validation variant that selects."""
        train = (X, y, full)
        if eval_set is not None:
            if self.validation_fraction is not None:
                raise OptionError("pass either eval_set or validation_fraction, not both")
            if not isinstance(eval_set, (tuple, list)) or len(eval_set) != 2:
                raise OptionError("eval_set must be a pair (X_val, Y_val)")
            X_val = validate_data(self, eval_set[0], reset=False, dtype=np.float32)
            Y_val = targets_for(eval_set[1], self.classes_, "eval_set's Y_val", len(X_val),
                                self._columns_follow_classes())
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
        attrs: dict[str, object] = {"backbone": "arrays"}
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
            if (reason is None and need is OBSERVED_NEGATIVES
                    and not facts.has_observed_negatives):
                reason = f"needs {need.description}"
            if reason is not None and need is SPATIAL_FEATURES:
                reason = "trains on spatial feature maps, one (h, w, D) map per row"
            if reason is not None:
                raise LossNeedError(f"loss {self.loss!r} {reason} ({NEED_HINT})")
        given = set(self.loss_params or {})
        for key, param in cls.params.items():
            decided = param.decided_by(facts) is not None
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
    def logits(self, X) -> np.ndarray:
        """Logits (n, n_classes), one independent head per class, computed as stage two
        evaluates its heads."""
        check_is_fitted(self)
        return self._head_logits(validate_data(self, X, reset=False, dtype=np.float32))

    def _head_logits(self, X: np.ndarray) -> np.ndarray:
        positions = 1
        if self.spatial_shape is not None:
            height, width, _ = (int(v) for v in self.spatial_shape)
            positions = height * width
        return head_logits(loss_class(self.loss).head, X, self.coef_, self.intercept_,
                           positions, self.loss_params_, self._device())

    def decision_function(self, X) -> np.ndarray:
        """scikit-learn's decision function: the logits (n, n_classes); after class labels of
        two classes, the margin ``logit(classes_[1]) - logit(classes_[0])`` (n,), positive
        where ``predict`` says ``classes_[1]`` (``logits`` gives both)."""
        logits = self.logits(X)
        if self._binary_labels():
            return logits[:, 1] - logits[:, 0]
        return logits

    def predict_proba(self, X) -> np.ndarray:
        """Probabilities (n, n_classes), float32: the sigmoid of each class's logit, one
        independent probability per class (a row need not sum to 1), the values stage two's
        evaluation ranks."""
        return probabilities(self.logits(X))

    def predict(self, X) -> np.ndarray:
        """After class labels: the most probable class of each row (n,). After a label matrix:
        the indicator matrix (n, n_classes) of :meth:`predict_multilabel`."""
        check_is_fitted(self)
        if self.target_form_ == LABELS:
            return self.classes_[np.argmax(self.logits(X), axis=1)]
        return self.predict_multilabel(X)

    def predict_multilabel(self, X) -> np.ndarray:
        """0/1 (n, n_classes), int64: 1 for every class whose probability is above
        ``threshold`` (its logit above ``log(t / (1 - t))``: 0 for the default 0.5), whatever
        form of ``y`` the estimator was fitted on."""
        t = float(self.threshold)
        cut = -math.inf if t == 0 else math.inf if t == 1 else math.log(t / (1 - t))
        return (self.logits(X) > cut).astype(np.int64)

    def predict_sets(self, X, level: float = 0.9, method: str = "rank") -> np.ndarray:
        """Conformal label sets, 0/1 (n, n_classes) int64: each set holds a random true positive
        of a row exchangeable with the validation rows with probability at least ``level``,
        calibrated on their observed positives (``method``: ``rank``, ``threshold`` or
        ``class``: :mod:`featcache.stats.label_sets`). Needs a fit with validation rows."""
        check_is_fitted(self)
        if self.calibration_ is None:
            raise OptionError("predict_sets calibrates on held-out rows: fit with "
                              "validation_fraction=0.2 or eval_set=(X_val, Y_val)")
        rule = calibrated_rule(self.calibration_, level, method)
        return rule.sets(self.predict_proba(X)).astype(np.int64)

    def score(self, X, y, sample_weight=None) -> float:
        """mAP (percent) of the probabilities against ``y``: class labels (each row's one
        positive) or a label matrix (its 1 entries; a DataFrame's columns are matched to
        ``classes_`` by name, a plain matrix's by position, refused after class labels whose
        sorted ``classes_`` need not be its column order), with the protocol's conventions: AP as
        scikit-learn defines it, computed on float32 probabilities as stage two does, and AP 0
        for a class without positives (warned)."""
        if sample_weight is not None:
            raise OptionError("SPMLClassifier.score does not support sample_weight")
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float32)
        targets = targets_for(y, self.classes_, "y", len(X), self._columns_follow_classes())
        probs = torch.from_numpy(self.predict_proba(X))
        return protocol_map(probs, targets, [str(c) for c in self.classes_])

    def _binary_labels(self) -> bool:
        return self.target_form_ == LABELS and len(self.classes_) == 2

    def _columns_follow_classes(self) -> bool:
        """Whether a label matrix without column names has ``classes_``'s column order: the
        estimator was fitted on a matrix, given ``classes=``, or its classes are 0 .. L - 1
        (not the sorted names of class labels)."""
        return (self.target_form_ != LABELS or self.classes is not None
                or np.array_equal(self.classes_, np.arange(len(self.classes_))))


# ---------------------------------------------------------------------- shared helpers
def _history(record: dict, variant: str) -> dict:
    """One epoch of ``history_``: without validation data, no validation numbers."""
    keep = ("epoch", "train_loss", "train_map") if variant == LAST_EPOCH else (
        "epoch", "train_loss", "val_map", "val_map_observed", "train_map")
    return {key: record.get(key) for key in keep}
