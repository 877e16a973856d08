"""IGNORE trained by the stages: stage two on a generated spatial features file (the masked
pass zeroes positions of the cached maps), and the refusals and skips around it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import spatial_features_file, synthetic_dataset

from featcache import load_run
from featcache.errors import InputError
from featcache.heads import CamHeads, LinearHeads
from featcache.linear.data import load_linear_data
from featcache.linear.engine.member import Member, create_heads
from featcache.linear.engine.trainer import GroupTrainer
from featcache.losses import create_loss
from featcache.losses.ignore import Ignore
from featcache.metrics import average_precision
from featcache.protocol.grid import GridPoint
from featcache.protocol.handoff import load_head
from featcache.protocol.runs import load_results

FAST = ("--epochs", "4", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots")


@pytest.fixture
def spatial(cache_dir):
    labels_path, _ = synthetic_dataset(cache_dir)
    return cache_dir, spatial_features_file(labels_path)


def test_the_spatial_linear_head_is_the_linear_head_on_pooled_maps_and_masks_positions():
    generator = torch.Generator().manual_seed(0)
    head = CamHeads.create(3, 4, [torch.Generator().manual_seed(s) for s in (1, 2)], positions=5)
    maps = torch.randn(6, 5, 3, generator=generator, dtype=torch.float32)
    rows = maps.reshape(6, 15)
    pooled = LinearHeads(head.weight.detach(), head.bias.detach())
    torch.testing.assert_close(head.forward(rows), pooled.forward(maps.mean(dim=1)))
    keep = (torch.rand(2, 6, 5, generator=generator) > 0.5).float()
    for h in range(2):  # each head's masked map, averaged over all 5 positions, through it
        masked = (maps * keep[h].unsqueeze(-1)).sum(dim=1) / 5
        torch.testing.assert_close(head.masked_logits(rows, keep)[h],
                                   masked @ head.weight[h].detach() + head.bias[h].detach())
    # its gradients are the linear head's on the pooled features (alpha = 1: no boosting)
    grad = torch.randn(2, 6, 4, generator=generator)
    for a, b in zip(head.grads(rows, grad), pooled.grads(maps.mean(dim=1), grad), strict=True):
        torch.testing.assert_close(a, b)


def test_a_training_step_hands_the_loss_the_masked_pass_of_each_head(spatial, monkeypatch):
    cache, path = spatial
    data = load_linear_data(cache / "toy" / "labels.h5", path)
    grid = [GridPoint(1e-2, 16, params=(("cam_threshold", t),)) for t in (0.8, 0.3)]
    trainer = GroupTrainer(data, [Member("ignore", tuple(grid))], 1, "clean", "none",
                           torch.device("cpu"))
    member = trainer.members[0]
    assert isinstance(trainer.head, CamHeads)
    seen = []
    original = Ignore.forward

    def spy(self, logits, targets, state, epoch):
        seen.append((logits.detach().clone(), targets.masked, targets.strong,
                     targets.observed, {k: v.clone() for k, v in state.items()}))
        return original(self, logits, targets, state, epoch)

    monkeypatch.setattr(Ignore, "forward", spy)
    weight, bias = trainer.head.weight.detach().clone(), trainer.head.bias.detach().clone()
    index = torch.arange(16)
    x = data.train.features[index]
    trainer.train_step(x, trainer.labels.gather(index), 0)
    logits, masked, strong, observed, before = seen[0]
    assert strong is None and masked.shape == (2, 16, 5)
    # recomputed here: CAM of each row's positive, (cam - min) / max over the batch per
    # position, positions above each head's threshold kept, the kept map averaged and applied
    maps = x.reshape(16, 4, 6)
    cam = torch.einsum("bpd,hdl->hbpl", maps, weight) + bias.unsqueeze(2)
    positive = observed.argmax(dim=1)
    assert (observed == 1).sum(dim=1).eq(1).all()
    for h, threshold in enumerate((0.8, 0.3)):
        pos_cam = cam[h, torch.arange(16), :, positive]  # (B, P)
        norm = (pos_cam - pos_cam.min(dim=0).values) / pos_cam.max(dim=0).values
        keep = (norm > threshold).float()
        expected = (maps * keep.unsqueeze(-1)).mean(dim=1) @ weight[h] + bias[h]
        torch.testing.assert_close(masked[h], expected)
        torch.testing.assert_close(logits[h], maps.mean(dim=1) @ weight[h] + bias[h])
    assert not torch.equal(masked[0], masked[1])  # the two thresholds mask differently
    assert before["gap_threshold"].eq(0).all()
    assert member.state["gap_threshold"].gt(0).all()  # the step moved the threshold
    # after the warm-up (3 epochs by default) the same batch has assumed negatives rejected
    state = {k: v.clone() for k, v in member.state.items()}
    assert not member.loss.rejected(logits, masked, observed, dict(state), 2).any()
    assert member.loss.rejected(logits, masked, observed, state, 3).any()


def test_train_linear_ignore_on_a_spatial_file_records_a_linear_head(spatial):
    cache, path = spatial
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an,ignore",
                    "--param", "warm_up=1", "--run-id", "r1", *FAST)
    assert result.exit_code == 0, result.output
    run = cache / "toy" / "runs" / "ignore" / "r1"
    document = load_results(run)
    assert document["selection"]["params"] == {
        "spbc_weight": 0.5, "ignore_weight": 1.0, "reg_weight": 0.5, "gap_lambda": 0.999,
        "avg_lambda": 0.999, "cam_threshold": 0.8, "warm_up": 1.0, "lat": 1.0}
    assert document["grid"]["params_source"]["warm_up"] == "given"
    assert document["features"]["path"] == str(path)
    assert document["features"]["layout"] == "spatial"
    assert document["head"] == {"kind": "linear"}
    assert document["loss_reference"].startswith("Song et al. ECCV 2024")
    head = load_head(run)
    assert head["weight"].shape == (5, 6) and head["bias"].shape == (5,)
    # an IGNORE head is a linear head: on the pooled maps it gives the selected test mAP
    data = load_linear_data(cache / "toy" / "labels.h5", path)
    pooled = data.test.features.reshape(len(data.test), 4, 6).mean(dim=1)
    probs = torch.sigmoid(pooled @ head["weight"].t() + head["bias"])
    ap = average_precision(probs.unsqueeze(0), data.test.clean)
    assert float(ap.mean() * 100) == pytest.approx(document["selection"]["test_map"], abs=1e-3)
    # the API applies the run to pooled rows (width D), and refuses the spatial rows
    run_api = load_run(run)
    assert run_api.boostlu_alpha is None and run_api.feature_dim == 6
    np.testing.assert_allclose(run_api.predict_proba(pooled.numpy()), probs.numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(InputError, match="do not fit"):
        run_api.predict_proba(data.test.features.numpy())


def test_the_estimator_trains_ignore_on_spatial_rows_and_predicts_the_pooled_linear_head(spatial):
    from featcache.api import SPMLClassifier
    from featcache.errors import LossNeedError

    cache, path = spatial
    data = load_linear_data(cache / "toy" / "labels.h5", path)
    X = data.train.features.numpy()
    Z = data.train.observed.numpy().astype(np.int8)
    clf = SPMLClassifier(loss="ignore", epochs=2, lr=1e-2, spatial_shape=(2, 2, 6)).fit(X, Z)
    assert clf.coef_.shape == (5, 6) and clf.loss_params_["cam_threshold"] == 0.8
    pooled = X.reshape(len(X), 4, 6).mean(axis=1)
    expected = 1 / (1 + np.exp(-(pooled @ clf.coef_.T + clf.intercept_)))
    np.testing.assert_allclose(clf.predict_proba(X), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(LossNeedError, match="trains on spatial feature maps.*spatial_shape"):
        SPMLClassifier(loss="ignore", epochs=1).fit(X, Z)


def test_no_spatial_file_refuses_ignore_and_loss_all_skips_it_with_the_command(cache_dir):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "ignore", *FAST)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "featcache features --dataset toy --backbone toy --spatial" in result.output
    every = invoke("train-linear", "--dataset", "toy", "--loss", "all", "--epochs", "1", "--lr",
                   "1e-2", "--bsize", "16", "--quiet", "--no-plots", "--run-id", "a")
    assert every.exit_code == 0, every.output
    skipped = [line for line in every.output.splitlines() if line.startswith("skipping ignore:")]
    assert len(skipped) == 1 and "--spatial` first" in skipped[0]


def test_pooled_rows_are_refused_by_the_heads():
    loss = create_loss("ignore", 5)
    with pytest.raises(InputError, match="trains on spatial feature maps.*--spatial"):
        create_heads(loss, 6, None, 5, [torch.Generator()])
