"""The labels file: round trip, validation errors naming the key, atomic writes."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from dataset_fixtures import fail_when_writing

from featcache.data.labelfile import ImageNames, LabelSet, SplitLabels, load_labels, write_labels
from featcache.errors import InputError, OutputExistsError

CLEAN_TRAIN = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=np.uint8)
CLEAN_TEST = np.array([[0, 1, 1], [1, 0, 0]], dtype=np.uint8)


def make_labels(clean_train: bool = True, **overrides) -> LabelSet:
    observed = np.zeros(CLEAN_TRAIN.shape, dtype=np.int8)
    observed[np.arange(5), [0, 1, 1, 2, 0]] = 1
    fields = dict(
        dataset="toy",
        classes=["a", "b", "c"],
        train=SplitLabels(np.array([f"t{i}.jpg" for i in range(5)], dtype=object), observed,
                          CLEAN_TRAIN if clean_train else None),
        test=SplitLabels(np.array(["x.jpg", "y.jpg"], dtype=object),
                         np.array([[0, 1, 0], [1, 0, 0]], dtype=np.int8), CLEAN_TEST),
        train_index=np.array([0, 1, 3, 4]),
        val_index=np.array([2]),
        image_root="/data/toy",
        provenance={"seeds": {"obs": 1200}, "note": "hand-made", "listing": ["a", "b"]},
    )
    fields.update(overrides)
    return LabelSet(**fields)


def test_round_trip(tmp_path):
    path = write_labels(make_labels(), tmp_path / "labels.h5")
    labels = load_labels(path)
    assert labels.dataset == "toy" and labels.classes == ["a", "b", "c"]
    assert labels.image_root == "/data/toy"
    assert labels.train.images.tolist() == [f"t{i}.jpg" for i in range(5)]
    assert np.array_equal(labels.train.clean, CLEAN_TRAIN)
    assert np.array_equal(labels.test.clean, CLEAN_TEST)
    assert labels.train.observed.dtype == np.int8
    assert labels.split("val").images.tolist() == ["t2.jpg"]
    assert labels.provenance["seeds"] == {"obs": 1200}
    assert labels.provenance["listing"] == ["a", "b"]
    assert labels.provenance["note"] == "hand-made"
    assert labels.k == pytest.approx(CLEAN_TRAIN.sum() / 5)
    assert labels.provenance["k"] == pytest.approx(1.4)
    assert "featcache_version" in labels.provenance and "created" in labels.provenance
    assert len(labels.sha256) == 64


def test_single_positive_train_has_no_clean_labels_and_k_from_provenance(tmp_path):
    path = write_labels(make_labels(clean_train=False, provenance={"k": 2.5}),
                        tmp_path / "labels.h5")
    with h5py.File(path) as h5:
        assert "labels" not in h5["train"]
    labels = load_labels(path)
    assert not labels.has_clean_train and labels.has_clean_test
    assert labels.k == 2.5
    assert load_labels(write_labels(make_labels(clean_train=False), tmp_path / "nok.h5")).k is None


def test_existing_file_is_refused_and_kept(tmp_path):
    path = write_labels(make_labels(), tmp_path / "labels.h5")
    before = path.read_bytes()
    with pytest.raises(OutputExistsError, match="--overwrite"):
        write_labels(make_labels(dataset="other"), path)
    assert path.read_bytes() == before
    write_labels(make_labels(dataset="other"), path, overwrite=True)
    assert load_labels(path).dataset == "other"


def test_failure_while_writing_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "labels.h5"
    fail_when_writing(monkeypatch)
    with pytest.raises(OSError, match="injected"):
        write_labels(make_labels(), path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overrides, message", [
    ({"classes": ["a", "a", "c"]}, "duplicate class names"),
    ({"train_index": np.array([0, 1, 2, 3]), "val_index": np.array([2, 4])},
     "row 2 is in both"),
    ({"val_index": np.array([7])}, "/split/val indexes rows outside"),
])
def test_validation_names_the_problem(tmp_path, overrides, message):
    with pytest.raises(InputError, match=message):
        write_labels(make_labels(**overrides), tmp_path / "labels.h5")
    assert not (tmp_path / "labels.h5").exists()


def test_observed_positive_must_be_a_clean_positive(tmp_path):
    labels = make_labels()
    labels.train.observed[1] = [1, 0, 0]  # clean row 1 is [0, 1, 0]
    with pytest.raises(InputError, match=r"/train row 1 \(t1.jpg\) has an observed positive"):
        write_labels(labels, tmp_path / "labels.h5")


def test_duplicate_images_are_named(tmp_path):
    labels = make_labels()
    labels.test.images[1] = "x.jpg"
    with pytest.raises(InputError, match="lists 'x.jpg' more than once"):
        write_labels(labels, tmp_path / "labels.h5")


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match="does not exist.*featcache prepare"):
        load_labels(tmp_path / "absent.h5")
    broken = tmp_path / "broken.h5"
    broken.write_bytes(b"not hdf5 at all")
    with pytest.raises(InputError, match="broken.h5 is not a readable HDF5 file"):
        load_labels(broken)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h5:
        h5.attrs["format"] = "something-else"
    with pytest.raises(InputError, match="not a featcache labels file"):
        load_labels(other)
    path = write_labels(make_labels(), tmp_path / "labels.h5")
    with h5py.File(path, "a") as h5:
        del h5["split/val"]
    with pytest.raises(InputError, match="missing a required key"):
        load_labels(path)


def test_image_names_left_in_the_file_read_as_the_array_would(tmp_path):
    path = write_labels(make_labels(), tmp_path / "labels.h5")
    whole, lazy = load_labels(path), load_labels(path, image_names=False)
    assert isinstance(lazy.train.images, ImageNames) and len(lazy.train.images) == 5
    for name in ("train", "val", "test"):
        names, left = whole.split(name).images, lazy.split(name).images
        assert isinstance(left, ImageNames) and len(left) == len(names)
        assert list(left) == list(names) and left.tolist() == names.tolist()
        assert (np.asarray(left) == names).all() and left[-1] == names[-1]
        mask = np.arange(len(names)) % 2 == 0
        assert (left[mask] == names[mask]).all() and (left[::-1] == names[::-1]).all()
    rows = np.array([4, 0, 0, 2])
    assert (lazy.train.images[rows] == whole.train.images[rows]).all()
    assert (lazy.train.images.take(rows)[1:] == whole.train.images[rows][1:]).all()


@pytest.mark.parametrize("value, key", [(2, "observed"), (-2, "observed"), (3, "labels")])
def test_label_values_are_checked_without_whole_matrix_temporaries(tmp_path, value, key):
    labels = make_labels()
    labels.train.clean = labels.train.clean.copy()  # not the module's array
    matrix = labels.train.observed if key == "observed" else labels.train.clean
    matrix[3, 2] = value
    with pytest.raises(InputError, match=f"/train/{key} holds values other than"):
        write_labels(labels, tmp_path / "labels.h5")


def test_an_observed_positive_negative_in_the_clean_labels_is_found_in_a_later_block():
    from featcache.data.labelfile import _first_row
    observed = np.zeros((10, 3), dtype=np.int8)
    clean = np.ones((10, 3), dtype=np.uint8)
    observed[7, 1], clean[7, 1] = 1, 0
    assert _first_row(observed, clean, block=3) == 7
    clean[7, 1] = 1
    assert _first_row(observed, clean, block=4) is None


def test_the_features_file_images_are_compared_block_by_block(tmp_path, monkeypatch):
    from featcache.data.featurefile import open_features
    from featcache.data.featurewrite import write_features
    path = write_labels(make_labels(), tmp_path / "labels.h5")
    labels = load_labels(path, image_names=False)
    features = write_features(tmp_path / "features-x.h5", labels,
                              {"train": np.zeros((5, 4)), "test": np.zeros((2, 4))},
                              {"backbone": "x"})
    monkeypatch.setattr(ImageNames, "BLOCK", 2)
    assert open_features(features, labels).shapes["train"] == (5, 4)
    with h5py.File(features, "a") as h5:
        del h5["train/images"]
        h5["train"].create_dataset("images", data=np.array(
            ["t0.jpg", "t1.jpg", "t2.jpg", "t3.jpg", "other.jpg"], dtype=object),
            dtype=h5py.string_dtype())
    with pytest.raises(InputError, match=r"/train row 4 is 'other.jpg' but the labels file has 't4.jpg'"):
        open_features(features, labels)


def test_a_features_split_that_is_not_one_row_per_image_is_refused_naming_it(tmp_path):
    from featcache.data.featurefile import open_features
    from featcache.data.featurewrite import write_features
    labels = load_labels(write_labels(make_labels(), tmp_path / "labels.h5"))
    features = write_features(tmp_path / "features-x.h5", labels,
                              {"train": np.zeros((5, 4)), "test": np.zeros((2, 4))},
                              {"backbone": "x"})
    with h5py.File(features, "a") as h5:
        del h5["test/features"]
        h5["test"].create_dataset("features", data=np.zeros((2, 2, 2), dtype=np.float32))
    with pytest.raises(InputError, match=r"features-x.h5: /test/features has shape \(2, 2, 2\); "
                       r"a features file holds one row of features per image .*--overwrite`$"):
        open_features(features, labels)
