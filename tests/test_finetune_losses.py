"""Every registered loss trains end to end: one step, then its end-of-epoch state update."""

from __future__ import annotations

import math

import pytest
import torch
from helpers_finetune import NAME, SIZE, base_cache, fresh_setup
from linear_fixtures import pseudo_label_sets

from featcache.finetune.loop import ConfigTrainer
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.run import loss_params
from featcache.losses import MaskedPassLoss, loss_class, loss_names
from featcache.protocol.grid import GridPoint
from featcache.runtime import Ranks

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

CPU = Ranks(0, 1, 0, 1, torch.device("cpu"))
#: parameters that make the state-changing losses act within two epochs
ACTIVE = {"em-apl": {"warmup": 1.0}, "ll-cp": {"delta_rel": 50.0}, "opml-sp": {"correct_ratio": 0.2}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pseudo_label_sets(base_cache(tmp_path_factory.getbasetemp()) / NAME / "labels.h5")  # vlpl, gpr
    return fresh_setup(tmp_path_factory.getbasetemp())


@pytest.mark.parametrize("loss", loss_names())
def test_every_loss_runs_a_training_step(setup, loss):
    data, start = setup
    data = loss_class(loss).fit_data(data)  # iu: observed negatives drawn on the fly
    settings = FinetunePlan(loss=loss, params=loss_params(loss, ACTIVE.get(loss, {}), data), epochs=2,
                        progress=False, eval_batch_size=16)
    trainer = ConfigTrainer(GridPoint(1e-3, 8), settings, start, data, CPU)
    before_head = trainer.net.head.weight.detach().clone()
    before_conv = trainer.net.trunk.conv1.weight.detach().clone()
    before_state = {k: v.detach().clone() for k, v in trainer.state.items()}
    trainer.sampler.set_epoch(1)
    trainer.loss.begin_epoch(1, 2, trainer.state)  # as run_epoch does before the first step
    batch = next(iter(trainer.train_loader))
    images, positions, ok = batch[0], batch[-2], batch[-1]
    strong = batch[1] if len(batch) == 4 else None  # IGNORE's strong views
    assert (strong is not None) == isinstance(trainer.loss, MaskedPassLoss)
    assert bool(ok.all()) and images.shape == (8, 3, SIZE, SIZE)
    value, probs = trainer.step(images, positions, epoch=1, strong=strong)
    assert math.isfinite(float(value)) and probs.shape == (8, data.num_classes)
    assert not torch.equal(trainer.net.head.weight.detach(), before_head)
    assert not torch.equal(trainer.net.trunk.conv1.weight.detach(), before_conv)
    if "phi" in trainer.state:  # trained beside the network
        assert not torch.equal(trainer.state["phi"].detach(), before_state["phi"])
    extra = trainer.loss.end_epoch(1, 2, lambda: trainer.predict(data.train).unsqueeze(0),
                                   trainer.state) or {}
    changed = {k for k, v in trainer.state.items()
               if not torch.equal(torch.nan_to_num(v.detach(), nan=-1.0),
                                  torch.nan_to_num(before_state[k], nan=-1.0))}
    if loss == "ll-cp":
        assert "observed" in changed  # corrected labels flipped in the step
    if loss == "em-apl":
        assert "pseudo" in changed and extra["pseudo_labels_added"][0] > 0
    if loss == "opml-sp":
        assert "train_ap" in changed
    if loss == "ignore":
        assert changed == {"gap_threshold", "avg_threshold"}  # moved by the step
