"""``featcache prepare csv``: users' own data, full labels or real single positives."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke, write_images

from featcache.data.formats.csvfile import read_csv_dataset
from featcache.data.labelfile import load_labels
from featcache.errors import InputError

FULL_TRAIN = """image,cat,dog,car
img/a.jpg,1,0,1
img/b.jpg,0,1,0
img/c.jpg,0,0,0
img/d.jpg,1,1,0
img/e.jpg,0,0,1
img/f.jpg,1,0,0
"""
FULL_TEST = """image,cat,dog,car
img/t1.jpg,0,1,1
img/t2.jpg,1,0,0
"""
SINGLE_TRAIN = """image,label
img/a.jpg,cat
img/b.jpg,dog
img/d.jpg,dog
img/e.jpg,car
img/f.jpg,cat
"""


@pytest.fixture
def folder(tmp_path):
    write_images(tmp_path / "images", [f"img/{n}.jpg" for n in "abcdef"] +
                 ["img/t1.jpg", "img/t2.jpg"])
    return tmp_path


def write(folder, name, text):
    path = folder / name
    path.write_text(text)
    return path


def read(folder, classes=None):
    return read_csv_dataset(folder / "train.csv", folder / "test.csv", folder / "images",
                            "mine", classes)


def prepare(folder, train, test, *extra):
    return invoke("prepare", "csv", "--train", write(folder, "train.csv", train),
                  "--test", write(folder, "test.csv", test), "--images", folder / "images",
                  "--name", "mine", *extra)


def test_full_labels(folder, cache_dir):
    result = prepare(folder, FULL_TRAIN, FULL_TEST)
    assert result.exit_code == 0, result.output
    assert "train: dropped 1 of 6 images with no positive label (img/c.jpg)" in result.output
    labels = load_labels(cache_dir / "mine" / "labels.h5")
    assert labels.dataset == "mine" and labels.classes == ["cat", "dog", "car"]
    assert labels.train.images.tolist() == ["img/a.jpg", "img/b.jpg", "img/d.jpg", "img/e.jpg",
                                            "img/f.jpg"]
    assert labels.train.clean.tolist() == [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]]
    assert ((labels.train.observed == 1).sum(axis=1) == 1).all()
    assert labels.provenance["observation"] == "uniform"
    assert labels.provenance["source_format"] == "csv"
    assert labels.image_root == str(folder / "images")
    assert labels.k == pytest.approx(7 / 5)


def test_single_positive_train_labels_are_taken_as_given(folder, cache_dir):
    result = prepare(folder, SINGLE_TRAIN, FULL_TEST, "--k", "1.6")
    assert result.exit_code == 0, result.output
    assert "given single positives" in result.output
    path = cache_dir / "mine" / "labels.h5"
    with h5py.File(path) as h5:
        assert "labels" not in h5["train"] and "labels" in h5["test"]
    labels = load_labels(path)
    assert not labels.has_clean_train
    assert labels.classes == ["cat", "dog", "car"]  # the order of the full-label test header
    assert labels.train.observed.tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1],
                                              [1, 0, 0]]
    assert labels.provenance["observation"] == "given"
    assert labels.provenance["observation_test"] == "uniform"
    assert labels.k == 1.6


def test_single_positives_in_both_files(folder, cache_dir):
    test = "image,label\nimg/t1.jpg,car\nimg/t2.jpg,cat\n"
    result = prepare(folder, SINGLE_TRAIN, test)
    assert result.exit_code == 0, result.output
    assert "k unknown" in result.output
    labels = load_labels(cache_dir / "mine" / "labels.h5")
    assert labels.classes == ["car", "cat", "dog"]  # sorted training labels
    assert not labels.has_clean_test and labels.k is None
    assert labels.test.observed.tolist() == [[1, 0, 0], [0, 1, 0]]


def test_class_list_file_fixes_the_order(folder):
    write(folder, "train.csv", SINGLE_TRAIN)
    write(folder, "test.csv", "image,label\nimg/t1.jpg,bird\n")
    classes = write(folder, "classes.txt", "dog\ncat\nbird\ncar\n")
    source = read(folder, classes)
    assert source.classes == ["dog", "cat", "bird", "car"]
    assert source.test.observed.tolist() == [[0, 0, 1, 0]]


def test_unknown_test_label_without_class_list(folder):
    write(folder, "train.csv", SINGLE_TRAIN)
    write(folder, "test.csv", "image,label\nimg/t1.jpg,cat\nimg/t2.jpg,bird\n")
    with pytest.raises(InputError, match=r"test.csv, line 3: label 'bird' is not a class of the "
                                         r"labels of train.csv .*--classes FILE"):
        read(folder)


def test_inconsistent_headers_list_the_differences(folder):
    write(folder, "train.csv", FULL_TRAIN)
    write(folder, "test.csv", "image,cat,horse,car\nimg/t1.jpg,0,1,1\n")
    with pytest.raises(InputError, match=r"class lists of train.csv and test.csv differ \(only in "
                                         r"train.csv: dog; only in test.csv: horse\)"):
        read(folder)
    write(folder, "test.csv", "image,dog,cat,car\nimg/t1.jpg,0,1,1\n")
    with pytest.raises(InputError, match="the same classes in a different order"):
        read(folder)


@pytest.mark.parametrize("text, message", [
    ("image,cat,dog\nimg/a.jpg,1,2\n", r"line 2: column 'dog' holds '2'; full labels must be 0 or 1"),
    ("image,cat,dog\nimg/a.jpg,1\n", "line 2: 2 fields, but the header has 3"),
    ("image,cat,dog\nimg/a.jpg,1,0\nimg/a.jpg,0,1\n", r"line 3: duplicate image 'img/a.jpg' \(first on line 2\)"),
    ("file,cat,dog\nimg/a.jpg,1,0\n", "line 1: the header must be"),
    ("image,cat,cat\nimg/a.jpg,1,0\n", "duplicate class in the header 'cat'"),
    ("image,label\nimg/a.jpg,\n", "line 2: the label is empty"),
    ("image,cat\n", "has a header but no rows"),
    ("", "is empty"),
    ('image,cat\n"img/a.jpg,1\n', "not valid CSV"),
])
def test_malformed_files_name_file_and_line(folder, text, message):
    write(folder, "train.csv", text)
    write(folder, "test.csv", FULL_TEST)
    with pytest.raises(InputError, match=message):
        read(folder)


def test_options_that_do_not_apply(folder, cache_dir):
    result = prepare(folder, FULL_TRAIN, FULL_TEST, "--k", "2")
    assert result.exit_code == 1 and "--k is only for single-positive training labels" in result.output
    result = prepare(folder, SINGLE_TRAIN, FULL_TEST, "--num-neg", "1")
    assert result.exit_code == 1 and "--num-pos/--num-neg apply only to clean" in result.output
    for name in ("voc", "../up", ".hidden"):
        result = invoke("prepare", "csv", "--train", folder / "train.csv", "--test",
                        folder / "test.csv", "--images", folder / "images", "--name", name)
        assert result.exit_code in (1, 2) and "--name" in result.output  # 1: not a name
    assert not list(cache_dir.iterdir())


def test_missing_image_and_labels_only(folder, cache_dir):
    (folder / "images" / "img" / "t2.jpg").unlink()
    result = prepare(folder, FULL_TRAIN, FULL_TEST)
    assert result.exit_code == 1 and "1 of the 2 test images are missing" in result.output
    result = prepare(folder, FULL_TRAIN, FULL_TEST, "--labels-only")
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "mine" / "labels.h5")
    assert len(labels.test) == 2 and labels.provenance["images_checked"] is False
    assert np.array_equal(labels.test.clean, [[0, 1, 1], [1, 0, 0]])


def test_an_image_in_both_files_is_refused_naming_it(folder, cache_dir):
    """Issue 36, item 6: leakage between the splits was accepted without a word."""
    test = FULL_TEST + "./img/a.jpg,1,0,0\nimg/b.jpg,0,1,0\n"  # ./img/a.jpg is img/a.jpg
    result = prepare(folder, FULL_TRAIN, test)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {folder / 'test.csv'}, line 4: ./img/a.jpg is also in {folder / 'train.csv'} "
        "(line 2); 2 images of the test file are training images (./img/a.jpg, img/b.jpg), so "
        "test mAP would be measured on images the heads trained on: list each image in one "
        "file\n")
    assert not (cache_dir / "mine").exists()


def test_class_names_that_differ_only_in_case_are_said(folder, cache_dir):
    """Issue 36, item 12: `cat`, ` cat ` and `Cat` became two classes without a word."""
    train = "image,label\nimg/a.jpg,cat\nimg/b.jpg, cat \nimg/d.jpg,Cat\nimg/e.jpg,dog\n"
    result = prepare(folder, train, "image,label\nimg/t1.jpg,dog\n")
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if "differ only in case" in line]
    assert warning == [
        f"featcache: warning: {folder / 'train.csv'}, {folder / 'test.csv'}: 1 set of class "
        "names differ only in case or spaces ('Cat' and 'cat') and are kept as separate classes; "
        "if each set is one class, write its names alike and prepare again with --overwrite"]
    assert load_labels(cache_dir / "mine" / "labels.h5").classes == ["Cat", "cat", "dog"]
