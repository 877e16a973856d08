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
