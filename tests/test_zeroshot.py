"""The zero-shot row: CLIP's cosine scores against the class prompts, no training, as a run of
``train-linear`` (``--loss all`` and ``--loss zero-shot``), in the losses table and
``featcache table``, and as ``ZeroShotClassifier`` (generated images, tiny random CLIP)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke
from helpers_images import make_dataset
from sklearn.metrics import average_precision_score

from featcache import ZeroShotClassifier
from featcache.data.featurefile import read_text_embeddings
from featcache.data.labelfile import load_labels
from featcache.errors import InputError
from featcache.features.extract import ExtractOptions, extract_features
from featcache.linear.run import LinearOptions, run_linear

COMMON = ("--epochs", "1", "--lr", "1e-2", "--bsize", "4", "--quiet", "--no-plots", "--device",
          "cpu")


def clip_features(base, text: bool):
    make_dataset(base, num_train=16, num_test=8, num_classes=3)
    extract_features("toy", ExtractOptions(backbone="test-clip", weights="random", image_size=32,
                                           text=text, device="cpu", workers=0,
                                           cache=str(base / "cache")), say=lambda _: None)
    return base / "cache"


@pytest.fixture(scope="module")
def clip_cache(tmp_path_factory):
    return clip_features(tmp_path_factory.mktemp("zero"), text=True)


def hand_map(features, texts, targets) -> float:
    """mAP in percent of cosine scores, computed from the definition with scikit-learn."""
    images = features / np.linalg.norm(features, axis=1, keepdims=True)
    scores = (images @ (texts / np.linalg.norm(texts, axis=1, keepdims=True)).T).astype(np.float32)
    return 100 * np.mean([average_precision_score(targets[:, c], scores[:, c])
                          if targets[:, c].any() else 0.0 for c in range(targets.shape[1])])


def stored(cache):
    path = cache / "toy" / "features-test-clip-random.h5"
    with h5py.File(path, "r") as h5:
        return path, h5["train/features"][()], h5["test/features"][()]


def test_loss_all_writes_the_zero_shot_row_with_hand_computed_maps(clip_cache):
    result = invoke("train-linear", "--dataset", "toy", "--cache", clip_cache, "--loss", "all",
                    "--run-id", "a", *COMMON)
    assert result.exit_code == 0, result.output
    labels = load_labels(clip_cache / "toy" / "labels.h5")
    path, train, test = stored(clip_cache)
    texts = read_text_embeddings(path).embeddings
    folder = clip_cache / "toy" / "runs" / "zero-shot" / "a"
    document = json.loads((folder / "results.json").read_text())
    selection = document["selection"]
    val_rows, train_rows = labels.val_index, labels.train_index
    assert selection["val_map"] == pytest.approx(
        hand_map(train[val_rows], texts, labels.train.clean[val_rows]), abs=1e-9)
    assert selection["test_map"] == pytest.approx(hand_map(test, texts, labels.test.clean),
                                                  abs=1e-9)
    assert selection["train_map"] == pytest.approx(
        hand_map(train[train_rows], texts, labels.train.clean[train_rows]), abs=1e-9)
    observed = (labels.train.observed[val_rows] == 1).astype(int)
    assert selection["val_map_observed"] == pytest.approx(hand_map(train[val_rows], texts,
                                                                   observed), abs=1e-9)
    assert selection["lr"] is None and document["grid"]["lr"] == []
    assert document["loss"] == "zero-shot" and "Radford" in document["loss_reference"]
    assert document["summary"]["test_map_mean"] == selection["test_map"]
    assert (folder / "summary.md").is_file()
    from featcache import load_run
    with pytest.raises(InputError, match="is a zero-shot row .*ZeroShotClassifier.from_features"):
        load_run(folder)
    # the table: the zero-shot row first, every loss's test mAP above it
    table = json.loads((clip_cache / "toy" / "runs" / "table-a.json").read_text())
    assert table[0]["loss"] == "zero-shot" and table[0]["lr"] == "-"
    assert table[0]["above zero-shot"] == 0.0
    for row in table[1:]:
        assert row["above zero-shot"] == pytest.approx(row["test mAP"] - selection["test_map"])
    assert "zero-shot: val" in result.output and "no training" in result.output
    # a second call reuses it; featcache table shows it beside the losses
    again = invoke("train-linear", "--dataset", "toy", "--cache", clip_cache, "--loss",
                   "zero-shot,an", "--run-id", "a", *COMMON)
    assert again.exit_code == 0, again.output
    assert "zero-shot: run a already finished with these settings; reusing it" in again.output
    shown = invoke("table", clip_cache / "toy" / "runs" / "zero-shot" / "a",
                   clip_cache / "toy" / "runs" / "an" / "a", "--per-class")
    assert shown.exit_code == 0, shown.output
    assert "| zero-shot" in shown.output and "no training" in shown.output
    # its test scores (the cosines) are kept, and the table compares every loss with it
    with h5py.File(folder / "test-scores.h5", "r") as h5:
        kept = h5["scores"][0]
    unit = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    assert np.allclose(kept, test / np.linalg.norm(test, axis=1, keepdims=True) @ unit.T,
                       atol=1e-6)
    compared = invoke("table", folder, clip_cache / "toy" / "runs" / "an" / "a", "--versus",
                      "zero-shot", "--format", "json")
    assert compared.exit_code == 0, compared.output
    cells = {row["loss"]: row["toy"]["uncertainty"] for row in json.loads(compared.stdout)["rows"]}
    assert cells["zero-shot"]["interval"] == document["uncertainty"]["test_map"]
    assert 0 <= cells["an"]["versus"]["wins"] <= 1


def test_zero_shot_alone_and_its_refusals(tmp_path, clip_cache):
    alone = run_linear(LinearOptions(dataset="toy", losses="zero-shot", cache=str(clip_cache),
                                     run_id="z", progress=False, plots=False, device="cpu"),
                       say=lambda _: None)
    assert [run.loss for run in alone.runs] == ["zero-shot"] and alone.table is None
    cache = clip_features(tmp_path, text=False)
    lines = []
    every = run_linear(LinearOptions(dataset="toy", losses="all", cache=str(cache), epochs=1,
                                     learning_rates=[1e-2], batch_sizes=[4], progress=False,
                                     plots=False, device="cpu"), say=lines.append)
    assert "zero-shot" not in [run.loss for run in every.runs]
    assert any(line.startswith("skipping zero-shot: needs class-prompt text embeddings")
               for line in lines)
    with pytest.raises(InputError, match="no class-prompt text embeddings") as refused:
        run_linear(LinearOptions(dataset="toy", losses="zero-shot", cache=str(cache),
                                 progress=False, device="cpu"), say=lambda _: None)
    # the command the refusal names adds the embeddings (here with the toy's cache and weights)
    command = str(refused.value).split("`")[1].split()[1:]
    added = invoke(*command, "--cache", cache, "--weights", "random", "--image-size", "32",
                   "--device", "cpu", "--workers", "0")
    assert added.exit_code == 0, added.output
    run_linear(LinearOptions(dataset="toy", losses="zero-shot", cache=str(cache),
                             progress=False, device="cpu"), say=lambda _: None)


def test_zero_shot_classifier_scores_the_cosines(clip_cache):
    labels = load_labels(clip_cache / "toy" / "labels.h5")
    path, train, test = stored(clip_cache)
    zero = ZeroShotClassifier.from_features(path)
    assert zero.fit(train, labels.train.observed) is zero
    texts = read_text_embeddings(path).embeddings
    assert list(zero.classes_) == list(labels.classes)
    assert zero.score(test, labels.test.clean) == pytest.approx(
        hand_map(test, texts, labels.test.clean), abs=1e-9)
    scores = zero.decision_function(test)
    expected = (test / np.linalg.norm(test, axis=1, keepdims=True)) @ texts.T
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    predicted = zero.predict(test)
    assert (predicted.sum(axis=1) == 1).all()
    assert (predicted.argmax(axis=1) == expected.argmax(axis=1)).all()
    with pytest.raises(ValueError, match="X has 3 features per row"):
        ZeroShotClassifier(texts).fit(train[:, :3])
    with pytest.raises(InputError, match="labels.h5 is not a featcache features file"):
        ZeroShotClassifier.from_features(clip_cache / "toy" / "labels.h5")
