"""``featcache prepare l48`` on a generated miniature of the L48 benchmark's layout (the files
cvl-umass/l48-benchmarking's datasets/format_ML48S.py writes and datasets/dataset.py reads)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dataset_fixtures import invoke
from helpers_images import write_image

from featcache.data.formats.l48 import read_l48
from featcache.data.labelfile import load_labels
from featcache.errors import InputError
from featcache.features.extract import ExtractOptions, extract_features

SPECIES = ["amerob", "norcar", "blujay", "houfin"]


def clip_rows(rng, n, empty=0):
    """n clips: labels (present species), the full mask (unknown species 0), and per variant
    its mask as format_ML48S.py builds it (target: the target where present; checklist/geo:
    negatives off the list, the target where present)."""
    labels = np.zeros((n, 4), np.float64)
    for row in labels[empty:]:
        row[rng.choice(4, size=rng.integers(1, 3), replace=False)] = 1
    full = np.ones((n, 4))
    full[rng.random((n, 4)) < 0.15] = 0
    full[labels == 1] = 1
    target = rng.integers(0, 4, n)
    masks = {"full": full, "target": np.zeros((n, 4)), "checklist": np.ones((n, 4)),
             "geo": np.ones((n, 4))}
    for i in range(n):
        on_list = set(rng.choice(4, size=2, replace=False)) | set(np.flatnonzero(labels[i]))
        masks["checklist"][i, sorted(on_list)] = 0
        masks["geo"][i, sorted(on_list | {int(rng.integers(0, 4))})] = 0
        for variant in ("target", "checklist", "geo"):
            masks[variant][i, target[i]] = labels[i, target[i]]
    return labels, masks


def make_l48(root, seed=0):
    """A miniature L48 folder: 14 train, 6 val, 8 test clips of 4 species, tiny spectrograms."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "formatted_metadata.json").write_text(json.dumps(
        {"category_id_to_index": {str(i): i for i in range(4)}, "category_list": SPECIES}))
    made = {}
    for split, n, asset in (("train", 14, 0), ("val", 6, 700), ("test", 8, 8000)):
        images = np.array([f"images/{asset + i // 3}/{i % 3}.jpg" for i in range(n)])
        for i, name in enumerate(images):
            write_image(root / name, seed=seed * 100 + asset + i, size=(40, 24))
        labels, masks = clip_rows(rng, n, empty=1)
        np.save(root / f"{split}_images.npy", images)
        np.save(root / f"{split}_labels.npy", labels)
        for variant, mask in masks.items():
            np.save(root / f"{variant}_{split}_mask.npy", mask)
        made[split] = (images, labels, masks)
    return made


@pytest.fixture(scope="module")
def l48(tmp_path_factory):
    root = tmp_path_factory.mktemp("l48") / "ml48s"
    return root, make_l48(root)


def expected_rows(made, variant):
    """Rows kept by the benchmark's rules and the protocol's: train rows with a known label,
    val/test rows fully annotated, then rows with a present species."""
    out = {}
    for split, (images, labels, masks) in made.items():
        keep = masks[variant].any(axis=1) if split == "train" else masks["full"].all(axis=1)
        keep &= labels.any(axis=1)
        observed = np.where(masks[variant] == 1, np.where(labels == 1, 1, -1), 0)
        out[split] = (list(images[keep]), labels[keep], observed[keep])
    return out


@pytest.mark.parametrize("variant", ["checklist", "target"])
def test_prepare_l48_keeps_real_positives_and_negatives(l48, tmp_path, variant):
    root, made = l48
    cache = tmp_path / "cache"
    result = invoke("prepare", "l48", "--root", root, "--variant", variant, "--cache", cache)
    assert result.exit_code == 0, result.output
    labels = load_labels(cache / "l48" / "labels.h5")
    rows = expected_rows(made, variant)
    assert labels.classes == SPECIES
    # the official train set: L48's train clips, then its val clips (L48's own validation split)
    assert list(labels.train.images) == rows["train"][0] + rows["val"][0]
    assert list(labels.train.images[labels.val_index]) == rows["val"][0]
    assert list(labels.train.images[labels.train_index]) == rows["train"][0]
    np.testing.assert_array_equal(labels.train.observed,
                                  np.concatenate([rows["train"][2], rows["val"][2]]))
    np.testing.assert_array_equal(labels.train.clean,
                                  np.concatenate([rows["train"][1], rows["val"][1]]))
    assert list(labels.test.images) == rows["test"][0]
    np.testing.assert_array_equal(labels.test.clean, rows["test"][1])
    negatives = (labels.train.observed == -1).any()
    assert negatives == (variant == "checklist")  # real negatives only where the variant has them
    if variant == "target":  # real single positives: at most one observed label per clip
        assert ((labels.train.observed == 1).sum(axis=1) <= 1).all()
    details = labels.provenance["source_details"]
    assert details["variant"] == variant and labels.provenance["observation"] == "given"
    assert labels.provenance["val_split"] == "given by the source"
    test_dropped = int((~made["test"][2]["full"].all(axis=1)).sum())
    assert details["dropped_not_fully_annotated"]["test"] == test_dropped
    assert f"given ({variant} variant)" in result.output
    shown = invoke("info", cache / "l48")
    assert shown.exit_code == 0, shown.output
    assert f"L48's {variant} variant" in shown.output and "given by the source" in shown.output


def test_every_loss_trains_on_l48_with_its_real_negatives(l48, tmp_path):
    root, _ = l48
    cache = tmp_path / "cache"
    made = invoke("prepare", "l48", "--root", root, "--variant", "checklist", "--name",
                  "l48-checklist", "--cache", cache)
    assert made.exit_code == 0, made.output
    extract_features("l48-checklist", ExtractOptions(
        backbone="test-clip", weights="random", image_size=32, device="cpu", workers=0,
        cache=str(cache)), say=lambda _: None)
    trained = invoke("train-linear", "--dataset", "l48-checklist", "--cache", cache, "--loss",
                     "an,iu,role", "--epochs", "1", "--lr", "1e-2", "--bsize", "4", "--quiet",
                     "--no-plots", "--device", "cpu", "--run-id", "r", "--jobs", "1")
    assert trained.exit_code == 0, trained.output
    document = json.loads((cache / "l48-checklist" / "runs" / "iu" / "r" / "results.json")
                          .read_text())
    assert not any("drawn" in note for note in document["notes"])  # iu used the real negatives
    assert document["protocol"]["val_variant"] == "clean"


def test_l48_layout_errors_name_the_file(l48, tmp_path):
    root, _ = l48
    with pytest.raises(InputError, match="unknown L48 variant 'nope'"):
        read_l48(root, "nope")
    with pytest.raises(InputError, match=r"L48 folder .* does not exist; run the benchmark's"):
        read_l48(tmp_path / "absent")
    broken = tmp_path / "broken"
    make_l48(broken, seed=1)
    (broken / "geo_val_mask.npy").unlink()
    with pytest.raises(InputError, match=r"geo_val_mask.npy is missing; run the benchmark's "
                                         r"`python datasets/format_ML48S.py"):
        read_l48(broken, "geo")
    np.save(broken / "checklist_test_mask.npy", np.full((8, 4), 2.0))
    with pytest.raises(InputError, match=r"checklist_test_mask.npy: row 0, column 0 holds 2.0"):
        read_l48(broken, "checklist")
    np.save(broken / "full_train_mask.npy", np.ones((3, 4)))
    with pytest.raises(InputError, match=r"full_train_mask.npy has 3 rows but its split lists 14"):
        read_l48(broken, "full")
    refused = invoke("prepare", "l48", "--root", root, "--num-neg", "1", "--cache",
                     tmp_path / "c")
    assert refused.exit_code != 0 and "given observations" in refused.output


def test_iu_on_the_target_variant_draws_negatives_beside_the_given_positives(l48, tmp_path):
    from featcache.data.negatives import observed_with_negatives

    root, _ = l48
    cache = tmp_path / "cache"
    assert invoke("prepare", "l48", "--root", root, "--cache", cache).exit_code == 0
    labels = load_labels(cache / "l48" / "labels.h5")
    rows = labels.train_index
    given = labels.train.observed[rows]
    drawn, note = observed_with_negatives(labels, rows, given, num_neg=1)
    assert "beside the given observations" in note
    np.testing.assert_array_equal(drawn[given != 0], given[given != 0])  # nothing given changes
    added = (drawn == -1) & (given == 0)
    clean = labels.train.clean[rows]
    assert (clean[added] == 0).all()  # drawn among the clean negatives
    assert (added.sum(axis=1) == np.minimum(1, ((clean == 0) & (given == 0)).sum(axis=1))).all()
    again, _ = observed_with_negatives(labels, rows[:3], given[:3], num_neg=1)
    np.testing.assert_array_equal(again, drawn[:3])  # a row's draw does not depend on the rows
