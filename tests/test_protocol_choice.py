"""What a run trains is decided by the losses themselves: ``--loss all`` on real single-positive
data, unknown names, out-of-range parameters, and one-line errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dataset_fixtures import invoke
from helpers_images import write_image

from featcache.losses import (
    FULL_LABELS,
    OBSERVED_NEGATIVES,
    SPATIAL_FEATURES,
    loss_class,
    loss_names,
)

CLASSES = ("cat", "dog", "car")


@pytest.fixture(scope="module")
def single_positive_cache(tmp_path_factory):
    """A real single-positive CSV (``image,label``), prepared and extracted (random weights)."""
    root = tmp_path_factory.mktemp("single")
    cache = root / "cache"
    train = ["image,label"] + [f"img/tr{i}.jpg,{CLASSES[i % 3]}" for i in range(24)]
    test = ["image,label"] + [f"img/te{i}.jpg,{CLASSES[i % 3]}" for i in range(9)]
    for i in range(24):
        write_image(root / "images" / f"img/tr{i}.jpg", seed=i)
    for i in range(9):
        write_image(root / "images" / f"img/te{i}.jpg", seed=100 + i)
    (root / "train.csv").write_text("\n".join(train) + "\n")
    (root / "test.csv").write_text("\n".join(test) + "\n")
    made = invoke("prepare", "csv", "--train", root / "train.csv", "--test", root / "test.csv",
                  "--images", root / "images", "--name", "mine", "--cache", cache)
    assert made.exit_code == 0, made.output
    made = invoke("features", "--dataset", "mine", "--weights", "random", "--image-size", "32",
                  "--device", "cpu", "--workers", "0", "--cache", cache)
    assert made.exit_code == 0, made.output
    return cache


def test_loss_all_on_real_single_positives_skips_what_it_cannot_train(single_positive_cache):
    result = invoke("train-linear", "--dataset", "mine", "--loss", "all", "--val", "observed",
                    "--epochs", "1", "--lr", "1e-2", "--batch-size", "4", "--run-id", "all",
                    "--quiet", "--no-plots", "--device", "cpu", "--cache", single_positive_cache)
    assert result.exit_code == 0, result.output
    unservable = [n for n in loss_names()
                  if FULL_LABELS in loss_class(n).needs or OBSERVED_NEGATIVES in loss_class(n).needs]
    assert unservable == ["bce", "bce-ls", "iun", "iu"]
    unservable += ["epr", "role"]  # no k: the CSV has no full labels and none was given
    unservable += ["lc-max", "lc-dist", "lc-exact"]  # no cardinalities either
    unservable += [n for n in loss_names() if "pseudo_labels" in {need.key for need in
                                                                    loss_class(n).needs}]
    boostlu = [n for n in loss_names() if SPATIAL_FEATURES in loss_class(n).needs]
    assert boostlu == ["an+boostlu", "ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu", "ignore"]
    unservable += boostlu  # no spatial features file
    lines = result.output.splitlines()
    for name in unservable:
        skipped = [line for line in lines if line.startswith(f"skipping {name}:")]
        assert len(skipped) == 1, name
        reason = {"iu": "--num-neg 1", "epr": "needs k", "role": "needs k",
                  "lc-max": "pass --param k_max=VALUE", "lc-dist": "holds single positives only",
                  "lc-exact": "holds single positives only"}.get(
            name, "needs pseudo-labels" if name in ("vlpl", "gpr") else
            "--spatial` first" if name in boostlu else "single positives only")
        assert reason in skipped[0], skipped[0]
    runs = single_positive_cache / "mine" / "runs"
    trained = sorted(p.parent.parent.name for p in runs.glob("*/all/results.json"))
    assert trained == sorted(set(loss_names()) - set(unservable))
    table = (runs / "table-all.md").read_text()
    assert all(f"| {name} " in table for name in trained)


def test_k_given_by_the_user_lets_epr_train_on_single_positives(single_positive_cache):
    result = invoke("train-linear", "--dataset", "mine", "--loss", "all", "--val", "observed",
                    "--param", "k=1.5", "--epochs", "1", "--lr", "1e-2", "--batch-size", "4",
                    "--run-id", "k", "--quiet", "--no-plots", "--device", "cpu",
                    "--cache", single_positive_cache)
    assert result.exit_code == 0, result.output
    assert "skipping epr" not in result.output and "skipping role" not in result.output
    runs = single_positive_cache / "mine" / "runs"
    assert (runs / "epr" / "k" / "results.json").is_file()


def test_a_named_loss_the_data_cannot_serve_is_refused_with_the_reason(single_positive_cache):
    result = invoke("train-linear", "--dataset", "mine", "--loss", "an,iun", "--val", "observed",
                    "--run-id", "refused",
                    "--device", "cpu", "--cache", single_positive_cache)
    assert result.exit_code == 1
    assert "loss 'iun' trains on full labels" in result.output
    assert not (single_positive_cache / "mine" / "runs" / "an" / "refused").exists()  # none first


def test_unknown_names_get_the_closest_ones(single_positive_cache):
    cache = ("--cache", single_positive_cache, "--device", "cpu", "--val", "observed")
    loss = invoke("train-linear", "--dataset", "mine", "--loss", "an_ls", *cache)
    assert loss.exit_code == 1 and "unknown loss 'an_ls'; did you mean 'an-ls'" in loss.output
    dataset = invoke("train-linear", "--dataset", "mien", "--loss", "an", *cache)
    assert dataset.exit_code == 1 and "no dataset 'mien'" in dataset.output
    assert "did you mean 'mine'?" in dataset.output
    param = invoke("train-linear", "--dataset", "mine", "--loss", "an-ls", "--param", "eps_nge=0", *cache)
    assert param.exit_code == 1 and "did you mean 'eps_neg'?" in param.output
    out_of_range = invoke("train-linear", "--dataset", "mine", "--loss", "an-ls", "--param",
                          "eps_pos=1.5", *cache)
    assert out_of_range.exit_code == 1 and "eps_pos takes [0, 1]" in out_of_range.output
    command = invoke("trian-linear")
    assert command.exit_code == 2 and "did you mean 'train-linear'?" in command.output


def test_the_command_prints_one_line_and_no_traceback(single_positive_cache):
    for args in (["train-linear", "--dataset", "mine", "--loss", "roel"],
                 ["finetune", "--dataset", "mine", "--loss", "role", "--batch-size", "0"],
                 ["train-linear", "--dataset", "mine", "--loss", "epr", "--param", "k=-1",
                  "--val", "observed"]):
        done = subprocess.run([sys.executable, "-m", "featcache", *args, "--device", "cpu",
                               "--cache", str(single_positive_cache)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "Traceback" not in done.stderr, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1, done.stderr


def test_an_unexpected_error_is_one_line_unless_the_traceback_is_asked_for(monkeypatch, capsys):
    from featcache import cli

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli.cli, "main", broken)
    # this is pytest's process, not the command's: it is neither claimed nor frozen
    monkeypatch.setattr(cli, "claim", lambda: None)
    monkeypatch.setattr(cli, "freeze", lambda: None)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: unexpected RuntimeError: boom") and "Traceback" not in err
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli.main()
