"""Stage three with a BoostLU loss: the model's head is BoostLU's code on the trunk's feature
map, and ``--init best`` starts from a stage-two BoostLU run's W, b (the 1x1 convolution)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from helpers_finetune import (
    NAME,
    SIZE,
    SPATIAL,
    config_trainer,
    copy_cache,
    finetune,
    write_spatial,
)

from featcache.data.featurefile import load_features
from featcache.errors import InputError
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.start import linear_features
from featcache.heads import BoostLUHeads, HeadKind
from featcache.protocol.handoff import load_head

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)


@pytest.fixture
def cache(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    write_spatial(cache)
    return cache


def _trainer(cache, loss, init="best", **start_kw):
    return config_trainer(cache, init=init, loss=loss, **start_kw)


def test_init_best_loads_the_stage_two_boostlu_head_as_the_1x1_convolution(cache):
    linear = invoke("train-linear", "--dataset", NAME, "--loss", "ll-r+boostlu", "--param",
                    "alpha=3", "--lr", "1e-2", "--bsize", "4", "--epochs", "2", "--quiet",
                    "--no-plots", "--cache", cache, "--run-id", "lb")
    assert linear.exit_code == 0, linear.output
    run = cache / NAME / "runs" / "ll-r+boostlu" / "lb"
    head = load_head(run)
    assert head["features_path"].endswith(SPATIAL) and head["head"]["kind"] == "boostlu"

    trainer, data = _trainer(cache, "ll-r+boostlu")
    net_head = trainer.net.head
    assert net_head.kind is HeadKind.BOOSTLU and trainer.net.spatial
    assert net_head.loss_params == {"alpha": 3.0}  # the linear run's alpha, carried with its parameters
    assert torch.equal(net_head.weight.detach(), head["weight"])
    assert torch.equal(net_head.bias.detach(), head["bias"])
    # the trunk's feature map at 32 x 32 is 1 x 1: the spatial rows written above are it
    images = torch.zeros(1, 3, SIZE, SIZE)
    assert tuple(trainer.net.trunk.feature_map(images).shape) == (1, 2048, 1, 1)

    # The first forward pass (eval mode) is stage two's BoostLU head on the spatial rows.
    spatial = load_features(cache / NAME / SPATIAL)
    rows = torch.from_numpy(spatial.train[data.labels.train_index])
    stacked = BoostLUHeads(head["weight"].t().unsqueeze(0), head["bias"].view(1, 1, -1),
                           positions=1, params={"alpha": [3.0]})
    probs = trainer.predict(data.train)
    torch.testing.assert_close(probs, stacked.scores(rows)[0], rtol=1e-4, atol=1e-5)

    record, _ = trainer.run_epoch(0)
    assert np.isfinite(record.train_loss)
    assert not torch.equal(net_head.weight.detach(), head["weight"])  # it trained

    result = finetune(cache, "--loss", "ll-r+boostlu", "--epochs", "1", "--lr", "1e-3",
                      "--bsize", "4", "--run-id", "ft")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "ll-r+boostlu" / "ft" / "results.json")
                          .read_text())
    assert document["init"]["run_dir"] == str(run)
    assert document["selection"]["params"] == {"delta_rel": 0.5, "alpha": 3.0}


def test_a_fresh_boostlu_head_on_a_random_backbone(cache):
    trainer, _ = _trainer(cache, "an+boostlu", init="none", weights="random", image_size=SIZE)
    assert trainer.net.head.kind is HeadKind.BOOSTLU and trainer.net.head.loss_params == {"alpha": 5.0}
    record, _ = trainer.run_epoch(0)
    assert np.isfinite(record.train_loss)


def test_the_linear_phase_of_a_boostlu_loss_trains_on_the_spatial_file(cache, tmp_path):
    options = FinetuneOptions(init="best", loss="ll-r+boostlu", dataset=NAME, cache=str(cache))
    assert linear_features(options).name == SPATIAL
    result = finetune(cache, "--loss", "ll-r+boostlu", "--epochs", "1", "--lr", "1e-3",
                      "--bsize", "4", "--linear-lr", "1e-2", "--linear-batch-size", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "ll-r+boostlu" / "ft" / "results.json")
                          .read_text())
    assert document["init"]["ran_linear_phase"] is True
    assert document["init"]["features_path"].endswith(SPATIAL)
    (cache / NAME / SPATIAL).unlink()
    with pytest.raises(InputError, match=r"no spatial features file .* --spatial`"):
        linear_features(options)
