"""The label-bias samplers (Arroyo, Perona, Cole 2023): size, location and semantic, on VOC XML
boxes, COCO instances files and the generated shapes set; uniform stays the protocol's sampler."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from dataset_fixtures import (
    COCO_CATEGORIES,
    VOC_SPLITS,
    invoke,
    write_coco,
    write_voc,
    write_voc_annotations,
)

from featcache.data.bias import (
    Observer,
    location_weights,
    observe_biased,
    read_class_weights,
    size_weights,
)
from featcache.data.formats.voc import VOC_CLASSES, read_voc
from featcache.data.labelfile import load_labels
from featcache.data.objects import ImageObjects
from featcache.data.sampling import observe_uniform
from featcache.errors import InputError, OptionError
from featcache.protocol.records import document_header, observation_line


def objects(width, height, items):
    """ImageObjects from (class column, [x, y, w, h], area) triples."""
    result = ImageObjects(width, height)
    for column, box, area in items:
        result.add(column, box, area)
    return result


# ----------------------------------------------------------------- the rules, by hand
def test_the_reference_rng_is_pythons_and_draws_by_weight_not_argmax():
    # random.seed(1200): the first random() is 0.954199..., so weights [0.95, 0.05, 0] pick
    # class 1 (cumulative [0.95, 1.0, 1.0] first exceeds 0.954 at index 1)
    assert random.Random(1200).random() == 0.9541991673947924
    clean = np.array([[1, 1, 0]])
    observer = Observer("semantic", [0.95, 0.05, 0.0])
    assert observe_biased(clean, observer, 1200).tolist() == [[0, 1, 0]]


def test_size_rule_worked_example():
    # 640 x 480 image: person (area 5000), dog (20000), person (1000); classes person, dog, cat.
    # w = [6000/26000, 20000/26000, 0] = [0.2307692, 0.7692308, 0]; u * sum = 0.9541992 > 0.2308
    image = objects(640, 480, [(0, [100, 100, 50, 100], 5000.0), (1, [300, 200, 200, 100], 20000.0),
                               (0, [600, 400, 20, 50], 1000.0)])
    assert size_weights(image, 3) == pytest.approx([6000 / 26000, 20000 / 26000, 0.0], abs=1e-15)
    observed = observe_biased(np.array([[1, 1, 0]]), Observer("size"), 1200, [image])
    assert observed.tolist() == [[0, 1, 0]]  # dog


def test_location_rule_worked_example():
    # centres (125, 150), (400, 250), (610, 425); image centre (320, 240);
    # d = 214.76732, 80.62258, 343.98401; 1/d: person 0.0046562 + 0.0029071, dog 0.0124035
    image = objects(640, 480, [(0, [100, 100, 50, 100], 5000.0), (1, [300, 200, 200, 100], 20000.0),
                               (0, [600, 400, 20, 50], 1000.0)])
    d = [math.hypot(125 - 320, 150 - 240), math.hypot(400 - 320, 250 - 240),
         math.hypot(610 - 320, 425 - 240)]
    assert d == pytest.approx([214.76732, 80.62258, 343.98401], abs=1e-5)
    # nu = 1 / sum(1/d') with d' measured to (640, 480), the reference's constant
    d_corner = [math.hypot(125 - 640, 150 - 480), math.hypot(400 - 640, 250 - 480),
                math.hypot(610 - 640, 425 - 480)]
    nu = 1 / sum(1 / x for x in d_corner)
    assert nu == pytest.approx(48.532090, abs=1e-6)
    weights = location_weights(image, 3)
    assert weights == pytest.approx([nu / d[0] + nu / d[2], nu / d[1], 0.0], rel=1e-12)
    assert weights[:2] == pytest.approx([0.3670634, 0.6019665], abs=1e-7)
    normalised = [w / sum(weights) for w in weights]  # nu cancels: the distribution
    assert normalised[:2] == pytest.approx([0.3787947, 0.6212053], abs=1e-7)
    assert observe_biased(np.array([[1, 1, 0]]), Observer("location"), 1200,
                          [image]).tolist() == [[0, 1, 0]]  # 0.9246 lies above 0.3671


def test_location_rule_box_on_the_centre():
    # a box centred on the image centre has d = 0, replaced by 0.0005: it dominates
    image = objects(100, 100, [(0, [40, 40, 20, 20], 400.0), (1, [0, 0, 10, 10], 100.0)])
    weights = location_weights(image, 2)
    assert weights[0] / weights[1] == pytest.approx(math.hypot(45, 45) / 0.0005)


def test_draws_follow_the_weights():
    # 4000 identical rows, size shares 0.75 / 0.25: the draw is random with those odds
    image = objects(100, 100, [(0, [0, 0, 30, 50], 1500.0), (2, [50, 50, 10, 50], 500.0)])
    clean = np.tile([[1, 0, 1]], (4000, 1))
    observed = observe_biased(clean, Observer("size"), 7, [image] * 4000)
    assert ((observed == 1).sum(axis=1) == 1).all() and observed[:, 1].sum() == 0
    assert observed[:, 0].mean() == pytest.approx(0.75, abs=0.03)
    again = observe_biased(clean, Observer("size"), 7, [image] * 4000)
    other = observe_biased(clean, Observer("size"), 8, [image] * 4000)
    assert np.array_equal(observed, again) and not np.array_equal(observed, other)


def test_semantic_rule_and_its_uniform_fallback():
    clean = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]])
    observer = Observer("semantic", [0.0, 0.0, 2.0])
    observed = observe_biased(clean, observer, 1200)
    rng = random.Random(1200)
    expected = [rng.choices(range(3), weights=[0, 0, 2.0])[0],  # row 0: class 2 (weight 2 of 2)
                rng.choices(range(3), weights=[0, 0, 2.0])[0],  # row 1: class 2
                rng.choice([0, 1])]  # row 2: its positives both weigh 0: uniform among them
    assert [int(np.argmax(r)) for r in observed] == expected
    assert expected[:2] == [2, 2]


def test_objects_of_negative_classes_are_ignored():
    # VOC lists objects of 'difficult-only' classes, which the protocol labels negative
    image = objects(100, 100, [(0, [0, 0, 10, 10], 100.0), (1, [0, 0, 90, 90], 8100.0)])
    observed = observe_biased(np.array([[1, 0]]), Observer("size"), 0, [image])
    assert observed.tolist() == [[1, 0]]
    with pytest.raises(InputError, match="row 0.*no object box of its positive classes"):
        observe_biased(np.array([[0, 1]]), Observer("size"), 0, [objects(10, 10, [])])


def test_class_weights_file_is_checked(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"a": 1, "b": 0.5}))
    with pytest.raises(InputError, match="missing c"):
        read_class_weights(path, ["a", "b", "c"])
    path.write_text(json.dumps({"a": 1, "b": -1, "c": 1}))
    with pytest.raises(InputError, match="weight of 'b' is -1"):
        read_class_weights(path, ["a", "b", "c"])
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        read_class_weights(path, ["a", "b"])
    path.write_text(json.dumps({"b": 2, "a": 1}))
    observer = read_class_weights(path, ["a", "b"])
    assert observer.class_weights == [1.0, 2.0]  # in class order, not file order
    assert observer.record()["class_weights_source"]["sha256"]


# ----------------------------------------------------------------- VOC: boxes from the XML files
def voc_boxes():
    """Boxes for every VOC fixture image: one object per positive class, sizes by position, plus
    a large object of the 'difficult-only' class cat in 2008_000019."""
    images = {}
    for split in VOC_SPLITS.values():
        for image_id, flags in split.items():
            items = []
            for k, name in enumerate(sorted(flags)):
                side = 20 + 40 * k + (len(image_id) + int(image_id[-2:])) % 30
                items.append((name, 5 + 11 * k, 7 + 13 * k, 5 + 11 * k + side - 1,
                              7 + 13 * k + side // 2, 0 if flags[name] == 1 else 1))
            images[image_id] = (500, 375, items)
    images["2008_000019"][2].append(("cat", 1, 1, 500, 375, 1))
    return images


def expected_voc(split, rule):
    """The observed column of each row, computed from the fixture's boxes by the rule."""
    boxes = voc_boxes()
    rng = random.Random(1200)
    rows = []
    for image_id in sorted(i for i, f in VOC_SPLITS[split].items() if 1 in f.values()):
        width, height, items = boxes[image_id]
        weights = [0.0] * len(VOC_CLASSES)
        positive = [(VOC_CLASSES.index(n), x0 - 1, y0 - 1, x1 - x0 + 1, y1 - y0 + 1)
                    for n, x0, y0, x1, y1, _ in items if VOC_SPLITS[split][image_id].get(n) == 1]
        if rule == "size":  # share of the summed box areas w * h
            total = sum(w * h for _, _, _, w, h in positive)
            for c, _, _, w, h in positive:
                weights[c] += w * h / total
        else:
            nu = 1 / sum(1 / math.hypot(x + w / 2 - width, y + h / 2 - height)
                         for _, x, y, w, h in positive)
            for c, x, y, w, h in positive:
                weights[c] += nu / math.hypot(x + w / 2 - width / 2, y + h / 2 - height / 2)
        rows.append(rng.choices(range(len(VOC_CLASSES)), weights=weights)[0])
    return rows


@pytest.fixture
def voc_root(tmp_path):
    base = write_voc(tmp_path, VOC_SPLITS, with_images=False)
    write_voc_annotations(base, voc_boxes())
    return tmp_path


def test_voc_annotations_are_read_as_coco_boxes(voc_root):
    source = read_voc(voc_root, objects=True)
    row = source.train.images.index("2008_000019.jpg")
    image = source.train.objects[row]
    assert (image.width, image.height) == (500, 375)
    # dog: side 20 + 19 % 30 ... as written; the box (xmin-1, ymin-1, xmax-xmin+1, ymax-ymin+1)
    _, _, items = voc_boxes()["2008_000019"]
    name, x0, y0, x1, y1, _ = items[1]
    assert name == "dog" and image.classes[1] == VOC_CLASSES.index("dog")
    assert image.boxes[1] == (x0 - 1, y0 - 1, x1 - x0 + 1, y1 - y0 + 1)
    assert image.areas[1] == (x1 - x0 + 1) * (y1 - y0 + 1)
    assert image.classes[2] == VOC_CLASSES.index("cat")  # read, ignored by the samplers
    assert source.details["annotations"]["files"] == 16 and source.details["annotations"]["sha256"]


@pytest.mark.parametrize("rule", ["size", "location"])
def test_prepare_voc_observe_reads_the_xml_boxes(voc_root, cache_dir, rule):
    result = invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--observe", rule)
    assert result.exit_code == 0, result.output
    assert f"drawn with the {rule}-biased sampler" in result.output
    labels = load_labels(cache_dir / "voc" / "labels.h5")
    for split, name in (("train", "train"), ("test", "val")):
        observed = getattr(labels, split).observed
        assert ((observed == 1).sum(axis=1) == 1).all() and (observed == -1).sum() == 0
        assert [int(np.argmax(r)) for r in observed] == expected_voc(name, rule)
    provenance = labels.provenance
    assert provenance["observation"] == provenance["observation_test"] == rule
    assert provenance["observer"]["rule"] == rule and "random.Random" in provenance["observer"]["rng"]
    assert provenance["source_details"]["annotations"]["files"] == 16
    assert labels.observation == {"rule": rule, "obs_seed": 1200, **provenance["observer"]}


def test_uniform_stays_the_protocol_sampler_bit_for_bit(voc_root, cache_dir, tmp_path):
    assert invoke("prepare", "voc", "--root", voc_root, "--labels-only").exit_code == 0
    default = load_labels(cache_dir / "voc" / "labels.h5")
    assert invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--observe", "uniform",
                  "--cache", tmp_path / "other").exit_code == 0
    explicit = load_labels(tmp_path / "other" / "voc" / "labels.h5")
    for split in ("train", "test"):
        observed = getattr(default, split).observed
        assert np.array_equal(observed, getattr(explicit, split).observed)
        assert np.array_equal(observed, observe_uniform(getattr(default, split).clean, 1, 0, 1200))
    assert default.provenance["observation"] == "uniform" and "observer" not in default.provenance
    assert default.observation == {"rule": "uniform", "obs_seed": 1200}


def test_missing_xml_and_bad_options_are_refused(voc_root, cache_dir, tmp_path):
    (voc_root / "VOCdevkit" / "VOC2012" / "Annotations" / "2008_000015.xml").unlink()
    result = invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--observe", "size")
    assert result.exit_code == 1 and "2008_000015.xml is missing" in result.output
    result = invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--observe", "location",
                    "--num-neg", "1")
    assert result.exit_code == 1 and "observes one positive and no negative" in result.output
    result = invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--observe", "semantic")
    assert result.exit_code == 1 and "needs --class-weights FILE" in result.output
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({name: 1.0 for name in VOC_CLASSES}))
    result = invoke("prepare", "voc", "--root", voc_root, "--labels-only", "--class-weights", weights)
    assert result.exit_code == 1 and "only for --observe semantic" in result.output
    assert not (cache_dir / "voc" / "labels.h5").exists()


def test_boxes_are_needed_for_size_and_location(cache_dir, shared_data_free_npz):
    result = invoke("prepare", "features", "--npz", shared_data_free_npz, "--name", "toy",
                    "--observe", "size")
    assert result.exit_code == 1
    assert "needs object boxes, which toy (npz) does not have" in result.output


@pytest.fixture
def shared_data_free_npz(tmp_path):
    rng = np.random.RandomState(0)
    y = (rng.rand(30, 4) < 0.4).astype(np.uint8)
    y[:, 0] = 1
    path = tmp_path / "toy.npz"
    np.savez(path, X_train=rng.rand(30, 5).astype(np.float32), X_test=rng.rand(30, 5).astype(np.float32),
             Y_train=y, Y_test=y, label_names=np.array(["a", "b", "c", "d"]),
             feature_names=np.array([f"f{i}" for i in range(5)]))
    return path


# ----------------------------------------------------------------- COCO: the instances files
def test_prepare_coco_location_uses_bbox_and_image_size(tmp_path, cache_dir):
    # train image 5 (640 x 480): the worked example; image 12 (300 x 200): a car at the centre
    # and a person in a corner; 7 and 9 one object each; ids sort as strings: "12" < "5" < "7"
    example = [(5, 1, [100, 100, 50, 100], 5000.0), (5, 18, [300, 200, 200, 100], 20000.0),
               (5, 1, [600, 400, 20, 50], 1000.0), (12, 3, [140, 90, 20, 20], 400.0),
               (12, 1, [0, 0, 10, 10], 90000.0), (7, 1, [0, 0, 9, 9], 81.0),
               (9, 2, [1, 1, 9, 9], 81.0)]
    write_coco(tmp_path, "train", COCO_CATEGORIES, [5, 12, 7, 9], example, sizes={12: (300, 200)})
    write_coco(tmp_path, "val", COCO_CATEGORIES, [3], [(3, 2, [0, 0, 5, 5], 25.0)])
    result = invoke("prepare", "coco", "--root", tmp_path, "--labels-only", "--observe", "location")
    assert result.exit_code == 0, result.output
    labels = load_labels(cache_dir / "coco" / "labels.h5")
    # rows: 12 then 5. Row 12: car centred (d = 0 -> 0.0005) outweighs the person by
    # 180/0.0005; one draw of random.Random(1200) (0.954) picks the car. Row 5: second draw.
    rng = random.Random(1200)
    car = rng.choices(range(4), weights=[1 / math.hypot(145, 95), 0, 1 / 0.0005, 0])[0]
    d = [math.hypot(125 - 320, 150 - 240), math.hypot(400 - 320, 250 - 240),
         math.hypot(610 - 320, 425 - 240)]
    dog = rng.choices(range(4), weights=[1 / d[0] + 1 / d[2], 0, 0, 1 / d[1]])[0]
    assert (car, dog) == (2, 3)
    assert [int(np.argmax(r)) for r in labels.train.observed] == [2, 3, 0, 1]
    result = invoke("prepare", "coco", "--root", tmp_path, "--labels-only", "--observe", "size",
                    "--overwrite")
    assert result.exit_code == 0, result.output
    # size uses the annotation's 'area' field, not its bbox: in row 12 the person's 90000
    # (box 10 x 10) against the car's 400 -> 0.954 < 90000/90400 picks the person (with bbox
    # areas, 100 against 400, it would pick the car)
    labels = load_labels(cache_dir / "coco" / "labels.h5")
    rng = random.Random(1200)
    first = rng.choices(range(4), weights=[90000 / 90400, 0, 400 / 90400, 0])[0]
    second = rng.choices(range(4), weights=[6000 / 26000, 0, 0, 20000 / 26000])[0]
    assert [int(np.argmax(r)) for r in labels.train.observed] == [first, second, 0, 1]
    assert first == 0


def test_coco_bad_boxes_name_the_entry(tmp_path, cache_dir):
    write_coco(tmp_path, "train", COCO_CATEGORIES, [5, 6, 7],
               [(5, 1, [1, 2, 3], 5.0), (6, 1), (7, 2)])
    write_coco(tmp_path, "val", COCO_CATEGORIES, [3], [(3, 2)])
    result = invoke("prepare", "coco", "--root", tmp_path, "--labels-only", "--observe", "size")
    assert result.exit_code == 1
    assert "instances_train2014.json: annotations[0].bbox is [1, 2, 3]" in result.output
    # without a biased sampler the boxes are not read
    assert invoke("prepare", "coco", "--root", tmp_path, "--labels-only").exit_code == 0


# ----------------------------------------------------------------- shapes, and what runs record
def test_shapes_carry_boxes_and_every_biased_sampler_runs(cache_dir, tmp_path):
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({"circle": 5.0, "square": 0.0, "triangle": 1.0, "star": 1.0,
                                   "cross": 1.0, "ring": 1.0, "hexagon": 1.0, "diamond": 1.0,
                                   "crescent": 1.0, "arrow": 1.0}))
    drawn = {}
    for rule in ("size", "location", "semantic"):
        extra = ("--class-weights", weights) if rule == "semantic" else ()
        result = invoke("prepare", "shapes", "--num-train", "30", "--num-test", "10", "--observe",
                        rule, *extra, "--overwrite")
        assert result.exit_code == 0, result.output
        labels = load_labels(cache_dir / "shapes" / "labels.h5")
        assert ((labels.train.observed == 1).sum(axis=1) == 1).all()
        assert labels.provenance["observer"]["rule"] == rule
        drawn[rule] = labels.train.observed.copy()
    boxes = json.loads((cache_dir / "shapes" / "images" / "objects.json").read_text())
    first = boxes["images"]["train/000000.jpg"]
    assert first["width"] > 0 and all(len(o["bbox"]) == 4 and o["area"] > 0 for o in first["objects"])
    assert labels.provenance["observer"]["class_weights"][:2] == [5.0, 0.0]
    # square (weight 0) is never drawn when the image has another positive
    clean = labels.train.clean
    others = (clean[:, 1] == 1) & (clean.sum(axis=1) > 1)
    assert others.any() and drawn["semantic"][others, 1].sum() == 0
    assert not np.array_equal(drawn["size"], drawn["location"])


def test_results_name_the_sampler(cache_dir):
    assert invoke("prepare", "shapes", "--num-train", "20", "--num-test", "10", "--observe",
                  "size").exit_code == 0
    labels = load_labels(cache_dir / "shapes" / "labels.h5")
    from featcache.losses import loss_class

    header = document_header("linear", loss_class("an"), labels)
    assert header["labels"]["observation"]["rule"] == "size"
    assert observation_line(header["labels"]["observation"]) == (
        "- observed labels: size-biased single positives (Arroyo et al. 2023), seed 1200")
    assert observation_line({"rule": "uniform", "obs_seed": 1200}) is None
    result = invoke("features", "--dataset", "shapes", "--weights", "random", "--image-size", "32",
                    "--device", "cpu", "--workers", "0")
    assert result.exit_code == 0, result.output
    result = invoke("train-linear", "--dataset", "shapes", "--loss", "an", "--epochs", "1", "--lr",
                    "1e-2", "--bsize", "8", "--run-id", "b", "--quiet", "--no-plots", "--device",
                    "cpu")
    assert result.exit_code == 0, result.output
    run = cache_dir / "shapes" / "runs" / "an" / "b"
    assert json.loads((run / "results.json").read_text())["labels"]["observation"]["rule"] == "size"
    assert "size-biased single positives" in (run / "summary.md").read_text()


def test_cli_choices_are_the_samplers():
    from featcache.commands.prepare import OBSERVERS
    from featcache.data.bias import OBSERVERS as SAMPLERS

    assert OBSERVERS == SAMPLERS
    with pytest.raises(OptionError, match="choose one of uniform, size, location, semantic"):
        Observer("centre")


def test_info_names_the_biased_sampler(cache_dir):
    assert invoke("prepare", "shapes", "--num-train", "20", "--num-test", "10", "--observe",
                  "location").exit_code == 0
    result = invoke("info", cache_dir / "shapes" / "labels.h5", "--no-classes")
    assert result.exit_code == 0, result.output
    assert "location-biased (Arroyo et al. 2023): one positive per image, seed 1200" in result.output
