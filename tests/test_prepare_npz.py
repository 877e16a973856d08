"""``featcache prepare features``: precomputed feature sets into the stage-one cache format."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_fixtures import invoke

from featcache.data.featurefile import load_features, read_feature_attrs
from featcache.data.formats.npz import read_npz
from featcache.data.labelfile import load_labels
from featcache.errors import InputError


def toy_arrays():
    rng = np.random.RandomState(0)
    y_train = np.array([[1, 0, 0], [0, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 1], [1, 0, 1]],
                       dtype=np.uint8)
    y_test = np.array([[0, 1, 0], [1, 0, 1], [0, 0, 0]], dtype=np.uint8)
    return {"X_train": rng.rand(6, 4).astype(np.float32), "X_test": rng.rand(3, 4).astype(np.float32),
            "Y_train": y_train, "Y_test": y_test, "label_names": np.array(["a", "b", "c"]),
            "feature_names": np.array(["f0", "f1", "f2", "f3"])}


def save(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.shared_data
def test_real_scene_import(shared_data, cache_dir):
    npz = shared_data / "scene" / "scene.npz"
    result = invoke("prepare", "features", "--npz", npz, "--name", "scene")
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "scene" / "labels.h5")
    features = load_features(cache_dir / "scene" / "features-imported.h5", labels)
    assert features.train.shape == (1211, 294) and features.test.shape == (1196, 294)
    with np.load(npz) as data:
        assert np.array_equal(features.train, data["X_train"])
        assert np.array_equal(labels.train.clean, data["Y_train"])
        assert labels.classes == data["label_names"].tolist()
    assert labels.train.images[17] == "train/000017"
    assert labels.provenance["labels_only"] is True
    assert (labels.train_index.size, labels.val_index.size) == (969, 242)
    assert features.attrs["weights"] == "none"
    assert features.attrs["backbone"] == "imported"
    assert features.attrs["feature_names"] == 294
    assert features.attrs["source_npz_sha256"] == labels.provenance["sources"][0]["sha256"]


def test_rows_without_positive_leave_labels_and_features(tmp_path, cache_dir):
    arrays = toy_arrays()
    npz = save(tmp_path / "toy.npz", **arrays)
    result = invoke("prepare", "features", "--npz", npz, "--name", "toy", "--backbone", "raw")
    assert result.exit_code == 0, result.output
    assert "train: dropped 1 of 6 images with no positive label (train/000001)" in result.output
    labels = load_labels(cache_dir / "toy" / "labels.h5")
    features = load_features(cache_dir / "toy" / "features-raw.h5", labels)
    assert labels.train.images.tolist() == ["train/000000", "train/000002", "train/000003",
                                            "train/000004", "train/000005"]
    assert np.array_equal(features.train, arrays["X_train"][[0, 2, 3, 4, 5]])
    assert labels.test.images.tolist() == ["test/000000", "test/000001"]
    assert np.array_equal(features.test, arrays["X_test"][:2])


def test_existing_outputs_are_refused_before_any_work(tmp_path, cache_dir):
    npz = save(tmp_path / "toy.npz", **toy_arrays())
    assert invoke("prepare", "features", "--npz", npz, "--name", "toy").exit_code == 0
    features = cache_dir / "toy" / "features-imported.h5"
    labels = cache_dir / "toy" / "labels.h5"
    before = (labels.read_bytes(), features.read_bytes())
    labels.unlink()
    result = invoke("prepare", "features", "--npz", npz, "--name", "toy")
    assert result.exit_code == 1 and "features-imported.h5 already exists" in result.output
    assert not labels.exists() and features.read_bytes() == before[1]
    result = invoke("prepare", "features", "--npz", npz, "--name", "toy", "--overwrite")
    assert result.exit_code == 0, result.output
    assert read_feature_attrs(features)["labels_sha256"] == load_labels(labels).sha256


@pytest.mark.parametrize("change, message", [
    (lambda a: a["X_train"].__setitem__((4, 2), np.nan), r"X_train holds NaN or Inf in 1 row \(row 4\)"),
    (lambda a: a["X_test"].__setitem__((0, 0), np.inf), r"X_test holds NaN or Inf in 1 row \(row 0\)"),
    (lambda a: a.__setitem__("Y_train", a["Y_train"][:5]), "Y_train has 5 rows but X_train has 6"),
    (lambda a: a.__setitem__("X_test", a["X_test"][:, :3]), "X_train has 4 features per row but X_test has 3"),
    (lambda a: a["Y_test"].__setitem__((1, 2), 3), r"Y_test row 1, column 2 holds 3; labels must be 0 or 1"),
    (lambda a: a.__setitem__("label_names", np.array(["a", "b"])), "Y_train has 3 columns but label_names names 2"),
    (lambda a: a.__setitem__("label_names", np.array(["a", "b", "a"])), "label_names repeats a"),
    (lambda a: a.pop("Y_test"), "lacks the key.* Y_test"),
    (lambda a: a.__setitem__("feature_names", np.array(["f0"])), "feature_names has 1 name but"),
    (lambda a: a.__setitem__("X_train", a["X_train"][0]), r"X_train has shape \(4,\)"),
])
def test_bad_feature_sets(tmp_path, change, message):
    arrays = toy_arrays()
    change(arrays)
    npz = save(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match=message):
        read_npz(npz, "bad")


def test_unreadable_file(tmp_path):
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(InputError, match="broken.npz is not a readable .npz file"):
        read_npz(tmp_path / "broken.npz", "x")
    with pytest.raises(InputError, match="feature file .*absent.npz is missing"):
        read_npz(tmp_path / "absent.npz", "x")


def test_a_missing_label_names_key_is_named_not_blamed_on_unpickling(tmp_path, cache_dir):
    arrays = toy_arrays()
    del arrays["label_names"]
    np.savez(tmp_path / "nolabels.npz", **arrays)
    result = invoke("prepare", "features", "--npz", tmp_path / "nolabels.npz", "--name", "x")
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert "lacks the key label_names (label_names: one class name per column" in error
    assert "unpickling" not in error and "it holds X_test, X_train, Y_test, Y_train, feature_names" in error
    arrays = toy_arrays()
    arrays["label_names"] = np.array(["a", "b", "c"], dtype=object)
    np.savez(tmp_path / "objects.npz", **arrays)
    result = invoke("prepare", "features", "--npz", tmp_path / "objects.npz", "--name", "x")
    assert result.exit_code == 1
    assert "label_names holds Python objects, which featcache does not unpickle" in result.output
    assert "label_names=np.array(values, dtype=str)" in result.output


def test_imported_features_are_not_sent_looking_for_images(tmp_path, cache_dir):
    np.savez(tmp_path / "set.npz", **toy_arrays())
    assert invoke("prepare", "features", "--npz", tmp_path / "set.npz", "--name", "imp").exit_code == 0
    for command in (["features", "--dataset", "imp", "--device", "cpu"],
                    ["finetune", "--dataset", "imp", "--loss", "an", "--init", "none",
                     "--device", "cpu"]):
        result = invoke(*command)
        assert result.exit_code == 1
        error = result.output.strip().splitlines()[-1]
        assert "was imported from a precomputed feature set" in error and "no images" in error
        assert "--images-root" not in error
        assert "`featcache train-linear --dataset imp`" in error
