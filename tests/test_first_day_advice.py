"""Issue 25, first-day fixes: every piece of advice featcache prints works when followed.

Each test reads the suggestion out of the message and runs it as printed.
"""

from __future__ import annotations

import re
import shlex

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke

from featcache.losses.needs import NOT_FOR_IMPORTED

FAST = ("--epochs", "1", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots",
        "--device", "cpu")


def feature_set(path, rows=60, test_rows=30, dim=8, classes=3, seed=0):
    """An .npz feature set with every row holding a positive."""
    rng = np.random.RandomState(seed)

    def labels(n):
        y = (rng.rand(n, classes) < 0.4).astype(np.uint8)
        y[np.arange(n), rng.randint(0, classes, n)] = 1
        return y

    np.savez(path, X_train=rng.rand(rows, dim).astype(np.float32),
             X_test=rng.rand(test_rows, dim).astype(np.float32), Y_train=labels(rows),
             Y_test=labels(test_rows), label_names=np.array(["a", "b", "c"][:classes]))
    return path


def suggested(text: str, start: str = "featcache ") -> list[str]:
    """Every backquoted command in ``text`` that starts with ``start``."""
    return [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(start)]


def run_suggestion(command: str):
    """Run a printed ``featcache ...`` command in-process, as a user would paste it."""
    words = shlex.split(command)
    assert words[0] == "featcache", command
    return invoke(*words[1:])


@pytest.fixture
def imported(tmp_path, cache_dir):
    npz = feature_set(tmp_path / "set.npz")
    result = invoke("prepare", "features", "--npz", npz, "--name", "imp")
    assert result.exit_code == 0, result.output
    return npz


def test_bad_features_of_an_imported_set_advise_importing_again(imported, cache_dir):
    path = cache_dir / "imp" / "features-imported.h5"
    with h5py.File(path, "r+") as h5:
        h5["train/features"][3, 1] = np.nan
    result = invoke("train-linear", "--dataset", "imp", "--loss", "an", *FAST)
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert "NaN or Inf" in error and "`featcache features" not in error
    fixes = suggested(error)
    assert fixes == [f"featcache prepare features --npz {imported} --name imp --overwrite"]
    assert run_suggestion(fixes[0]).exit_code == 0
    result = invoke("train-linear", "--dataset", "imp", "--loss", "an", *FAST)
    assert result.exit_code == 0, result.output


def test_loss_all_on_an_imported_set_says_what_is_not_available(imported, cache_dir):
    result = invoke("train-linear", "--dataset", "imp", "--loss", "all", "--run-id", "r",
                    *FAST)
    assert result.exit_code == 0, result.output
    skips = [line for line in result.output.splitlines() if line.startswith("skipping ")]
    skipped = {line.split(":")[0].split()[1]: line for line in skips}
    for name in ("an+boostlu", "ll-r+boostlu", "vlpl", "gpr"):
        assert NOT_FOR_IMPORTED in skipped[name], skipped[name]
        assert "`featcache" not in skipped[name]
    result = invoke("train-linear", "--dataset", "imp", "--loss", "an+boostlu", *FAST)
    assert result.exit_code == 1
    assert NOT_FOR_IMPORTED in result.output
    assert "--backbone imported" not in result.output


def test_cam_on_a_run_from_imported_features_says_it_has_no_images(imported, cache_dir, tmp_path):
    from PIL import Image

    assert invoke("train-linear", "--dataset", "imp", "--loss", "an", "--run-id", "r",
                  *FAST).exit_code == 0
    run = cache_dir / "imp" / "runs" / "an" / "r"
    image = tmp_path / "photo.jpg"
    Image.new("RGB", (64, 64), "red").save(image)
    errors = {}
    for name, command in (("predict", ["predict", "--run", run, image, "--device", "cpu"]),
                          ("cam", ["cam", "--run", run, image, "--out", tmp_path / "cam.png",
                                   "--device", "cpu"])):
        result = invoke(*command)
        assert result.exit_code == 1
        errors[name] = result.output.strip().splitlines()[-1]
        assert "has features but no images" in errors[name], errors[name]
        assert "unknown backbone" not in errors[name]
    assert errors["cam"] == errors["predict"]
    fix = suggested(errors["cam"])
    assert fix == [f"featcache predict --run {run} --features FILE"]
    features = cache_dir / "imp" / "features-imported.h5"
    result = run_suggestion(fix[0].replace("FILE", str(features)))
    assert result.exit_code == 0, result.output


def test_train_linear_backbone_finds_the_only_features_file_of_that_backbone(cache_dir):
    import shutil

    from linear_fixtures import synthetic_dataset

    _, toy = synthetic_dataset(cache_dir)
    root = toy.parent

    def features_of(backbone: str, tag: str):
        path = root / f"features-{tag}.h5"
        shutil.copy(toy, path)
        with h5py.File(path, "r+") as h5:
            h5.attrs["backbone"] = backbone
        return path

    features_of("clip-vit-b16", "clip-vit-b16-random")
    features_of("clip-vit-l14-336", "clip-vit-l14-336")
    result = invoke("train-linear", "--dataset", "toy", "--backbone", "clip-vit-b16",
                    "--loss", "an", "--run-id", "b16", *FAST)
    assert result.exit_code == 0, result.output
    assert ("--backbone clip-vit-b16: using features-clip-vit-b16-random.h5, the only features "
            "file of that backbone") in result.output
    results = cache_dir / "toy" / "runs" / "an" / "b16" / "results.json"
    assert "features-clip-vit-b16-random.h5" in results.read_text()
    # several files of the backbone, or none: every file is listed with its --backbone value
    features_of("clip-vit-b16", "clip-vit-b16-v2")
    for backbone in ("clip-vit-b16", "clip-vit-l14"):
        result = invoke("train-linear", "--dataset", "toy", "--backbone", backbone, "--loss",
                        "an", *FAST)
        assert result.exit_code == 1
        error = result.output.strip().splitlines()[-1]
        for tag in ("clip-vit-b16-random", "clip-vit-b16-v2", "clip-vit-l14-336", "toy"):
            assert f"features-{tag}.h5 (--backbone {tag})" in error, error
    result = invoke("train-linear", "--dataset", "toy", "--backbone", "clip-vit-b16-v2",
                    "--loss", "an", *FAST)
    assert result.exit_code == 0, result.output


def test_info_resolves_a_dataset_name_and_advises_on_a_run_folder(imported, cache_dir):
    by_name = invoke("info", "imp")
    assert by_name.exit_code == 0, by_name.output
    assert by_name.output == invoke("info", cache_dir / "imp").output
    assert "features-imported.h5" in by_name.output
    wrong = invoke("info", "ipm")
    assert wrong.exit_code == 1 and "did you mean 'imp'" in wrong.output
    assert invoke("train-linear", "--dataset", "imp", "--loss", "an", "--run-id", "r",
                  *FAST).exit_code == 0
    for folder in (cache_dir / "imp" / "runs" / "an" / "r", cache_dir / "imp" / "runs"):
        result = invoke("info", folder)
        assert result.exit_code == 1
        error = result.output.strip().splitlines()[-1]
        assert "featcache prepare" not in error
        fixes = suggested(error)
        assert fixes == [f"featcache table {folder}"], error
        assert run_suggestion(fixes[0]).exit_code == 0


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_files_name_the_fix(imported, cache_dir):
    truncate(cache_dir / "imp" / "features-imported.h5")
    result = invoke("train-linear", "--dataset", "imp", "--loss", "an", *FAST)
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert "truncated or corrupt" in error
    fixes = suggested(error)
    assert fixes == [f"featcache prepare features --npz {imported} --name imp --overwrite"]
    assert run_suggestion(fixes[0]).exit_code == 0
    assert invoke("train-linear", "--dataset", "imp", "--loss", "an", *FAST).exit_code == 0
    truncate(cache_dir / "imp" / "labels.h5")
    result = invoke("train-linear", "--dataset", "imp", "--loss", "an", *FAST)
    error = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and "truncated or corrupt" in error
    assert "make it again with the command that made it and --overwrite" in error, error
    assert "featcache info" not in error


def test_a_features_file_of_other_settings_shows_the_keys_that_differ():
    from featcache.protocol.runs import describe_differences

    old = {"transform": {"resize": 448, "crop": None, "interpolation": "bilinear",
                         "normalize": "imagenet", "decode": "pil"}, "weights": "random"}
    new = {"transform": {**old["transform"], "resize": 224}, "weights": "random"}
    assert describe_differences(old, new) == "transform.resize: 448 -> 224"


def test_a_generated_set_says_what_is_not_available_like_an_imported_one(tmp_path):
    """The benchmarks' generated sets have no images either: their skip lines must not
    suggest `featcache features --backbone synthetic --spatial`, which cannot work."""
    from benchmarks.linear import synthetic_dataset
    from featcache.data.labelfile import load_labels
    from featcache.losses import loss_class
    from featcache.protocol.loss_choice import training_facts
    labels_path, _, _ = synthetic_dataset("voc", root=tmp_path)
    labels = load_labels(labels_path)
    facts = training_facts(labels, labels.train.observed, True)
    assert facts.imported
    for name in ("an+boostlu", "ignore", "vlpl"):
        reason = loss_class(name).unmet_need(facts) or ""
        assert NOT_FOR_IMPORTED in reason and "featcache features" not in reason, reason


def test_without_dataset_the_only_prepared_one_is_taken_else_they_are_named(tmp_path, cache_dir):
    """Issue 36, item 15: `train-linear --loss an-ls` and `finetune --init best` without
    --dataset said only "Missing option '--dataset'"."""
    from faults import run

    none = run(["train-linear", "--loss", "an-ls"], cwd=tmp_path)
    assert none.returncode == 1 and none.stderr == (
        f"Error: --dataset NAME is missing and no dataset is prepared in {cache_dir}: prepare "
        "one first (`featcache prepare --help` lists the formats)\n")
    assert invoke(*shlex.split(suggested(none.stderr)[0])[1:]).exit_code == 0
    assert invoke("prepare", "features", "--npz", feature_set(tmp_path / "a.npz"), "--name",
                  "first").exit_code == 0
    only = run(["train-linear", "--loss", "an-ls", *FAST, "--run-id", "r"], cwd=tmp_path)
    assert only.returncode == 0, only.stderr
    assert f"note: --dataset first: the only dataset prepared in {cache_dir}" in only.stderr
    assert (cache_dir / "first" / "runs" / "an-ls" / "r" / "results.json").is_file()
    assert invoke("prepare", "features", "--npz", feature_set(tmp_path / "b.npz", seed=1),
                  "--name", "second").exit_code == 0
    for args in (["train-linear", "--loss", "an-ls"], ["finetune", "--loss", "role", "--init",
                                                       "best"]):
        several = run(args, cwd=tmp_path)
        assert several.returncode == 1 and several.stderr == (
            f"Error: --dataset NAME is missing: give one of the datasets prepared in "
            f"{cache_dir}: first, second\n"), several.stderr


def test_make_features_on_an_unprepared_benchmark_prints_its_prepare_command(tmp_path, cache_dir):
    """Issue 36, item 15: `make features DATASET=voc` before `prepare` now names
    `featcache prepare voc --root DIR`; with DIR the VOC folder it works as printed."""
    import subprocess
    from pathlib import Path

    from dataset_fixtures import VOC_SPLITS, write_voc

    repo = Path(__file__).resolve().parents[1]
    made = subprocess.run(["make", "-s", "-o", ".venv/.installed", "features", "DATASET=voc"],
                          cwd=repo, capture_output=True, text=True)
    assert made.returncode != 0
    line = next(x for x in made.stderr.splitlines() if x.startswith("Error: "))
    assert line == (f"Error: no dataset 'voc': {cache_dir / 'voc' / 'labels.h5'} does not exist. "
                    "Prepare it with `featcache prepare voc --root DIR`, DIR being the VOC folder "
                    "(holding VOCdevkit or ImageSets/Main) (`featcache prepare voc --help`)")
    write_voc(tmp_path / "pascal", VOC_SPLITS)
    command = suggested(line)[0].replace("DIR", str(tmp_path / "pascal"))
    assert run_suggestion(command).exit_code == 0
    assert (cache_dir / "voc" / "labels.h5").is_file()
    for advice in suggested(line)[1:]:
        assert run_suggestion(advice).exit_code == 0  # `featcache prepare voc --help`
