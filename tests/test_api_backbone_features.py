"""``BackboneFeatures``: stage one's features from images, in a scikit-learn Pipeline.

On the embedded ``shapes`` images (20 training, 10 test) with random ResNet-50 weights at
32 x 32: the transformer's rows are the features file's bit for bit, the pipeline fits on image
paths and string labels, the on-disk cache is keyed by the network and the image bytes, and a
CLI run comes back as a fitted pipeline.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers_finetune import NAME, base_cache, linear_run
from helpers_images import write_image
from PIL import Image
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from featcache import BackboneFeatures, SPMLClassifier, load_run
from featcache.api import backbone_features
from featcache.data.featurefile import load_features, read_feature_attrs
from featcache.data.labelfile import load_labels
from featcache.data.shapes import prepare_shapes
from featcache.errors import InputError
from featcache.features.extract import ExtractOptions, extract_features

SIZE, BATCH = 32, 8
OPTIONS = {"weights": "random", "image_size": SIZE, "batch_size": BATCH, "progress": False}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """(cache, labels, features file) of a small shapes set extracted by stage one."""
    cache = tmp_path_factory.mktemp("shapes") / "cache"
    prepare_shapes(cache / "shapes", num_train=20, num_test=10)
    extract_features("shapes", ExtractOptions(weights="random", image_size=SIZE, batch_size=BATCH,
                                              device="cpu", workers=0, cache=str(cache)),
                     say=lambda _: None)
    return cache, load_labels(cache / "shapes" / "labels.h5"), cache / "shapes" / "features-resnet50-random.h5"


def paths_of(labels, split):
    return [str(Path(labels.image_root) / str(p)) for p in getattr(labels, split).images]


def test_the_rows_are_stage_ones_bit_for_bit(shapes):
    _, labels, file = shapes
    features = load_features(file)
    every = paths_of(labels, "train") + paths_of(labels, "test")
    transformer = BackboneFeatures(**OPTIONS).fit(every)
    rows = transformer.transform(every)
    assert rows.dtype == np.float32 and rows.shape == (30, 2048)
    assert np.array_equal(rows, np.concatenate([features.train, features.test]))
    attrs = read_feature_attrs(file)
    for key in ("backbone", "weights", "weights_sha256", "weights_seed", "image_size", "transform"):
        assert transformer.identity_[key] == attrs[key], key
    # Images already open go through the same steps.
    opened = [Image.open(p) for p in every]
    assert np.array_equal(transformer.transform(opened), rows)
    # One column of a 2-D array (what a ColumnTransformer hands over) is a list of images.
    assert np.array_equal(transformer.transform(np.array(every, dtype=object)[:, None]), rows)
    names = transformer.get_feature_names_out()
    assert len(names) == 2048 and names[0] == "backbonefeatures0"
    assert np.array_equal(pickle.loads(pickle.dumps(transformer)).transform(every[:3]), rows[:3])


def test_a_pipeline_fits_on_image_paths_and_string_labels(shapes):
    _, labels, file = shapes
    features = load_features(file)
    observed = labels.train.observed == 1
    names = np.array(labels.classes)[observed.argmax(axis=1)]
    # the classes in the labels file's column order: what scoring with its label matrix needs
    head = {"loss": "an-ls", "epochs": 3, "lr": 1e-2, "batch_size": 4,
            "classes": list(labels.classes)}
    pipe = make_pipeline(BackboneFeatures(**OPTIONS), SPMLClassifier(**head))
    pipe.fit(paths_of(labels, "train"), names)
    predicted = pipe.predict(paths_of(labels, "test"))
    assert predicted.shape == (10,) and set(predicted) <= set(labels.classes)
    alone = SPMLClassifier(**head).fit(features.train, names)
    np.testing.assert_allclose(pipe.predict_proba(paths_of(labels, "test")),
                               alone.predict_proba(features.test), atol=1e-5)
    assert 0 < pipe.score(paths_of(labels, "test"), labels.test.clean) <= 100


def test_the_cache_is_keyed_by_the_network_and_the_image_bytes(shapes, tmp_path, monkeypatch):
    _, labels, _ = shapes
    images = paths_of(labels, "test")[:4]
    copies = []
    for i, path in enumerate(images):
        copies.append(tmp_path / "images" / f"{i}.jpg")
        copies[-1].parent.mkdir(exist_ok=True)
        copies[-1].write_bytes(Path(path).read_bytes())
    store = tmp_path / "store"
    first = BackboneFeatures(cache=store, **OPTIONS).fit(copies)
    rows = first.transform(copies)
    folder = first.cache_dir_
    assert folder.parent == store and folder.name.startswith("images-resnet50-random-")
    assert len(list(folder.rglob("*.npy"))) == 4
    assert (folder / "identity.json").is_file()

    computed = []
    real = backbone_features.run_on_images
    monkeypatch.setattr(backbone_features, "run_on_images",
                        lambda names, *a, **k: computed.append(len(names)) or real(names, *a, **k))
    again = BackboneFeatures(cache=store, **OPTIONS).fit(copies)
    assert np.array_equal(again.transform(copies), rows) and computed == []  # all from the cache
    write_image(copies[2], seed=99)  # another image under the same name: computed again
    changed = again.transform(copies)
    assert computed == [1] and np.array_equal(changed[[0, 1, 3]], rows[[0, 1, 3]])
    assert not np.array_equal(changed[2], rows[2])
    other = BackboneFeatures(cache=store, **dict(OPTIONS, image_size=64)).fit(copies)
    other.transform(copies[:1])
    assert other.cache_dir_ != folder and computed == [1, 1]  # another network, another folder


def test_what_is_not_images_is_refused_naming_it(shapes, tmp_path):
    _, labels, _ = shapes
    transformer = BackboneFeatures(**OPTIONS).fit(paths_of(labels, "test")[:1])
    with pytest.raises(InputError, match=r"takes images: .* got a numeric array of shape \(3, 4\)"):
        transformer.transform(np.zeros((3, 4)))
    with pytest.raises(InputError, match="got one str: wrap it in a list"):
        transformer.transform(paths_of(labels, "test")[0])
    with pytest.raises(InputError, match=r"image .*nope.jpg \(item 1\) does not exist"):
        transformer.transform([paths_of(labels, "test")[0], str(tmp_path / "nope.jpg")])
    broken = write_image(tmp_path / "broken.jpg", kind="truncated")
    with pytest.raises(InputError, match=r"cannot read image .*broken.jpg: .*fix or remove it "
                                         r"\(BackboneFeatures gives one row per image\)"):
        transformer.transform([str(broken)])


def test_a_cli_run_comes_back_as_a_fitted_pipeline(tmp_path_factory):
    cache = base_cache(tmp_path_factory.getbasetemp())
    run = load_run(linear_run(cache))
    labels = load_labels(cache / NAME / "labels.h5")
    paths = [str(Path(labels.image_root) / str(p)) for p in labels.test.images]
    pipe = run.to_pipeline(progress=False)
    assert isinstance(pipe[0], BackboneFeatures) and isinstance(pipe[-1], SPMLClassifier)
    assert np.array_equal(pipe.predict_proba(paths), run.predict_proba_images(paths, progress=False))
    assert pipe.predict(paths).shape == (len(paths), len(run.classes))  # the run's label matrix
    refit = clone(pipe).fit(paths, labels.test.observed)  # the same recipe trains again
    assert refit[0].identity_["weights_sha256"] == pipe[0].identity_["weights_sha256"]


#: every check that hands the transformer numeric data instead of images (docs/api.md)
NUMERIC_INPUT = (
    "check_fit_score_takes_y", "check_estimators_overwrite_params",
    "check_dont_overwrite_parameters", "check_estimators_fit_returns_self",
    "check_readonly_memmap_input", "check_n_features_in_after_fitting",
    "check_positive_only_tag_during_fit", "check_estimators_dtypes", "check_complex_data",
    "check_dtype_object", "check_estimators_empty_data_messages", "check_pipeline_consistency",
    "check_estimators_nan_inf", "check_estimator_sparse_tag", "check_estimator_sparse_array",
    "check_estimator_sparse_matrix", "check_estimators_pickle", "check_f_contiguous_array_estimator",
    "check_transformer_data_not_an_array", "check_transformer_general",
    "check_transformer_preserve_dtypes", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_fit2d_1sample", "check_fit2d_1feature",
    "check_dict_unchanged", "check_fit_idempotent", "check_fit_check_is_fitted",
    "check_n_features_in", "check_fit2d_predict1d",
)


@parametrize_with_checks(
    [BackboneFeatures(**OPTIONS)],
    expected_failed_checks=lambda _: dict.fromkeys(
        NUMERIC_INPUT, "BackboneFeatures takes images (paths or PIL images); the check hands it "
                       "numbers, which it refuses naming the array's shape"),
    xfail_strict=True)
def test_scikit_learn_checks(estimator, check):
    check(estimator)


# ------------------------------------------------------------------ docs/api.md's examples
DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def docs_example(name: str) -> str:
    """The Python block after ``<!-- example: NAME -->`` in docs/api.md."""
    text = DOCS.read_text()
    start = text.index("```python\n", text.index(f"<!-- example: {name} -->")) + len("```python\n")
    return text[start:text.index("```", start)]


def run_docs_example(name: str, smaller: dict[str, str], capsys) -> list[str]:
    """Run docs/api.md's example ``name`` with each key of ``smaller`` (which it must hold)
    replaced by its value; returns the lines it printed."""
    code = docs_example(name)
    for old, new in smaller.items():
        assert old in code
        code = code.replace(old, new)
    exec(compile(code, str(DOCS), "exec"), {})
    return capsys.readouterr().out.splitlines()


def test_the_docs_shapes_example_runs(shapes, monkeypatch, capsys):
    cache, _, _ = shapes
    monkeypatch.chdir(cache.parent)
    printed = run_docs_example("shapes", {
        'weights="v1", image_size=224': 'weights="random", image_size=32, progress=False',
        "epochs=10": "epochs=2", "n_splits=5": "n_splits=3"}, capsys)
    assert "spmlclassifier__lr" in printed[0] and 0 < float(printed[1]) <= 100
    assert (cache / "image-features").is_dir()  # each image computed once, for every fold


@pytest.mark.shared_data
def test_the_docs_scene_example_runs(shared_data, capsys):
    printed = run_docs_example("scene", {
        '"../shared/data/scene/scene.npz"': repr(str(shared_data / "scene" / "scene.npz")),
        "epochs=25": "epochs=3", "n_splits=5": "n_splits=3"}, capsys)
    assert "'lr'" in printed[0] and 20 < float(printed[1]) <= 100
