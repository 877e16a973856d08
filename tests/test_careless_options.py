"""A careless user's options: repeated values, a path as a backbone, an unknown device: one
clear line each, before any work."""

from __future__ import annotations

import pytest
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.errors import OptionError
from featcache.protocol.loss_choice import choose_losses


@pytest.mark.parametrize("option, value, message", [
    ("--lr", "1e-2,0.01", "--lr gives 0.01 twice"),
    ("--bsize", "8,16,8", "--batch-size gives 8 twice"),
    ("--seeds", "0,0", "--seeds gives 0 twice"),
    ("--param", "eps_neg=0.1,0.1", "--param eps_neg gives 0.1 twice"),
])
def test_a_repeated_grid_value_is_refused(cache_dir, option, value, message):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an-ls", option, value)
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (cache_dir / "toy" / "runs").exists()


def test_a_repeated_loss_is_refused():
    from featcache.losses import DataFacts

    with pytest.raises(OptionError, match="--loss names an twice"):
        choose_losses("an,an-ls,an", DataFacts(dataset="toy", num_classes=3))


def test_a_backbone_that_is_a_path_and_an_unknown_device_are_one_line(cache_dir):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--backbone", "../x")
    assert result.exit_code != 0 and "--backbone '../x' is a path, not a name" in result.output
    device = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--device", "tpu")
    assert device.exit_code != 0
    assert "--device 'tpu': use auto, cpu, cuda or cuda:N" in device.output
    assert "privateuseone" not in device.output


def test_a_list_option_given_twice_uses_both_values(cache_dir, tmp_path):
    """Issue 36, item 7: `--lr 1e-3 --lr 1e-2` trained 1e-2 only, without a word."""
    import json

    from faults import run

    synthetic_dataset(cache_dir)
    result = run(["train-linear", "--dataset", "toy", "--loss", "an", "--lr", "1e-3",
                  "--lr=1e-2", "--bsize", "8", "--batch-size", "16", "--epochs", "1", "--quiet",
                  "--no-plots", "--device", "cpu", "--run-id", "r"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    grid = json.loads((cache_dir / "toy" / "runs" / "an" / "r" / "results.json").read_text())["grid"]
    assert grid["lr"] == [1e-3, 1e-2] and grid["batch_size"] == [8, 16]


def test_an_option_of_one_value_given_twice_is_refused_naming_it(cache_dir, tmp_path):
    from faults import run

    synthetic_dataset(cache_dir)
    result = run(["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "1",
                  "--epochs", "2"], cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("Error: --epochs is given twice (--epochs 1, then --epochs 2) but "
                             "takes one value: give it once\n")
    assert not (cache_dir / "toy" / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (("info", "toy", "--classes", "--no-classes"), "--classes and --no-classes are both given"),
    (("pipeline", "run", "x.toml", "--cache", "a", "--cache", "b"),
     "--cache is given twice (--cache a, then --cache b) but takes one value"),
    (("prepare", "csv", "--train", "a.csv", "--train", "b.csv"), "--train is given twice"),
    (("estimate-k", "--dataset", "toy", "--seed", "1", "--seed=2"), "--seed is given twice"),
])
def test_every_command_refuses_a_repeated_option_of_one_value(cache_dir, args, message):
    result = invoke(*args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_same_value_twice_is_kept_and_a_repeated_param_refused():
    from featcache.commands.common import parse_params

    assert parse_params(("k=1,2,3",)) == {"k": [1.0, 2.0, 3.0]}
    with pytest.raises(OptionError, match="--param k gives 1 twice"):
        parse_params(("k=1,1",))
    # one key in two --param options: an override or a typo, never meant as a grid (issue 45)
    with pytest.raises(OptionError, match=r"--param k is given twice \(k=1, then k=2,3\): give "
                                          r"it once, or both values in one for a grid axis: "
                                          r"--param k=1,2,3$"):
        parse_params(("k=1", "k=2,3"))
    with pytest.raises(OptionError, match=r"--param k is given twice \(k=1, then k=1\): give "
                                          r"it once$"):
        parse_params(("k=1", "k=1"))
    import click

    from featcache.cli import cli
    from featcache.commands.repeated import join_repeated_options

    ctx = click.Context(cli)
    command = cli.get_command(ctx, "train-linear")
    assert join_repeated_options(command, "train-linear", ["--epochs", "2", "--quiet", "--epochs",
                                                           "2", "--quiet"], ctx) == [
        "--epochs", "2", "--quiet", "--epochs", "2", "--quiet"]
    assert join_repeated_options(command, "train-linear", ["--loss", "an", "--loss", "bce",
                                                           "--", "--loss"], ctx) == [
        "--loss", "an,bce", "--", "--loss"]
