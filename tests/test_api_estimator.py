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
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from featcache import SPMLClassifier, map_scorer
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
    assert clf.loss_params_ == {"eps_pos": 0.0, "eps_neg": 0.1}
    assert clf.best_epoch_ == 3 and clf.best_score_ is None  # no validation: the last epoch
    assert [h["epoch"] for h in clf.history_] == [1, 2, 3] and "val_map" not in clf.history_[0]
    P = clf.predict_proba(X)
    assert P.shape == (120, 5) and P.dtype == np.float32 and ((P > 0) & (P < 1)).all()
    logits = clf.decision_function(X)
    assert np.allclose(P, 1 / (1 + np.exp(-logits.astype(np.float64))), atol=1e-6)
    assert set(np.unique(clf.predict(X, threshold=0.5))) <= {0, 1}
    assert (clf.predict(X, threshold=0.0) == 1).all()
    restored = pickle.loads(pickle.dumps(clf))
    assert np.array_equal(restored.predict_proba(X), P)


def test_same_seed_same_head_and_another_seed_another(arrays):
    X, Z, _ = arrays
    a = SPMLClassifier(seed=0, **FAST).fit(X, Z)
    b = SPMLClassifier(seed=0, **FAST).fit(X, Z)
    c = SPMLClassifier(seed=1, **FAST).fit(X, Z)
    assert np.array_equal(a.coef_, b.coef_)
    assert not np.array_equal(a.coef_, c.coef_)


@pytest.mark.parametrize("call, message", [
    (lambda clf, X, Z: clf.fit(X, Z[:, 0]), "must be a 2-D label matrix"),
    (lambda clf, X, Z: clf.fit(X, Z * 2), "may hold only -1, 0, 1"),
    (lambda clf, X, Z: clf.fit(X[:10], Z), "inconsistent numbers of samples"),
    (lambda clf, X, Z: clf.fit(X, Z, y_full=np.zeros_like(Z)), "y_full says it is negative"),
    (lambda clf, X, Z: clf.fit(X, Z, eval_set=(X[:, :3], Z)), "X has 3 features, but SPMLClassifier is expecting 16"),
    (lambda clf, X, Z: clf.fit(X, Z, eval_set=(X, Z[:, :2])), "has 2 columns but the classifier has 5"),
    (lambda clf, X, Z: clf.set_params(validation_fraction=0.2).fit(X, Z, eval_set=(X, Z)), "either eval_set or validation_fraction"),
    (lambda clf, X, Z: clf.set_params(loss="an_ls").fit(X, Z), "did you mean 'an-ls'"),
    (lambda clf, X, Z: clf.set_params(loss_params={"eps": 0.1}).fit(X, Z), "has no parameter 'eps'"),
    (lambda clf, X, Z: clf.set_params(batch_size=1000).fit(X, Z), "larger than the 120 training rows"),
    (lambda clf, X, Z: clf.set_params(validation_fraction=1.5).fit(X, Z), "validation_fraction must be in (0, 1)"),
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

    # The issue's code block, as written.
    clf = SPMLClassifier(loss="an-ls", loss_params={"eps_pos": 0.0}, lr=1e-3, batch_size=16, epochs=25, seed=0)
    clf.fit(X, Y_observed)
    P = clf.predict_proba(X)
    clf.predict(X, threshold=0.5)
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


def test_the_readme_grid_search_recipe_runs_and_its_folds_keep_every_class(arrays):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "GridSearchCV" in b]
    assert len(blocks) == 1 and "shuffle=True" in blocks[0]
    X, Y_observed = _class_ordered(arrays)
    scope = {"X": X, "Y_observed": Y_observed}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatcacheWarning)
        exec(blocks[0], scope)  # noqa: S102 - the README's own recipe
    search = scope["search"]
    assert search.best_params_["lr"] in (1e-2, 1e-3, 1e-4)
    assert 0 < search.best_score_ <= 100
