"""``load_run``, ``featcache predict`` and ``featcache cam`` on a small image dataset's runs."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from helpers_finetune import NAME, copy_cache, finetune, linear_run
from helpers_images import write_image
from PIL import Image
from sklearn.base import clone

from featcache import SPMLClassifier, load_run
from featcache.api.cam import class_activation_maps, logit_maps, read_image
from featcache.data.featurefile import load_features
from featcache.data.labelfile import load_labels
from featcache.errors import InputError, OptionError
from featcache.metrics import mean_average_precision

FEATURES = "features-resnet50-random.h5"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The image fixture's cache with its linear ROLE run and a one-epoch fine-tuned run."""
    root = copy_cache(tmp_path_factory.getbasetemp(), tmp_path_factory.mktemp("runs") / "cache")
    result = finetune(root, "--loss", "role", "--init", "best", "--epochs", "1", "--lr", "1e-3",
                      "--bsize", "4", "--run-id", "ft")
    assert result.exit_code == 0, result.output
    return root


def finetuned(cache):
    return cache / NAME / "finetune" / "role" / "ft"


def images_of(cache, split="test"):
    labels = load_labels(cache / NAME / "labels.h5")
    root = Path(labels.image_root)
    return [root / str(p) for p in labels.split(split).images], labels


def test_a_linear_run_describes_itself_and_predicts_its_own_numbers(cache):
    run = load_run(linear_run(cache))
    assert run.stage == "linear" and run.loss == "role" and run.classes == ["class0", "class1", "class2"]
    document = json.loads((linear_run(cache) / "results.json").read_text())
    assert run.config["params"] == document["selection"]["params"] and "k" in run.config["params"]
    assert run.config["settings"] == document["settings"]
    assert (run.config["lr"], run.config["batch_size"], run.config["epoch"]) == (
        document["selection"]["lr"], document["selection"]["batch_size"], document["selection"]["epoch"])
    assert run.metrics["test_map"] == document["selection"]["test_map"]
    assert run.config["image_size"] == 32 and run.feature_dim == 2048
    # Its head on the test rows of its features file gives exactly the recorded test mAP.
    features = load_features(cache / NAME / FEATURES)
    labels = load_labels(cache / NAME / "labels.h5")
    probs = run.predict_proba(features.test)
    value = mean_average_precision(torch.from_numpy(probs), torch.from_numpy(labels.test.clean).float())
    assert float(value) == pytest.approx(run.metrics["test_map"], abs=1e-9)
    # The same for the features file given by path (checked against the run).
    assert np.array_equal(run.predict_proba(cache / NAME / FEATURES)[-len(labels.test.images):], probs)
    # Images go through the backbone its features came from: the same features, the same output.
    paths, _ = images_of(cache)
    from_images = run.predict_proba_images(paths, progress=False)
    np.testing.assert_allclose(from_images, probs, atol=1e-5)
    np.testing.assert_allclose(run.embed_images(paths[:2], progress=False), features.test[:2],
                               rtol=1e-4, atol=1e-5)


def test_a_linear_run_is_a_fitted_estimator(cache):
    run = load_run(linear_run(cache))
    clf = run.to_estimator()
    assert isinstance(clf, SPMLClassifier) and list(clf.classes_) == run.classes
    assert clf.get_params()["loss"] == "role" and clf.loss_params_ == run.config["params"]
    features = load_features(cache / NAME / FEATURES).test
    assert np.array_equal(clf.predict_proba(features), run.predict_proba(features))
    assert clf.loss_state_["phi"].shape[1] == 3 and clf.best_epoch_ == run.config["epoch"]
    assert len(clf.history_) == run.config["epochs"]
    assert not hasattr(clone(clf), "coef_")
    with pytest.raises(InputError, match=r"do not fit .* it takes \(n, 2048\) resnet50 features"):
        run.predict_proba(features[:, :10])


def test_a_finetuned_run_predicts_its_own_numbers_from_images(cache):
    run = load_run(finetuned(cache))
    document = json.loads((finetuned(cache) / "results.json").read_text())
    assert run.stage == "finetune" and run.config["params"] == document["selection"]["params"]
    assert run.metrics["evaluation"]["test"]["positives_per_class"].keys() == set(run.classes)
    assert run.metrics["test_map_classes_with_positives"] is not None
    paths, labels = images_of(cache)
    probs = run.predict_proba_images(paths, batch_size=3, progress=False)
    value = mean_average_precision(torch.from_numpy(probs), torch.from_numpy(labels.test.clean).float())
    assert float(value) == pytest.approx(document["selection"]["test_map"], abs=1e-4)
    assert np.allclose(run.predict_proba(run.embed_images(paths, progress=False)), probs, atol=1e-5)
    with pytest.raises(OptionError, match="fine-tuned run"):
        run.to_estimator()
    # its trunk is the fine-tuned one, not stage one's
    linear = load_run(linear_run(cache))
    assert not np.allclose(run.embed_images(paths[:1], progress=False),
                           linear.embed_images(paths[:1], progress=False))


def test_load_run_refuses_what_is_not_a_finished_run(cache, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    with pytest.raises(InputError, match="not a finished run"):
        load_run(tmp_path / "half")
    assert load_run(linear_run(cache) / "best.pt").stage == "linear"


# ------------------------------------------------------------------ featcache predict
def _rows(text):
    return list(csv.reader(io.StringIO(text)))


def test_predict_writes_one_row_per_image_of_a_folder(cache, tmp_path):
    folder = tmp_path / "new"
    for index in range(3):
        write_image(folder / f"img{index}.jpg", seed=100 + index)
    write_image(folder / "deeper" / "img3.png", "png", seed=103)
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "p.csv"
    for run in (linear_run(cache), finetuned(cache)):
        result = invoke("predict", "--run", run, folder, "--out", out, "--device", "cpu",
                        "--quiet", "--overwrite")
        assert result.exit_code == 0, result.output
        rows = _rows(out.read_text())
        assert rows[0] == ["image", "class0", "class1", "class2"]
        assert [r[0] for r in rows[1:]] == [str(folder / n) for n in
                                            ("deeper/img3.png", "img0.jpg", "img1.jpg", "img2.jpg")]
        probs = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
        expected = load_run(run).predict_proba_images(sorted(folder.rglob("*.*g")), progress=False)
        np.testing.assert_allclose(probs, expected, rtol=1e-5)
    jsonl = invoke("predict", "--run", linear_run(cache), folder / "img0.jpg", "--top-k", "2",
                   "--format", "jsonl", "--device", "cpu", "--quiet")
    assert jsonl.exit_code == 0, jsonl.output
    record = json.loads(jsonl.stdout.strip().splitlines()[-1])
    assert record["image"] == str(folder / "img0.jpg") and len(record["labels"]) == 2
    assert record["labels"][0]["probability"] >= record["labels"][1]["probability"]


def test_predict_names_a_corrupt_image_and_can_leave_it_out(cache, tmp_path):
    folder = tmp_path / "mixed"
    write_image(folder / "good.jpg", seed=1)
    write_image(folder / "bad.jpg", "truncated", seed=2)
    result = invoke("predict", "--run", linear_run(cache), folder, "--device", "cpu", "--quiet")
    assert result.exit_code != 0
    assert f"cannot read image {folder / 'bad.jpg'}" in result.output and "--skip-bad" in result.output
    skipped = invoke("predict", "--run", linear_run(cache), folder, "--device", "cpu", "--quiet",
                     "--skip-bad", "--threshold", "0")
    assert skipped.exit_code == 0, skipped.output
    rows = _rows(skipped.stdout)
    assert [r[0] for r in rows[1:]] == [str(folder / "good.jpg")]
    assert rows[0][-1] == "labels" and sorted(rows[1][-1].split(";")) == ["class0", "class1", "class2"]
    assert "left out" in skipped.output and "bad.jpg" in skipped.output


def test_predict_scores_a_features_file_and_arrays(cache, tmp_path):
    run = load_run(linear_run(cache))
    features = load_features(cache / NAME / FEATURES)
    result = invoke("predict", "--run", linear_run(cache), "--features", cache / NAME / FEATURES,
                    "--split", "test", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    labels = load_labels(cache / NAME / "labels.h5")
    assert [r["image"] for r in records] == list(labels.test.images)
    got = np.array([[r["probabilities"][c] for c in run.classes] for r in records])
    np.testing.assert_allclose(got, run.predict_proba(features.test), rtol=1e-6)
    np.save(tmp_path / "x.npy", features.test[:4])
    npy = invoke("predict", "--run", linear_run(cache), "--features", tmp_path / "x.npy")
    assert npy.exit_code == 0 and len(_rows(npy.stdout)) == 5


@pytest.mark.parametrize("make, message", [
    (lambda p: np.save(p / "narrow.npy", np.zeros((2, 10), np.float32)) or p / "narrow.npy",
     "holds 10-d features but run"),
    (lambda p: np.savez(p / "other.npz", X=np.zeros((2, 2048), np.float32),
                        classes=np.array(["cat", "dog", "bird"])) or p / "other.npz",
     "is labelled with classes [cat, dog, bird] (3) but run"),
    (lambda p: np.savez(p / "nox.npz", Z=np.zeros((2, 3))) or p / "nox.npz", "holds no X array"),
])
def test_predict_refuses_an_input_that_does_not_fit_the_run(cache, tmp_path, make, message):
    path = make(tmp_path)
    result = invoke("predict", "--run", linear_run(cache), "--features", path)
    assert result.exit_code != 0
    assert message in result.output


def test_a_run_of_other_classes_or_backbone_is_refused_and_other_classes_can_be_forced(cache, tmp_path):
    np.savez(tmp_path / "other.npz", X=np.zeros((2, 2048), np.float32),
             classes=np.array(["cat", "dog", "bird"]))
    forced = invoke("predict", "--run", linear_run(cache), "--features", tmp_path / "other.npz",
                    "--other-classes")
    assert forced.exit_code == 0 and len(_rows(forced.stdout)) == 3
    # stage one's features of other weights (seed 7) are refused for the run's head
    other = tmp_path / "cache"
    shutil.copytree(cache / NAME, other / NAME, ignore=shutil.ignore_patterns("runs", "finetune"))
    from featcache.features.extract import ExtractOptions, extract_features

    extract_features(NAME, ExtractOptions(weights="random", seed=7, image_size=32, device="cpu",
                                          workers=0, cache=str(other),
                                          images_root=load_labels(cache / NAME / "labels.h5").image_root),
                     say=lambda _: None)
    result = invoke("predict", "--run", linear_run(cache), "--features",
                    other / NAME / "features-resnet50-random7.h5")
    assert result.exit_code != 0 and "other weights" in result.output
    fine = invoke("predict", "--run", finetuned(cache), "--features", cache / NAME / FEATURES)
    assert fine.exit_code != 0 and "predict from images" in fine.output


def test_predict_needs_either_features_or_images(cache):
    result = invoke("predict", "--run", linear_run(cache))
    assert result.exit_code != 0 and "either --features FILE or IMAGES" in result.output


# ------------------------------------------------------------------ class activation maps
@pytest.mark.parametrize("which", ["linear", "finetune"])
def test_class_activation_maps_are_exact(cache, which):
    run = load_run(linear_run(cache) if which == "linear" else finetuned(cache))
    paths, _ = images_of(cache)
    maps, logits = logit_maps(run, read_image(paths[0]), torch.device("cpu"))
    assert maps.shape[0] == 3 and maps.dim() == 3
    # The mean over positions of W_c . F + b_c is the class's logit, as predict computes it.
    predicted = run.decision_function(run.embed_images(paths[:1], progress=False))[0]
    np.testing.assert_allclose(maps.mean(dim=(1, 2)).numpy(), predicted, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits, predicted, rtol=1e-4, atol=1e-5)
    drawn = class_activation_maps(run, paths[0], classes=["class2"])
    image = Image.open(paths[0])
    assert drawn.maps[0].name == "class2" and drawn.maps[0].logits.shape == (image.height, image.width)
    assert 0.0 <= drawn.maps[0].normalised().min() and drawn.maps[0].normalised().max() <= 1.0


def test_cam_writes_a_comparison_figure(cache, tmp_path):
    paths, _ = images_of(cache)
    out = tmp_path / "cam.png"
    result = invoke("cam", "--run", linear_run(cache), "--run", finetuned(cache), paths[0],
                    "--top", "2", "--out", out, "--device", "cpu")
    assert result.exit_code == 0, result.output
    with Image.open(out) as png:
        assert png.format == "PNG" and png.width > png.height  # 2 rows x 3 panels
    again = invoke("cam", "--run", linear_run(cache), paths[0], "--out", out, "--device", "cpu")
    assert again.exit_code != 0 and "--overwrite" in again.output
    wrong = invoke("cam", "--run", linear_run(cache), paths[0], "--class", "clas1", "--out",
                   tmp_path / "x.png", "--device", "cpu")
    assert wrong.exit_code != 0 and "unknown class 'clas1'; did you mean 'class1'" in wrong.output
    bad = tmp_path / "bad.jpg"
    write_image(bad, "garbage")
    broken = invoke("cam", "--run", linear_run(cache), bad, "--out", tmp_path / "y.png",
                    "--device", "cpu")
    assert broken.exit_code != 0 and f"cannot read image {bad}" in broken.output


def test_tables_of_finetuned_runs_and_no_mixing_of_stages(cache):
    from featcache.protocol.results_table import ResultsTable

    text = invoke("table", finetuned(cache)).stdout
    assert "networks fine-tuned end to end (stage three)" in text and "from LinearInit" in text
    with pytest.raises(InputError, match="mix stages"):
        ResultsTable.from_paths([linear_run(cache), finetuned(cache)])


def test_predict_and_cam_never_import_scikit_learn():
    """The run objects and the commands that use them import scikit-learn only to build its
    objects (``to_estimator``, ``to_pipeline``): about 2 CPU-seconds less per command."""
    import subprocess
    import sys
    code = ("import sys, featcache.api.runs, featcache.commands.predict, featcache.commands.cam\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
