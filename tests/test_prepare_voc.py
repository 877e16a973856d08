"""VOC: the formatter on the real VOC2007 devkit lists, and ``featcache prepare voc`` end to end."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from dataset_fixtures import VOC_SPLITS, fail_when_writing, invoke, write_voc

from featcache.data.formats.voc import VOC_CLASSES, read_voc
from featcache.data.labelfile import load_labels
from featcache.errors import InputError, OptionError

# SOURCE.md of voc2007_labels: images per split, and per-class image counts.
VOC2007_SIZES = {"train": 2501, "val": 2510, "trainval": 5011, "test": 4952}
VOC2007_TRAINVAL = {"aeroplane": 238, "car": 713, "person": 2008, "tvmonitor": 256}
VOC2007_TEST = {"person": 2007, "car": 721}


@pytest.fixture(scope="module")
def voc2007(shared_data):
    return shared_data / "voc2007_labels"


@pytest.mark.shared_data
def test_real_voc2007_lists_match_the_documented_matrices(voc2007):
    for train_split, test_split in (("train", "val"), ("trainval", "test")):
        source = read_voc(voc2007, "2007", train_split, test_split)
        assert source.classes == list(VOC_CLASSES)
        assert source.classes == (voc2007 / "classes.txt").read_text().split()
        for split, part in ((train_split, source.train), (test_split, source.test)):
            assert len(part) == VOC2007_SIZES[split]
            expected = np.load(voc2007 / f"voc2007_{split}_labels.npy")
            assert np.array_equal(part.clean, expected)
            assert part.images == (voc2007 / f"voc2007_{split}_images.txt").read_text().split()
        assert len(source.source_files) == 40
    column = {name: i for i, name in enumerate(VOC_CLASSES)}
    source = read_voc(voc2007, "2007", "trainval", "test")
    for name, count in VOC2007_TRAINVAL.items():
        assert source.train.clean[:, column[name]].sum() == count
    for name, count in VOC2007_TEST.items():
        assert source.test.clean[:, column[name]].sum() == count


@pytest.mark.shared_data
def test_prepare_voc2007_labels_only(voc2007, cache_dir):
    result = invoke("prepare", "voc", "--root", str(voc2007), "--year", "2007",
                 "--train-split", "trainval", "--test-split", "test", "--labels-only")
    assert result.exit_code == 0, result.output
    assert "official train 5011 images (train 4009 / val 1002), test 4952" in result.output
    labels = load_labels(cache_dir / "voc" / "labels.h5")
    assert labels.dataset == "voc"
    assert ((labels.train.observed == 1).sum(axis=1) == 1).all()
    assert (labels.train.clean[labels.train.observed == 1] == 1).all()
    assert ((labels.test.observed == 1).sum(axis=1) == 1).all()
    assert (labels.train_index.size, labels.val_index.size) == (4009, 1002)
    assert labels.provenance["labels_only"] is True
    assert labels.provenance["images_checked"] is False
    assert labels.provenance["source_details"] == {"year": "2007", "train_split": "trainval",
                                                   "test_split": "test"}
    assert labels.image_root.endswith("VOCdevkit/VOC2007/JPEGImages")
    assert len(labels.provenance["sources"]) == 40
    assert all(len(entry["sha256"]) == 64 for entry in labels.provenance["sources"])
    assert labels.provenance["positives_per_class"]["train"][VOC_CLASSES.index("person")] == 2008
    assert labels.k == pytest.approx(1.458, abs=1e-3)


def test_fixture_with_images(tmp_path, cache_dir):
    write_voc(tmp_path, VOC_SPLITS)
    result = invoke("prepare", "voc", "--root", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "train: dropped 1 of 10 images with no positive label (2008_000041.jpg)" in result.output
    labels = load_labels(cache_dir / "voc" / "labels.h5")
    expected = sorted(f"{i}.jpg" for i in VOC_SPLITS["train"] if i != "2008_000041")
    assert labels.train.images.tolist() == expected
    row = expected.index("2008_000019.jpg")
    # 'cat' is 0 (difficult) there: negative, as the protocol says
    assert labels.train.clean[row].nonzero()[0].tolist() == [VOC_CLASSES.index("dog")]
    assert labels.provenance["counts"]["train"] == {"listed": 10, "no_positive": 1,
                                                    "missing_images": 0, "rows": 9}
    assert labels.provenance["dropped_no_positive"]["train"] == ["2008_000041.jpg"]
    assert labels.provenance["images_checked"] is True
    assert labels.provenance["command"] == "featcache prepare voc"
    assert labels.provenance["options"]["--root"] == str(tmp_path)


def test_missing_images_error_then_drop_missing(tmp_path, cache_dir):
    base = write_voc(tmp_path, VOC_SPLITS)
    (base / "JPEGImages" / "2008_000015.jpg").unlink()
    (base / "JPEGImages" / "2008_000043.jpg").unlink()
    result = invoke("prepare", "voc", "--root", str(tmp_path))
    assert result.exit_code == 1
    assert "1 of the 9 train images are missing" in result.output
    assert "(2008_000015.jpg)" in result.output and "--drop-missing" in result.output
    assert not (cache_dir / "voc" / "labels.h5").exists()
    result = invoke("prepare", "voc", "--root", str(tmp_path), "--drop-missing")
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "voc" / "labels.h5")
    assert labels.provenance["missing_images"] == {"train": ["2008_000015.jpg"],
                                                   "test": ["2008_000043.jpg"]}
    assert labels.provenance["counts"]["test"]["missing_images"] == 1
    assert "2008_000015.jpg" not in labels.train.images.tolist()
    assert len(labels.test) == 5


def test_images_override(tmp_path, cache_dir):
    base = write_voc(tmp_path / "voc", VOC_SPLITS)
    shutil.move(base / "JPEGImages", tmp_path / "elsewhere")
    result = invoke("prepare", "voc", "--root", str(tmp_path / "voc"), "--images",
                 str(tmp_path / "elsewhere"))
    assert result.exit_code == 0, result.output
    assert load_labels(cache_dir / "voc" / "labels.h5").image_root == str(tmp_path / "elsewhere")


def test_existing_output_is_refused_and_kept(tmp_path, cache_dir):
    write_voc(tmp_path, VOC_SPLITS)
    assert invoke("prepare", "voc", "--root", str(tmp_path)).exit_code == 0
    path = cache_dir / "voc" / "labels.h5"
    before = path.read_bytes()
    result = invoke("prepare", "voc", "--root", str(tmp_path), "--num-neg", "1")
    assert result.exit_code == 1 and "already exists; pass --overwrite" in result.output
    assert path.read_bytes() == before
    result = invoke("prepare", "voc", "--root", str(tmp_path), "--num-neg", "1", "--overwrite")
    assert result.exit_code == 0, result.output
    labels = load_labels(path)
    assert ((labels.train.observed == -1).sum(axis=1) == 1).all()
    assert labels.provenance["num_neg"] == 1


def test_failure_while_writing_keeps_the_old_file(tmp_path, cache_dir, monkeypatch):
    write_voc(tmp_path, VOC_SPLITS)
    assert invoke("prepare", "voc", "--root", str(tmp_path)).exit_code == 0
    path = cache_dir / "voc" / "labels.h5"
    before = path.read_bytes()
    fail_when_writing(monkeypatch)
    with pytest.raises(OSError, match="injected"):
        invoke("prepare", "voc", "--root", str(tmp_path), "--overwrite")
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["labels.h5"]


def test_missing_root_and_wrong_year(tmp_path):
    with pytest.raises(InputError, match="VOC root .*absent does not exist"):
        read_voc(tmp_path / "absent")
    write_voc(tmp_path, VOC_SPLITS)
    with pytest.raises(InputError, match="VOC2007.*is --year 2007 right"):
        read_voc(tmp_path, year="2007")
    with pytest.raises(OptionError, match="both 'train'"):
        read_voc(tmp_path, train_split="train", test_split="train")


def test_missing_class_file(tmp_path):
    base = write_voc(tmp_path, VOC_SPLITS, with_images=False)
    (base / "ImageSets" / "Main" / "sofa_val.txt").unlink()
    with pytest.raises(InputError, match=r"VOC class list for split 'val' .*sofa_val.txt is missing"):
        read_voc(tmp_path)


def test_malformed_line_names_file_and_line(tmp_path):
    base = write_voc(tmp_path, VOC_SPLITS, with_images=False)
    path = base / "ImageSets" / "Main" / "dog_train.txt"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "2008_000023  yes\r\n"
    path.write_text("".join(lines), newline="")
    with pytest.raises(InputError, match=r"dog_train.txt, line 4: flag 'yes' is not an integer"):
        read_voc(tmp_path)
    lines[3] = "2008_000023 1 extra\r\n"
    path.write_text("".join(lines), newline="")
    with pytest.raises(InputError, match=r"dog_train.txt, line 4: expected '<image id> <-1\|0\|1>'"):
        read_voc(tmp_path)
    lines[3] = "2008_000023  2\r\n"
    path.write_text("".join(lines), newline="")
    with pytest.raises(InputError, match=r"line 4: flag is 2; expected one of -1, 0, 1"):
        read_voc(tmp_path)


def test_duplicate_and_inconsistent_image_lists(tmp_path):
    base = write_voc(tmp_path, VOC_SPLITS, with_images=False)
    path = base / "ImageSets" / "Main" / "cat_val.txt"
    original = path.read_text()
    path.write_text(original + "2008_000002 -1\r\n", newline="")
    with pytest.raises(InputError, match=r"cat_val.txt, line 7: duplicate image id '2008_000002' "
                                         r"\(first on line 1\)"):
        read_voc(tmp_path)
    path.write_text(original + "2008_999999 -1\r\n", newline="")
    with pytest.raises(InputError, match=r"cat_val.txt and .*aeroplane_val.txt list different "
                                         r"images: cat_val.txt has 2008_999999"):
        read_voc(tmp_path)


def test_root_may_be_the_year_folder_vocdevkit_or_its_parent(tmp_path, cache_dir):
    """The protocol's own layout points at VOCdevkit/VOC2012: all three roots read the same."""
    base = write_voc(tmp_path / "pascal", VOC_SPLITS)
    read = {root: read_voc(root) for root in (tmp_path / "pascal", base.parent, base)}
    first = read[tmp_path / "pascal"]
    for source in read.values():
        assert source.train.images == first.train.images
        assert np.array_equal(source.train.clean, first.train.clean)
        assert source.image_root == base / "JPEGImages"
    result = invoke("prepare", "voc", "--root", base)
    assert result.exit_code == 0, result.output
    assert load_labels(cache_dir / "voc" / "labels.h5").image_root.endswith("VOC2012/JPEGImages")
    with pytest.raises(InputError, match=r"VOC2012 folder but --year is 2007: pass --year 2012"):
        read_voc(base, year="2007")
    with pytest.raises(InputError, match=r"VOCdevkit/VOC2007/ImageSets/Main does not exist; is --year 2007 right"):
        read_voc(base.parent, year="2007")
