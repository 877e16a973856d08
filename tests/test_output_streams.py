"""Every command keeps one rule: results on stdout (closing lines naming what was written and
where, tables, predictions), everything else on stderr (progress, notes, warnings, status such
as the run folder in use or a run reused, errors). So ``featcache ... > out.txt`` keeps the
results and a terminal still shows the rest."""

from __future__ import annotations

from dataset_fixtures import invoke
from helpers_images import make_dataset
from linear_fixtures import synthetic_dataset

FAST = ("--lr", "1e-2", "--bsize", "16", "--epochs", "2", "--quiet", "--no-plots", "--device",
        "cpu")


def test_train_linear_results_on_stdout_status_on_stderr(cache_dir, tmp_path):
    synthetic_dataset(cache_dir, name="toy")
    first = invoke("train-linear", "--dataset", "toy", "--loss", "an,bce", "--run-id", "r", *FAST)
    assert first.exit_code == 0
    # one closing line per loss, in the order the losses finish (they train in parallel)
    finished = sorted(first.stdout.splitlines()[:2])
    assert finished[0].startswith("an: val ") and finished[1].startswith("bce: val ")
    assert f"-> {cache_dir / 'toy' / 'runs' / 'an' / 'r'}" in first.stdout
    assert "| loss |" in first.stdout and "table written to" in first.stdout
    assert f"run id r: {cache_dir / 'toy' / 'runs'}/<loss>/r" in first.stderr
    assert "run id" not in first.stdout
    again = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r", *FAST)
    assert "an: run r already finished with these settings; reusing it" in again.stderr
    assert again.stdout.startswith("an: val ") and "reusing" not in again.stdout

    table = invoke("table", cache_dir / "toy" / "runs" / "an" / "r", "--out", tmp_path / "t.md")
    assert table.exit_code == 0 and table.stdout.startswith("table of 1 loss x 1 dataset ->")
    predicted = invoke("predict", "--run", cache_dir / "toy" / "runs" / "an" / "r", "--features",
                       cache_dir / "toy" / "features-toy.h5", "--out", tmp_path / "p.csv")
    assert predicted.exit_code == 0, predicted.output
    assert predicted.stdout.strip().endswith(f"classes -> {tmp_path / 'p.csv'}")


def test_stage_zero_and_one_results_on_stdout_hints_on_stderr(tmp_path, cache_dir):
    prepared = invoke("prepare", "shapes", "--num-train", "20", "--num-test", "10")
    assert prepared.exit_code == 0
    assert prepared.stdout.startswith(f"wrote {cache_dir / 'shapes' / 'labels.h5'}")
    assert "next: featcache features --dataset shapes" in prepared.stderr
    assert "images verified: 30 decoded" in prepared.stderr and "next:" not in prepared.stdout

    make_dataset(tmp_path, num_train=6, num_test=2)
    args = ("features", "--dataset", "toy", "--cache", tmp_path / "cache", "--backbone",
            "resnet18", "--weights", "random", "--image-size", "32", "--device", "cpu",
            "--workers", "0")
    written = invoke(*args)
    assert written.stdout.startswith("features: 8 images in ")
    assert written.stderr.startswith("output: about ")
    again = invoke(*args)
    assert again.stdout.strip().endswith("is up to date (built from the same labels file and "
                                         "settings); nothing to do (pass --overwrite to re-extract)")
    assert "up to date" not in again.stderr
