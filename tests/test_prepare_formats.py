"""COCO, CUB and NUS-WIDE formatters on small fixtures written in their real formats."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dataset_fixtures import (
    COCO_CATEGORIES,
    invoke,
    write_coco,
    write_cub,
    write_images,
    write_nuswide,
)

from featcache.data.formats.coco import read_coco
from featcache.data.formats.cub import read_cub
from featcache.data.formats.nuswide import read_nuswide
from featcache.data.labelfile import load_labels
from featcache.errors import InputError

# ---------------------------------------------------------------- COCO


def coco_fixture(root):
    # Image 7 has no annotation; ids sort as strings: "10" < "100" < "25" < "7" < "9".
    write_coco(root, "train", COCO_CATEGORIES, [9, 10, 100, 25, 7],
               [(9, 1), (10, 18), (100, 2), (100, 3), (25, 1), (25, 1), (9, 3)])
    write_coco(root, "val", COCO_CATEGORIES, [42, 3, 300],
               [(42, 2), (3, 18), (300, 1), (300, 18)])


def test_coco_string_sorted_ids_and_category_order(tmp_path):
    coco_fixture(tmp_path)
    source = read_coco(tmp_path)
    assert source.classes == ["person", "bicycle", "car", "dog"]
    assert source.train.images == [
        "train2014/COCO_train2014_000000000010.jpg",
        "train2014/COCO_train2014_000000000100.jpg",
        "train2014/COCO_train2014_000000000025.jpg",
        "train2014/COCO_train2014_000000000007.jpg",
        "train2014/COCO_train2014_000000000009.jpg",
    ]
    assert source.train.clean.tolist() == [[0, 0, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0],
                                           [0, 0, 0, 0], [1, 0, 1, 0]]
    assert source.test.images == ["val2014/COCO_val2014_000000000003.jpg",
                                  "val2014/COCO_val2014_000000000300.jpg",
                                  "val2014/COCO_val2014_000000000042.jpg"]
    assert source.test.clean.tolist() == [[0, 0, 0, 1], [1, 0, 0, 1], [0, 1, 0, 0]]
    assert source.image_root == tmp_path


def test_coco_cli_drops_unannotated_images(tmp_path, cache_dir):
    coco_fixture(tmp_path)
    result = invoke("prepare", "coco", "--root", tmp_path, "--labels-only")
    assert result.exit_code == 0, result.output
    assert "train: dropped 1 of 5 images with no positive label" in result.output
    labels = load_labels(cache_dir / "coco" / "labels.h5")
    assert labels.train.images.tolist()[-1] == "train2014/COCO_train2014_000000000009.jpg"
    assert len(labels.train) == 4 and len(labels.test) == 3
    assert labels.provenance["dropped_no_positive"]["train"] == [
        "train2014/COCO_train2014_000000000007.jpg"]


def test_coco_checks_images_under_root(tmp_path, cache_dir):
    coco_fixture(tmp_path)
    source = read_coco(tmp_path)
    write_images(tmp_path, source.train.images + source.test.images[1:])
    result = invoke("prepare", "coco", "--root", tmp_path)
    assert result.exit_code == 1
    assert "1 of the 3 test images are missing" in result.output
    assert "val2014/COCO_val2014_000000000003.jpg" in result.output


def test_coco_malformed_json_names_the_line(tmp_path):
    coco_fixture(tmp_path)
    path = tmp_path / "annotations" / "instances_val2014.json"
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[:5]))
    with pytest.raises(InputError, match=r"instances_val2014.json, line \d+ column \d+: not valid JSON"):
        read_coco(tmp_path)


def test_coco_bad_entries(tmp_path):
    coco_fixture(tmp_path)
    path = tmp_path / "annotations" / "instances_train2014.json"
    data = json.loads(path.read_text())
    data["images"].append({"id": 25})
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"images\[5\] repeats image id 25"):
        read_coco(tmp_path)
    data["images"].pop()
    data["annotations"].append({"image_id": 9, "category_id": 77})
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"annotations\[7\] refers to category id 77"):
        read_coco(tmp_path)
    data["annotations"][-1] = {"image_id": 12345, "category_id": 1}
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"annotations\[7\] refers to image id 12345"):
        read_coco(tmp_path)
    del data["annotations"][-1]["category_id"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"annotations\[7\] has no 'category_id'"):
        read_coco(tmp_path)
    del data["categories"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="'categories' is missing"):
        read_coco(tmp_path)


def test_coco_inconsistent_categories(tmp_path):
    coco_fixture(tmp_path)
    write_coco(tmp_path, "val", COCO_CATEGORIES[:3] + [(19, "horse")], [42], [(42, 2)])
    with pytest.raises(InputError, match=r"class lists of instances_train2014.json and "
                                         r"instances_val2014.json differ \(only in "
                                         r"instances_train2014.json: 18:dog; only in "
                                         r"instances_val2014.json: 19:horse\)"):
        read_coco(tmp_path)


def test_coco_missing_files(tmp_path):
    with pytest.raises(InputError, match="COCO root .* does not exist"):
        read_coco(tmp_path / "nothing")
    with pytest.raises(InputError, match="COCO annotation folder"):
        read_coco(tmp_path)
    write_coco(tmp_path, "train", COCO_CATEGORIES, [1], [(1, 1)])
    with pytest.raises(InputError, match="instances_val2014.json is missing"):
        read_coco(tmp_path)


# ---------------------------------------------------------------- CUB

CUB_ATTRIBUTES = ["has_bill_shape::curved", "has_wing_color::blue", "has_size::small",
                  "has_eye_color::black"]
CUB_IMAGES = [("001.Albatross/a_1.jpg", 1), ("001.Albatross/a_2.jpg", 0),
              ("002.Auklet/b_1.jpg", 1), ("002.Auklet/b_2.jpg", 1), ("003.Crow/c_1.jpg", 0),
              ("003.Crow/c_2.jpg", 1), ("004.Wren/d_1.jpg", 1)]
CUB_MATRIX = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 1, 0],
                       [0, 1, 1, 0], [0, 0, 0, 1]])


def cub_labels():
    return {(i + 1, a + 1): int(CUB_MATRIX[i, a]) for i in range(7) for a in range(4)}


def test_cub_reads_by_id_with_extra_field_lines(tmp_path):
    write_cub(tmp_path, CUB_ATTRIBUTES, CUB_IMAGES, cub_labels(),
              extra_field={(2, 2), (4, 1), (4, 3)})
    lines = (tmp_path / "CUB_200_2011" / "attributes" / "image_attribute_labels.txt").read_text()
    assert "4 3 1 3 0 12.5" in lines  # an extra-field line, as in the real file
    source = read_cub(tmp_path)
    assert source.classes == CUB_ATTRIBUTES
    assert source.train.images == ["001.Albatross/a_1.jpg", "002.Auklet/b_1.jpg",
                                   "002.Auklet/b_2.jpg", "003.Crow/c_2.jpg", "004.Wren/d_1.jpg"]
    assert source.train.clean.tolist() == CUB_MATRIX[[0, 2, 3, 5, 6]].tolist()
    assert source.test.images == ["001.Albatross/a_2.jpg", "003.Crow/c_1.jpg"]
    assert source.test.clean.tolist() == CUB_MATRIX[[1, 4]].tolist()
    assert source.image_root == tmp_path / "CUB_200_2011" / "images"


def test_cub_cli_drops_the_image_without_attributes(tmp_path, cache_dir):
    write_cub(tmp_path, CUB_ATTRIBUTES, CUB_IMAGES, cub_labels())
    write_images(tmp_path / "CUB_200_2011" / "images", [path for path, _ in CUB_IMAGES])
    result = invoke("prepare", "cub", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "cub" / "labels.h5")
    assert labels.train.images.tolist() == ["001.Albatross/a_1.jpg", "002.Auklet/b_2.jpg",
                                            "003.Crow/c_2.jpg", "004.Wren/d_1.jpg"]
    assert labels.provenance["dropped_no_positive"]["train"] == ["002.Auklet/b_1.jpg"]
    assert labels.k == pytest.approx((2 + 4 + 2 + 1) / 4)


def test_cub_missing_pair_and_bad_lines(tmp_path):
    labels = cub_labels()
    del labels[(3, 2)]
    write_cub(tmp_path, CUB_ATTRIBUTES, CUB_IMAGES, labels)
    with pytest.raises(InputError, match="no label for image id 3, attribute id 2 "
                                         r"\(1 \(image, attribute\) pair lacks one\)"):
        read_cub(tmp_path)
    path = tmp_path / "CUB_200_2011" / "attributes" / "image_attribute_labels.txt"
    lines = path.read_text().splitlines(keepends=True)
    for bad, message in (("3 2 1\n", "line 28: expected '<image id> <attribute id>.* got 3 fields"),
                         ("3 2 x 3 1.0\n", "line 28: is_present 'x' is not an integer"),
                         ("3 2 2 3 1.0\n", "line 28: is_present is 2; expected 0 or 1"),
                         ("3 9 1 3 1.0\n", "line 28: attribute id 9 is not in attributes.txt"),
                         ("8 2 1 3 1.0\n", "line 28: image id 8 is not in images.txt"),
                         ("3 1 1 3 1.0\n", r"line 28: image 3, attribute 1 is labelled twice "
                                           r"\(first on line \d+\)")):
        path.write_text("".join(lines + [bad]))
        with pytest.raises(InputError, match=message):
            read_cub(tmp_path)


def test_cub_missing_files_and_split_entries(tmp_path):
    with pytest.raises(InputError, match="CUB root"):
        read_cub(tmp_path / "none")
    write_cub(tmp_path, CUB_ATTRIBUTES, CUB_IMAGES, cub_labels())
    (tmp_path / "attributes.txt").rename(tmp_path / "CUB_200_2011" / "attributes.txt")
    with pytest.raises(InputError, match="attributes.txt is missing; the official archive has "
                                         "it next to the CUB_200_2011 folder"):
        read_cub(tmp_path)
    (tmp_path / "CUB_200_2011" / "attributes.txt").rename(tmp_path / "attributes.txt")
    split = tmp_path / "CUB_200_2011" / "train_test_split.txt"
    split.write_text("1 1\n2 0\n3 1\n4 1\n5 0\n6 1\n")
    with pytest.raises(InputError, match="no entry for image id 7"):
        read_cub(tmp_path)
    split.write_text("1 1\n2 0\n3 1\n4 1\n5 3\n6 1\n7 1\n")
    with pytest.raises(InputError, match="train_test_split.txt, line 5: is_training_image is 3"):
        read_cub(tmp_path)
    images = tmp_path / "CUB_200_2011" / "images.txt"
    images.write_text(images.read_text() + "2 002.Auklet/dup.jpg\n")
    with pytest.raises(InputError, match=r"images.txt, line 8: duplicate image id '2'"):
        read_cub(tmp_path)


# ---------------------------------------------------------------- NUS-WIDE

NUS_CONCEPTS = ["animal", "beach", "clouds", "sky"]
NUS_SPLITS = {
    "Train": [(r"actor\0001_2124494179.jpg", {"sky"}),
              (r"actor\0002_174174086.jpg", set()),
              (r"airport\0001_2211434049.jpg", {"sky", "clouds"}),
              (r"beach\0003_1234.jpg", {"beach", "sky"}),
              (r"cat\0004_99.jpg", {"animal"}),
              (r"cat\0005_98.jpg", {"animal", "beach"})],
    "Test": [(r"dog\0001_1.jpg", {"animal"}),
             (r"sea\0002_2.jpg", {"beach", "clouds", "sky"}),
             (r"sea\0003_3.jpg", set()),
             (r"sky\0004_4.jpg", {"sky"})],
}


def nus_fixture(root, missing=()):
    write_nuswide(root, NUS_CONCEPTS, NUS_SPLITS)
    names = [path.replace("\\", "/") for rows in NUS_SPLITS.values() for path, _ in rows]
    write_images(root / "Flickr", [n for n in names if n not in missing])


def test_nuswide_reader(tmp_path):
    nus_fixture(tmp_path)
    source = read_nuswide(tmp_path)
    assert source.classes == NUS_CONCEPTS
    assert source.train.images[0] == "actor/0001_2124494179.jpg"
    assert source.train.clean[2].tolist() == [0, 0, 1, 1]
    assert source.test.clean.tolist() == [[1, 0, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]]
    assert len(source.source_files) == 1 + 2 + 2 * len(NUS_CONCEPTS)
    assert source.image_root == tmp_path / "Flickr"


def test_nuswide_missing_images_are_always_dropped_and_counted(tmp_path, cache_dir):
    nus_fixture(tmp_path, missing={"cat/0004_99.jpg", "sky/0004_4.jpg"})
    result = invoke("prepare", "nuswide", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    assert "train: dropped 1 missing image (cat/0004_99.jpg)" in result.output
    assert "train: dropped 1 of 6 images with no positive label" in result.output
    labels = load_labels(cache_dir / "nuswide" / "labels.h5")
    assert labels.train.images.tolist() == ["actor/0001_2124494179.jpg",
                                            "airport/0001_2211434049.jpg",
                                            "beach/0003_1234.jpg", "cat/0005_98.jpg"]
    assert labels.test.images.tolist() == ["dog/0001_1.jpg", "sea/0002_2.jpg"]
    assert labels.provenance["missing_images"] == {"train": ["cat/0004_99.jpg"],
                                                   "test": ["sky/0004_4.jpg"]}
    assert labels.provenance["drop_missing"] is True
    assert labels.provenance["counts"]["test"] == {"listed": 4, "no_positive": 1,
                                                   "missing_images": 1, "rows": 2}


def test_nuswide_merged_split(tmp_path, cache_dir):
    nus_fixture(tmp_path, missing={"cat/0004_99.jpg"})
    result = invoke("prepare", "nuswide", "--root", tmp_path, "--split", "merged",
                    "--merged-train-size", "5")
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "nuswide" / "labels.h5")
    # 10 listed, 2 without positive, 1 missing: 7 merged, 5 drawn for training
    assert (len(labels.train), len(labels.test)) == (5, 2)
    assert labels.provenance["merged_split"] == {"train_size": 5, "seed": 1200, "rows": 7,
                                                 "test_size": 2}
    everything = set(labels.train.images.tolist()) | set(labels.test.images.tolist())
    assert everything == {"actor/0001_2124494179.jpg", "airport/0001_2211434049.jpg",
                          "beach/0003_1234.jpg", "cat/0005_98.jpg", "dog/0001_1.jpg",
                          "sea/0002_2.jpg", "sky/0004_4.jpg"}
    result = invoke("prepare", "nuswide", "--root", tmp_path, "--split", "merged",
                    "--overwrite")
    assert result.exit_code == 1 and "--merged-train-size 150000 must be between 1 and 6" in result.output


def test_nuswide_bad_label_files(tmp_path):
    nus_fixture(tmp_path)
    path = tmp_path / "Groundtruth" / "TrainTestLabels" / "Labels_clouds_Test.txt"
    path.write_text("0\n1\n0\n")
    with pytest.raises(InputError, match="Labels_clouds_Test.txt has 3 labels but .*"
                                         "TestImagelist.txt lists 4 images"):
        read_nuswide(tmp_path)
    path.write_text("0\n1\n-1\n0\n")
    with pytest.raises(InputError, match=r"Labels_clouds_Test.txt, line 3: expected 0 or 1, got '-1'"):
        read_nuswide(tmp_path)
    path.unlink()
    with pytest.raises(InputError, match="labels of concept 'clouds'"):
        read_nuswide(tmp_path)
    (tmp_path / "Concepts81.txt").unlink()
    with pytest.raises(InputError, match="concept list is missing"):
        read_nuswide(tmp_path)


def test_nuswide_duplicate_image(tmp_path):
    nus_fixture(tmp_path)
    path = tmp_path / "ImageList" / "TrainImagelist.txt"
    path.write_text(path.read_text() + "actor\\0002_174174086.jpg\n")
    with pytest.raises(InputError, match=r"TrainImagelist.txt, line 7: duplicate image "
                                         r"'actor/0002_174174086.jpg' \(first on line 2\)"):
        read_nuswide(tmp_path)
