"""``SPMLClassifier``: scikit-learn's conventions, stage two's numbers, and every loss."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset
from sklearn.base import clone
from sklearn.exceptions import DataConversionWarning, NotFittedError
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from featcache import SPMLClassifier, map_scorer
from featcache.api.estimator import probabilities
from featcache.data.labelfile import load_labels
from featcache.data.sampling import observe_uniform, split_train_val
from featcache.errors import FeatcacheWarning, LossNeedError, OptionError
from featcache.linear.data import load_linear_data
from featcache.losses import (
    FULL_LABELS,
    OBSERVED_NEGATIVES,
    SPATIAL_FEATURES,
    loss_class,
    loss_names,
)
from featcache.metrics import mean_average_precision
from featcache.protocol.handoff import load_head
from featcache.protocol.runs import load_results


def toy_arrays(n=120, classes=5, dim=16, seed=0):
    """Learnable features of multi-label rows, their full labels and single positives."""
    rng = np.random.default_rng(seed)
    full = np.zeros((n, classes), dtype=np.uint8)
    for row in full:
        row[rng.choice(classes, size=rng.integers(1, 4), replace=False)] = 1
    basis = rng.standard_normal((classes, dim)).astype(np.float32)
    X = (full @ basis + 0.7 * rng.standard_normal((n, dim))).astype(np.float32)
    return X, observe_uniform(full), full


@pytest.fixture(scope="module")
def arrays():
    return toy_arrays()


FAST = {"epochs": 3, "batch_size": 8, "lr": 1e-2}


# ------------------------------------------------------------------ scikit-learn's conventions
def test_parameters_clone_and_fitted_attributes(arrays):
    X, Z, _ = arrays
    clf = SPMLClassifier(loss="an-ls", loss_params={"eps_pos": 0.0}, seed=3, **FAST)
    assert clf.get_params()["loss_params"] == {"eps_pos": 0.0}
    assert clf.set_params(lr=1e-3) is clf and clf.lr == 1e-3
    with pytest.raises(NotFittedError):
        clf.predict_proba(X)
    clf.fit(X, Z)
    twin = clone(clf)
    assert twin.get_params() == clf.get_params() and not hasattr(twin, "coef_")
    assert clf.coef_.shape == (5, 16) and clf.intercept_.shape == (5,)
    assert list(clf.classes_) == [0, 1, 2, 3, 4] and clf.n_features_in_ == 16
    assert clf.target_form_ == "matrix" and clf.batch_size_ == 8
    assert clf.loss_params_ == {"eps_pos": 0.0, "eps_neg": 0.1}
    assert clf.best_epoch_ == 3 and clf.best_score_ is None  # no validation: the last epoch
    assert [h["epoch"] for h in clf.history_] == [1, 2, 3] and "val_map" not in clf.history_[0]
    P = clf.predict_proba(X)
    assert P.shape == (120, 5) and P.dtype == np.float32 and ((P > 0) & (P < 1)).all()
    logits = clf.decision_function(X)
    assert np.allclose(P, 1 / (1 + np.exp(-logits.astype(np.float64))), atol=1e-6)
    assert np.array_equal(clf.decision_function(X), logits)
    # A label matrix in, the indicator matrix out: every class above the threshold.
    assert np.array_equal(clf.predict(X), (P > 0.5).astype(np.int64))
    assert np.array_equal(clf.predict_multilabel(X), clf.predict(X))
    assert (clf.set_params(threshold=0.0).predict(X) == 1).all()
    assert np.array_equal(clf.set_params(threshold=0.9).predict(X), (P > 0.9).astype(np.int64))
    clf.set_params(threshold=0.5)
    restored = pickle.loads(pickle.dumps(clf))
    assert np.array_equal(restored.predict_proba(X), P)


def test_probabilities_do_not_depend_on_where_a_logit_sits(arrays):
    """A row's probabilities are the same alone, in a subset or in another order (scikit-learn's
    invariance checks): a plain torch.sigmoid computes the last values of each call on its
    scalar path, which rounds differently."""
    X, Z, _ = arrays
    logits = SPMLClassifier(**FAST).fit(X, Z).logits(X)
    orders = [np.random.default_rng(seed).permutation(len(X)) for seed in range(20)]
    plain = torch.sigmoid(torch.from_numpy(logits))
    assert any(not torch.equal(plain[order], torch.sigmoid(torch.from_numpy(logits[order])))
               for order in orders)  # what this guards against
    P = probabilities(logits)
    assert P.dtype == np.float32 and np.allclose(P, plain.numpy(), rtol=0, atol=1e-7)
    for order in orders:
        assert np.array_equal(probabilities(logits[order]), P[order])
    for rows in (slice(0, 1), slice(3, 10), slice(100, 120)):
        assert np.array_equal(probabilities(logits[rows]), P[rows])
    assert probabilities(logits[:0]).shape == (0, 5)


def test_same_seed_same_head_and_another_seed_another(arrays):
    X, Z, _ = arrays
    a = SPMLClassifier(seed=0, **FAST).fit(X, Z)
    b = SPMLClassifier(seed=0, **FAST).fit(X, Z)
    c = SPMLClassifier(seed=1, **FAST).fit(X, Z)
    assert np.array_equal(a.coef_, b.coef_)
    assert not np.array_equal(a.coef_, c.coef_)


@pytest.mark.parametrize("call, message", [
    (lambda clf, X, Z: clf.fit(X, X[:, 0]), "Unknown label type: 'continuous'"),
    (lambda clf, X, Z: clf.fit(X, Z * 2), "Unknown label type: y row 0, column 1 holds 2; a label matrix may hold only -1, 0, 1"),
    (lambda clf, X, Z: clf.fit(X, Z * 0.5), "Unknown label type: y row 0, column 1 holds 0.5"),
    (lambda clf, X, Z: clf.fit(X, np.where(Z == 1, "a", "b")), "Unknown label type: y row 0, column 0 holds 'b'"),
    (lambda clf, X, Z: clf.fit(X, np.zeros_like(Z)), "y has no observed label in any row"),
    (lambda clf, X, Z: clf.set_params(classes=["a", "b"]).fit(X, Z), "classes names 2 classes but y has 5 columns"),
    (lambda clf, X, Z: clf.set_params(classes=[0, 1, 2]).fit(X, Z.argmax(1)), "y row 2 holds the label 4, which is not among the classes [0, 1, 2]"),
    (lambda clf, X, Z: clf.fit(X[:10], Z), "inconsistent numbers of samples"),
    (lambda clf, X, Z: clf.fit(X, Z, y_full=np.zeros_like(Z)), "y_full says it is negative"),
    (lambda clf, X, Z: clf.fit(X, Z, eval_set=(X[:, :3], Z)), "X has 3 features, but SPMLClassifier is expecting 16"),
    (lambda clf, X, Z: clf.fit(X, Z, eval_set=(X, Z[:, :2])), "has 2 columns but the classifier has 5"),
    (lambda clf, X, Z: clf.set_params(validation_fraction=0.2).fit(X, Z, eval_set=(X, Z)), "either eval_set or validation_fraction"),
    (lambda clf, X, Z: clf.set_params(loss="an_ls").fit(X, Z), "did you mean 'an-ls'"),
    (lambda clf, X, Z: clf.set_params(loss_params={"eps": 0.1}).fit(X, Z), "has no parameter 'eps'"),
    (lambda clf, X, Z: clf.set_params(loss_params={"eps_pos": 2.0}).fit(X, Z), "The 'eps_pos' parameter of the loss 'an-ls' (loss_params of SPMLClassifier) must be a float in the range [0.0, 1.0]. Got 2.0 instead."),
    (lambda clf, X, Z: clf.set_params(validation_fraction=1.5).fit(X, Z), "The 'validation_fraction' parameter of SPMLClassifier must be a float in the range (0.0, 1.0) or None. Got 1.5 instead."),
    (lambda clf, X, Z: clf.set_params(lr=0).fit(X, Z), "The 'lr' parameter of SPMLClassifier must be a float in the range (0.0, inf)"),
    (lambda clf, X, Z: clf.set_params(batch_size=0).fit(X, Z), "The 'batch_size' parameter of SPMLClassifier must be an int in the range [1, inf)"),
    (lambda clf, X, Z: clf.set_params(epochs=2.5).fit(X, Z), "The 'epochs' parameter of SPMLClassifier must be an int in the range [1, inf)"),
    (lambda clf, X, Z: clf.set_params(early_stop="kimm").fit(X, Z), "The 'early_stop' parameter of SPMLClassifier must be a str among"),
    (lambda clf, X, Z: clf.set_params(spatial_shape=(1, 16)).fit(X, Z), "The 'spatial_shape' parameter of SPMLClassifier must be an (h, w, D) tuple of 3 positive ints or None"),
    (lambda clf, X, Z: clf.set_params(threshold=1.5).fit(X, Z), "The 'threshold' parameter of SPMLClassifier must be a float in the range [0.0, 1.0]"),
])
def test_bad_input_gets_one_clear_error(arrays, call, message):
    X, Z, _ = arrays
    with pytest.raises(ValueError, match=None) as caught:
        call(SPMLClassifier(**FAST), X, Z)
    assert message in str(caught.value)


def test_predicting_checks_the_width_with_scikit_learns_message(arrays):
    X, Z, _ = arrays
    clf = SPMLClassifier(**FAST).fit(X, Z)
    with pytest.raises(ValueError, match="X has 4 features, but SPMLClassifier is expecting 16"):
        clf.predict_proba(X[:, :4])


# ------------------------------------------------------------------ y as it comes
NAMES = np.array(["bird", "cat", "dog", "fox", "owl"])  # sorted: column i is NAMES[i]


def test_class_labels_train_the_same_head_as_their_label_matrix(arrays):
    X, Z, _ = arrays
    labels = NAMES[Z.argmax(axis=1)]  # each row's one observed positive, as strings
    by_labels = SPMLClassifier(**FAST).fit(X, labels)
    by_matrix = SPMLClassifier(**FAST).fit(X, Z)
    assert by_labels.target_form_ == "labels" and list(by_labels.classes_) == list(NAMES)
    assert np.array_equal(by_labels.coef_, by_matrix.coef_)  # the same numbers
    assert np.array_equal(by_labels.predict_proba(X), by_matrix.predict_proba(X))
    P = by_labels.predict_proba(X)
    assert P.shape == (120, 5) and not np.allclose(P.sum(axis=1), 1)  # independent per class
    predicted = by_labels.predict(X)
    assert predicted.shape == (120,) and predicted.dtype == NAMES.dtype
    assert np.array_equal(predicted, NAMES[P.argmax(axis=1)])
    assert np.array_equal(by_labels.decision_function(X), by_labels.logits(X))
    assert np.array_equal(by_labels.predict_multilabel(X), by_matrix.predict(X))
    assert by_labels.score(X, labels) == pytest.approx(by_matrix.score(X, Z))
    assert (predicted == labels).mean() > 0.5


def test_an_eval_set_of_class_labels_selects_as_its_label_matrix(arrays):
    X, Z, _ = arrays
    tr, va = split_train_val(len(X))
    labels = NAMES[Z.argmax(axis=1)]
    by_labels = SPMLClassifier(epochs=4, batch_size=8, lr=1e-2).fit(
        X[tr], labels[tr], eval_set=(X[va], labels[va]))
    by_matrix = SPMLClassifier(epochs=4, batch_size=8, lr=1e-2).fit(
        X[tr], Z[tr], eval_set=(X[va], Z[va]))
    assert by_labels.best_epoch_ == by_matrix.best_epoch_
    assert by_labels.best_score_ == by_matrix.best_score_
    assert np.array_equal(by_labels.coef_, by_matrix.coef_)


def test_classes_names_unobserved_classes_in_the_given_order(arrays):
    X, Z, _ = arrays
    observed = Z.argmax(axis=1)
    seen = observed != 4
    order = [4, 3, 2, 1, 0, 9]  # 4 and 9 never observed as a row's positive
    clf = SPMLClassifier(classes=order, **FAST).fit(X[seen], observed[seen])
    assert list(clf.classes_) == order and clf.coef_.shape == (6, 16)
    assert clf.predict_proba(X).shape == (120, 6)
    assert set(clf.predict(X)) <= set(order)


def test_two_class_labels_follow_scikit_learns_binary_shapes(arrays):
    X, Z, _ = arrays
    labels = np.where(Z[:, 0] == 1, "yes", "no")
    clf = SPMLClassifier(**FAST).fit(X, labels)
    logits = clf.logits(X)
    margin = clf.decision_function(X)
    assert margin.shape == (120,) and np.array_equal(margin, logits[:, 1] - logits[:, 0])
    assert np.array_equal(clf.predict(X), clf.classes_[(margin > 0).astype(int)])
    assert clf.predict_proba(X).shape == (120, 2)


def test_a_column_of_labels_is_taken_as_labels_with_scikit_learns_warning(arrays):
    X, Z, _ = arrays
    labels = Z.argmax(axis=1)
    with pytest.warns(DataConversionWarning, match="A column-vector y was passed"):
        column = SPMLClassifier(**FAST).fit(X, labels[:, None])
    assert column.target_form_ == "labels"
    assert np.array_equal(column.coef_, SPMLClassifier(**FAST).fit(X, labels).coef_)


def test_rows_without_any_observation_are_left_out_with_a_warning(arrays):
    X, Z, full = arrays
    holey = Z.copy()
    holey[[3, 50, 77]] = 0
    with pytest.warns(FeatcacheWarning, match=r"left out 3 of 120 rows with no observed label "
                                              r"\(all 0; rows 3, 50, 77\)"):
        clf = SPMLClassifier(**FAST).fit(X, holey, y_full=full)
    kept = np.setdiff1d(np.arange(120), [3, 50, 77])
    alone = SPMLClassifier(**FAST).fit(X[kept], Z[kept], y_full=full[kept])
    assert np.array_equal(clf.coef_, alone.coef_)


def test_a_batch_larger_than_the_rows_is_clipped_with_a_warning(arrays):
    X, Z, _ = arrays
    with pytest.warns(FeatcacheWarning, match="batch_size=1000 is larger than the 120 training "
                                              "rows: trained with batch_size=120"):
        clf = SPMLClassifier(epochs=2, batch_size=1000).fit(X, Z)
    assert clf.batch_size_ == 120 and clf.get_params()["batch_size"] == 1000
    assert np.array_equal(clf.coef_, SPMLClassifier(epochs=2, batch_size=120).fit(X, Z).coef_)


def test_an_unknown_loss_gets_scikit_learns_error_and_the_closest_names(arrays):
    X, Z, _ = arrays
    with pytest.raises(InvalidParameterError, match=r"The 'loss' parameter of SPMLClassifier must "
                                                     r"be a str among \{'bce', .*\}\. Got 'an_ls' instead\. .*did you mean 'an-ls'"):
        SPMLClassifier(loss="an_ls").fit(X, Z)


def test_grid_search_on_class_labels_with_a_shuffled_kfold(arrays):
    X, Z, _ = arrays
    labels = NAMES[Z.argmax(axis=1)]
    folds = KFold(n_splits=3, shuffle=True, random_state=0)
    search = GridSearchCV(SPMLClassifier(**FAST), {"lr": [1e-1, 1e-3]}, cv=folds).fit(X, labels)
    assert search.best_estimator_.target_form_ == "labels"
    by_scorer = GridSearchCV(SPMLClassifier(**FAST), {"lr": [1e-1, 1e-3]}, cv=folds,
                             scoring=map_scorer).fit(X, labels)
    assert np.allclose(by_scorer.cv_results_["mean_test_score"], search.cv_results_["mean_test_score"])
    held = next(iter(folds.split(X)))
    fitted = SPMLClassifier(lr=search.best_params_["lr"], **{k: v for k, v in FAST.items() if k != "lr"})
    fitted.fit(X[held[0]], labels[held[0]])
    assert search.cv_results_["split0_test_score"][search.best_index_] == pytest.approx(
        fitted.score(X[held[1]], labels[held[1]]))


def test_a_pipeline_after_standard_scaler_and_grid_search_with_an_map_scorer(arrays):
    X, Z, full = arrays
    pipe = make_pipeline(StandardScaler(), SPMLClassifier(validation_fraction=0.2, **FAST))
    pipe.fit(X * 50 + 3, Z, spmlclassifier__y_full=full)
    scaled = StandardScaler().fit(X * 50 + 3)
    alone = SPMLClassifier(validation_fraction=0.2, **FAST).fit(scaled.transform(X * 50 + 3), Z,
                                                                 y_full=full)
    assert np.allclose(pipe.predict_proba(X * 50 + 3), alone.predict_proba(scaled.transform(X * 50 + 3)))
    assert pipe.score(X * 50 + 3, full) == pytest.approx(alone.score(scaled.transform(X * 50 + 3), full))
    search = GridSearchCV(SPMLClassifier(**FAST), {"lr": [1e-1, 1e-2, 1e-4]}, scoring=map_scorer,
                          cv=3)
    search.fit(X, Z)
    assert search.best_params_["lr"] in (1e-1, 1e-2, 1e-4)
    assert len(search.cv_results_["mean_test_score"]) == 3
    assert 0 < search.best_score_ <= 100  # mAP in percent, against the held-out observed positives
    assert search.best_estimator_.coef_.shape == (5, 16)


def test_validation_selects_the_first_best_epoch(arrays):
    X, Z, full = arrays
    tr, va = split_train_val(len(X))
    clf = SPMLClassifier(epochs=6, batch_size=8, lr=1e-2).fit(X[tr], Z[tr], eval_set=(X[va], full[va]))
    scores = [h["val_map"] for h in clf.history_]
    assert clf.best_epoch_ == int(np.argmax(scores)) + 1  # argmax: the first maximum
    assert clf.best_score_ == pytest.approx(max(scores))
    held = SPMLClassifier(epochs=6, batch_size=8, lr=1e-2, validation_fraction=0.2).fit(X, Z)
    same = SPMLClassifier(epochs=6, batch_size=8, lr=1e-2).fit(X[tr], Z[tr], eval_set=(X[va], Z[va]))
    assert np.array_equal(held.coef_, same.coef_)  # the protocol's split, observed positives


def test_score_warns_about_classes_without_positives(arrays):
    X, Z, full = arrays
    clf = SPMLClassifier(**FAST).fit(X, Z)
    targets = full.copy()
    targets[:, 4] = 0
    with pytest.warns(FeatcacheWarning, match=r"1 of 5 classes have no positive .*\(4\).* over the 4 with positives"):
        value = clf.score(X, targets)
    probs = torch.from_numpy(clf.predict_proba(X))
    assert value == pytest.approx(float(mean_average_precision(probs, torch.from_numpy(targets).float())))


# ------------------------------------------------------------------ losses and their needs
def _needs_full(name):
    return FULL_LABELS in loss_class(name).needs


@pytest.mark.parametrize("name", loss_names())
def test_every_loss_trains_when_its_needs_are_met(arrays, name):
    X, Z, full = arrays
    y = observe_uniform(full, num_neg=1) if OBSERVED_NEGATIVES in loss_class(name).needs else Z
    # BoostLU's losses take rows of feature maps: here 1 x 1 maps of the D features
    spatial = (1, 1, X.shape[1]) if SPATIAL_FEATURES in loss_class(name).needs else None
    clf = SPMLClassifier(loss=name, epochs=2, batch_size=16, lr=1e-2, spatial_shape=spatial)
    pseudo = None
    if "pseudo_labels" in {need.key for need in loss_class(name).needs}:  # vlpl, gpr
        pseudo = np.random.default_rng(0).choice([-1, 0, 0, 1], size=full.shape)
    clf.fit(X, y, y_full=full, y_pseudo=pseudo)
    assert np.isfinite(clf.coef_).all() and set(clf.loss_params_) == set(loss_class(name).params)
    if "k" in clf.loss_params_:
        assert clf.loss_params_["k"] == pytest.approx(full.sum(1).mean())
    assert set(clf.loss_state_) == set(loss_class(name).learned_state)


@pytest.mark.parametrize("name, y_full, message", [
    ("bce", False, "trains on full labels, but the y given to SPMLClassifier.fit holds single positives only"),
    ("iu", True, "needs observed negatives (SPMLClassifier.fit takes full labels as y_full"),
    ("epr", False, "needs k (expected positives per image"),
    ("vlpl", True, "needs pseudo-labels 'vlpl'"),
])
def test_a_loss_whose_need_is_not_met_names_it(arrays, name, y_full, message):
    X, Z, full = arrays
    with pytest.raises(LossNeedError) as caught:
        SPMLClassifier(loss=name, **FAST).fit(X, Z, y_full=full if y_full else None)
    assert message in str(caught.value)
    if name == "vlpl":
        assert "y_pseudo=P" in str(caught.value)
    if name == "epr":
        assert "loss_params={'k': VALUE}" in str(caught.value)
        SPMLClassifier(loss=name, loss_params={"k": 2.0}, **FAST).fit(X, Z)  # given k: fine


def test_a_device_that_is_not_there_is_refused(arrays):
    X, Z, _ = arrays
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(OptionError, match="CUDA is not available"):
        SPMLClassifier(device="cuda", **FAST).fit(X, Z)


# ------------------------------------------------------------------ the same trainer as stage two
def test_it_reproduces_a_train_linear_configuration(cache_dir):
    """One configuration of train-linear's grid, by the estimator from the same arrays:
    the same head, the same test mAP."""
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "role", "--run-id", "g",
                    "--epochs", "4", "--lr", "1e-2,1e-3", "--bsize", "8,16", "--seeds", "1",
                    "--quiet", "--no-plots", "--device", "cpu")
    assert result.exit_code == 0, result.output
    run = cache_dir / "toy" / "runs" / "role" / "g"
    document, head = load_results(run), load_head(run)
    data = load_linear_data(cache_dir / "toy" / "labels.h5", cache_dir / "toy" / "features-toy.h5")
    labels = load_labels(cache_dir / "toy" / "labels.h5")
    config = document["selection"]
    clf = SPMLClassifier(loss="role", lr=config["lr"], batch_size=config["batch_size"], epochs=4,
                         seed=1)
    clf.fit(data.train.features.numpy(), data.train.observed.numpy(),
            y_full=data.train.clean.numpy(), eval_set=(data.val.features.numpy(),
                                                       data.val.clean.numpy()))
    assert clf.loss_params_ == config["params"]  # k over train + val rows, as the labels file's
    assert clf.best_epoch_ == config["epoch"]
    # The grid trains its two learning rates as stacked heads, the estimator one head: the
    # batched matmul may round the last bit differently, nothing more.
    assert np.abs(clf.coef_ - head["weight"].numpy()).max() < 1e-5
    assert np.abs(clf.loss_state_["phi"] - head["handoff"]["phi"].numpy()).max() < 1e-5
    test = clf.score(data.test.features.numpy(), labels.test.clean)
    assert test == pytest.approx(config["test_map"], abs=1e-6)


@pytest.mark.shared_data
def test_the_issue_example_runs_on_scene_and_matches_train_linear(shared_data, tmp_path):
    npz = np.load(shared_data / "scene" / "scene.npz")
    X, Y_clean = npz["X_train"], npz["Y_train"]
    Y_observed = observe_uniform(Y_clean)  # the protocol sampler, as `featcache prepare` draws

    # The README's code block, as written.
    clf = SPMLClassifier(loss="an-ls", loss_params={"eps_pos": 0.0}, lr=1e-3, batch_size=16, epochs=25, seed=0)
    clf.fit(X, Y_observed)
    P = clf.predict_proba(X)
    clf.predict(X)
    clf.decision_function(X)
    assert P.shape == Y_clean.shape and 0 < clf.score(X, Y_clean) <= 100

    # The same configuration as train-linear's grid point, selected on the protocol's split.
    cache = tmp_path / "cache"
    assert invoke("prepare", "features", "--npz", shared_data / "scene" / "scene.npz", "--name",
                  "scene", "--cache", cache).exit_code == 0
    result = invoke("train-linear", "--dataset", "scene", "--loss", "an-ls", "--param",
                    "eps_pos=0", "--run-id", "grid", "--quiet", "--no-plots", "--device", "cpu",
                    "--cache", cache)
    assert result.exit_code == 0, result.output
    configs = load_results(cache / "scene" / "runs" / "an-ls" / "grid")["seeds"][0]["configs"]
    same = next(c for c in configs if (c["lr"], c["batch_size"]) == (1e-3, 16))
    train, val = split_train_val(len(X))
    clf.fit(X[train], Y_observed[train], eval_set=(X[val], Y_clean[val]))
    assert clf.best_epoch_ == same["best_epoch"]
    assert clf.best_score_ == pytest.approx(same["val_map"], abs=1e-6)
    assert clf.score(npz["X_test"], npz["Y_test"]) == pytest.approx(same["test_map"], abs=1e-6)


def test_import_featcache_does_not_import_torch():
    code = ("import sys, featcache; assert 'torch' not in sys.modules; "
            "featcache.SPMLClassifier; assert 'torch' in sys.modules; "
            "import featcache.cli as cli; print(sorted(featcache.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "SPMLClassifier" in done.stdout and "load_run" in done.stdout
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import featcache

        featcache.nope  # noqa: B018


def _class_ordered(arrays):
    """The toy rows ordered by their observed class, as many real sets are stored."""
    X, Z, full = arrays
    order = np.argsort(Z.argmax(axis=1), kind="stable")
    return X[order], Z[order]


def test_a_fold_that_loses_classes_warns_and_says_to_shuffle(arrays):
    X, Z = _class_ordered(arrays)
    with pytest.warns(FeatcacheWarning, match=r"no positive in the scored split .*shuffle them: "
                      r"cv=KFold\(n_splits=5, shuffle=True, random_state=0\)"):
        GridSearchCV(SPMLClassifier(**FAST), {"lr": [1e-2]}, scoring=map_scorer, cv=3).fit(X, Z)


def test_the_documented_grid_search_recipe_runs_and_its_folds_keep_every_class(arrays):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S)
              if "GridSearchCV" in b and "Y_observed" in b]
    assert len(blocks) == 1 and "shuffle=True" in blocks[0]
    X, Y_observed = _class_ordered(arrays)
    scope = {"X": X, "Y_observed": Y_observed}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatcacheWarning)
        exec(blocks[0], scope)  # noqa: S102 - the documented recipe
    search = scope["search"]
    assert search.best_params_["lr"] in (1e-2, 1e-3, 1e-4)
    assert 0 < search.best_score_ <= 100


class Frame:
    """What a DataFrame offers ``score`` (pandas is not a dependency): column names and
    values."""

    def __init__(self, values, columns):
        self.values, self.columns = np.asarray(values), list(columns)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def __len__(self):
        return len(self.values)


@pytest.mark.shared_data
def test_a_label_matrix_is_scored_only_when_its_columns_match_classes(shared_data):
    """Issue 36, item 10: fitted on class names (classes_ sorted), scored with scene's label
    matrix in the file's own column order: the columns were silently misaligned."""
    npz = np.load(shared_data / "scene" / "scene.npz")
    names = npz["label_names"].astype(str)
    assert list(names) != sorted(names)  # the file's order is not the sorted one
    observed = observe_uniform(npz["Y_train"])
    y = names[observed.argmax(axis=1)]  # each row's observed positive, by name
    X_test, Y_test = npz["X_test"], npz["Y_test"]
    clf = SPMLClassifier(loss="an-ls", epochs=5).fit(npz["X_train"], y)
    assert list(clf.classes_) == sorted(names)
    aligned = Y_test[:, [list(names).index(c) for c in clf.classes_]]
    right = mean_average_precision(torch.from_numpy(clf.predict_proba(X_test)),
                                   torch.from_numpy(aligned).float()).item()
    with pytest.raises(ValueError, match="y is a label matrix without column names, but the "
                       "classifier was fitted on class labels: classes_ .* are their sorted "
                       "order"):
        clf.score(X_test, Y_test)
    assert clf.score(X_test, Frame(Y_test, names)) == pytest.approx(right)  # matched by name
    with pytest.raises(ValueError, match=r"y's columns .* are not the classes .*: missing "
                                         r"\['Beach'\], unknown \['beach'\]"):
        clf.score(X_test, Frame(Y_test, ["beach", *names[1:]]))
    search = GridSearchCV(SPMLClassifier(loss="an-ls", epochs=5), {"lr": [1e-3]},
                          cv=KFold(3, shuffle=True, random_state=0)).fit(npz["X_train"], y)
    with pytest.raises(ValueError, match="without column names"):
        search.score(X_test, Y_test)
    with pytest.raises(ValueError, match="y_full is a label matrix without column names"):
        SPMLClassifier(loss="bce", epochs=1).fit(npz["X_train"], y, y_full=npz["Y_train"])
    # given classes= (the matrix's order), the columns follow it
    ordered = SPMLClassifier(loss="an-ls", epochs=5, classes=names).fit(npz["X_train"], y)
    assert ordered.score(X_test, Y_test) == pytest.approx(right, abs=0.5)
    assert right > 50  # the misaligned score was about half of it


@pytest.mark.parametrize("y, message", [
    (np.array(["a"] * 20), r"y holds only one class \(\['a'\]\): a classifier needs at least 2 "
                           r"classes \(with one, every row is positive and mAP is 100 by "
                           r"construction\)"),
    (np.array(["a"] * 10 + [None] + ["b"] * 9, dtype=object),
     "y row 10 holds None: every row needs its observed positive"),
    (np.array(["a"] * 10 + [1] * 10, dtype=object), "y mixes labels of the kinds number, string"),
])
def test_one_class_and_missing_or_mixed_labels_are_refused(y, message):
    """Issue 36, item 11: one class fitted silently; None raised a bare TypeError."""
    X = np.random.default_rng(0).random((20, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=message):
        SPMLClassifier(**FAST).fit(X, y)


def test_a_one_class_feature_set_is_refused_at_prepare(tmp_path, cache_dir):
    """Issue 36, item 11: a one-class npz trained to "val 100.00 test 100.00" without a word."""
    rng = np.random.default_rng(0)
    npz = tmp_path / "one.npz"
    np.savez(npz, X_train=rng.random((20, 4)), X_test=rng.random((10, 4)),
             Y_train=np.ones((20, 1), dtype=np.uint8), Y_test=np.ones((10, 1), dtype=np.uint8),
             label_names=np.array(["cat"]))
    result = invoke("prepare", "features", "--npz", npz, "--name", "one")
    assert result.exit_code == 1
    assert result.output == (f"Error: {npz}: names only 1 class ('cat'): every image kept has it "
                             "(images without a positive label are dropped), so every AP would "
                             "be 100 by construction; a multi-label dataset needs at least 2 "
                             "classes\n")
    assert not (cache_dir / "one").exists()
