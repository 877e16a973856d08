"""IGNORE in stage three (Song et al. 2024, as defined): the trunk's feature map through a
linear head that also gives the class activation maps, a strongly augmented view, and a second
forward pass on the images masked to the single positive's map; tiny generated images and a
random ResNet-50."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
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

from featcache.errors import OptionError
from featcache.finetune.data import EpochBatches, SplitImages, strong_view
from featcache.finetune.loop import ConfigResult
from featcache.finetune.masked_pass import masked_pass_views
from featcache.heads import HeadKind
from featcache.losses import Targets
from featcache.protocol.handoff import load_head

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

BIG = 64  # a 2 x 2 feature map: the mask has positions to choose between


@pytest.fixture
def cache(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    write_spatial(cache)
    return cache


def _authors_mask(image, cam, labels, threshold):
    """The authors' functions.py generate_resnet_cam_and_mask (cam_minmax_norm over the batch,
    bilinear to the image size, > threshold), written out independently."""
    cam_sp = cam[labels.bool()]
    cam_sp = (cam_sp - cam_sp.min(dim=0)[0]) / cam_sp.max(dim=0)[0]
    cam_sp = F.interpolate(cam_sp.unsqueeze(1), size=image.shape[2:], mode="bilinear",
                           align_corners=False)
    mask = torch.ones(image.shape[0], 1, *image.shape[2:])
    mask[labels.sum(dim=1) == 1] = torch.where(cam_sp > threshold, 1.0, 0.0)
    return image * mask


def test_the_three_passes_are_the_authors_on_a_random_resnet(cache):
    trainer, data = config_trainer(cache, init="none", loss="ignore", weights="random",
                                   image_size=BIG)
    net = trainer.net
    assert net.head.kind is HeadKind.CAM and net.spatial and trainer.sampler.strong
    batch = next(iter(trainer.train_loader))
    assert len(batch) == 4  # plain images, strong views, positions, ok
    images, strong, positions, _ = batch
    assert images.shape == strong.shape == (4, 3, BIG, BIG) and images.dtype == torch.uint8
    assert not torch.equal(images, strong)
    targets = Targets(trainer.observed[positions], positions)
    x = trainer.to_input(images)
    logits = masked_pass_views(trainer.model, trainer.masked_pass, trainer.autocast, x,
                               trainer.to_input(strong), targets)
    with torch.no_grad():  # training mode: batch statistics, the same numbers again
        fmap = net.trunk.feature_map(x)
        assert fmap.shape[-2:] == (2, 2)
        cam, pooled = net.head.cam_and_logits(fmap)
        torch.testing.assert_close(pooled, cam.mean(dim=(2, 3)))
        torch.testing.assert_close(logits, cam.mean(dim=(2, 3)))
        torch.testing.assert_close(logits, net(x), rtol=1e-5, atol=1e-6)
        masked_images = _authors_mask(x, cam, (targets.observed == 1).float(), 0.8)
        torch.testing.assert_close(targets.masked[0], net(masked_images), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(targets.strong[0], net(trainer.to_input(strong)),
                                   rtol=1e-5, atol=1e-6)
    assert targets.strong.requires_grad and not targets.masked.requires_grad
    assert 0 < float((masked_images == 0).float().mean()) < 1  # something masked, not all


def test_an_epoch_trains_and_moves_the_thresholds(cache):
    trainer, _ = config_trainer(cache, init="none", loss="ignore", weights="random",
                                image_size=SIZE)
    before = trainer.net.head.weight.detach().clone()
    record, _ = trainer.run_epoch(0)
    assert np.isfinite(record.train_loss)
    assert not torch.equal(trainer.net.head.weight.detach(), before)
    assert trainer.state["gap_threshold"].item() > 0
    assert trainer.state["avg_threshold"].abs().sum().item() > 0
    # the thresholds are saved with the checkpoint and restored with it
    saved = trainer.checkpoint(ConfigResult(trainer.config), {})
    assert torch.equal(saved["state"]["gap_threshold"], trainer.state["gap_threshold"].cpu())


def test_strong_views_are_seeded_per_epoch_and_image():
    image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(strong_view(image, 7), strong_view(image, 7))
    assert any(not torch.equal(strong_view(image, 7), strong_view(image, s)) for s in (8, 9, 10))
    sampler = EpochBatches(12, 4, seed=1, strong=True)
    first = [item for batch in sampler for item in batch]
    assert all(len(item) == 3 for item in first)
    assert first == [item for batch in sampler for item in batch]  # the same epoch again
    sampler.set_epoch(1)
    assert {i[0]: i[2] for i in first} != {i[0]: i[2] for i in sampler for i in i}
    plain = EpochBatches(12, 4, seed=1)
    assert all(len(item) == 2 for batch in plain for item in batch)


def test_split_images_add_the_strong_view_of_the_unflipped_image(cache):
    from featcache.finetune.data import load_finetune_data

    data = load_finetune_data(cache / NAME / "labels.h5")
    images = SplitImages(data, data.train, SIZE)
    plain, position, ok = images[(0, True)]
    flipped, strong, position_, ok_ = images[(0, True, 5)]
    assert torch.equal(plain, flipped) and position == position_ == 0 and ok and ok_
    assert torch.equal(strong, strong_view(plain.flip(-1), 5))


def test_init_best_trains_the_linear_phase_on_the_spatial_file_and_loads_its_head(cache):
    linear = invoke("train-linear", "--dataset", NAME, "--loss", "ignore", "--lr", "1e-2",
                    "--bsize", "4", "--epochs", "2", "--quiet", "--no-plots", "--cache", cache,
                    "--run-id", "li")
    assert linear.exit_code == 0, linear.output
    run = cache / NAME / "runs" / "ignore" / "li"
    head = load_head(run)
    assert head["features_path"].endswith(SPATIAL) and head["head"]["kind"] == "linear"
    trainer, _ = config_trainer(cache, init="best", loss="ignore")
    assert trainer.net.head.kind is HeadKind.CAM
    assert torch.equal(trainer.net.head.weight.detach(), head["weight"])
    result = finetune(cache, "--loss", "ignore", "--epochs", "1", "--lr", "1e-3", "--bsize", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "ignore" / "ft" / "results.json")
                          .read_text())
    assert document["init"]["run_dir"] == str(run)
    assert document["selection"]["params"]["cam_threshold"] == 0.8


def test_several_processes_are_refused(cache):
    from featcache.finetune.data import load_finetune_data
    from featcache.finetune.loop import ConfigTrainer
    from featcache.finetune.options import FinetuneOptions
    from featcache.finetune.plan import FinetunePlan
    from featcache.finetune.run import loss_params
    from featcache.finetune.start import resolve_start
    from featcache.protocol.grid import GridPoint
    from featcache.runtime import Ranks

    data = load_finetune_data(cache / NAME / "labels.h5")
    one = Ranks(0, 1, 0, 1, torch.device("cpu"))
    start = resolve_start(FinetuneOptions(init="none", loss="ignore", dataset=NAME,
                                          cache=str(cache), weights="random", image_size=SIZE,
                                          progress=False), data, one)
    settings = FinetunePlan(loss="ignore", params=loss_params("ignore", start.params, data),
                        progress=False)
    with pytest.raises(OptionError, match="without torchrun"):
        ConfigTrainer(GridPoint(1e-3, 4), settings, start, data, Ranks(0, 2, 0, 2,
                                                                        torch.device("cpu")))
