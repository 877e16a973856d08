"""Stage three starts where it should: LinearInit's head and phi, or a fresh seeded head."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers_finetune import (
    NAME,
    SIZE,
    base_cache,
    config_trainer,
    copy_cache,
    finetune,
    linear_run,
)

from featcache.data.featurefile import load_features
from featcache.fileio import sha256_file
from featcache.losses.terms import inverse_sigmoid_tensor
from featcache.protocol.handoff import load_head

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

_trainer = config_trainer


def test_linearinit_starts_from_exactly_the_linear_head_and_phi(tmp_path_factory):
    cache = base_cache(tmp_path_factory.getbasetemp())
    trainer, data = _trainer(cache)
    head = load_head(linear_run(cache))
    assert torch.equal(trainer.net.head.weight.detach(), head["weight"])
    assert torch.equal(trainer.net.head.bias.detach(), head["bias"])
    # ROLE's hand-over re-logits the estimates with the reference's clipping (docs/losses.md)
    expected_phi = inverse_sigmoid_tensor(torch.sigmoid(head["handoff"]["phi"]))
    assert torch.equal(trainer.state["phi"].detach()[0], expected_phi)

    # The first forward pass (eval mode) equals the linear head on stage one's features.
    features = load_features(cache / NAME / "features-resnet50-random.h5")
    rows = data.labels.train_index
    linear = torch.sigmoid(torch.from_numpy(features.train[rows]) @ head["weight"].t() + head["bias"])
    probs = trainer.predict(data.train)
    assert probs.shape == linear.shape
    torch.testing.assert_close(probs, linear, rtol=1e-4, atol=1e-5)

    record, test_ap = trainer.run_epoch(0)
    assert np.isfinite(record.train_loss) and 0.0 <= record.test_map <= 100.0
    assert test_ap.shape == (data.num_classes,)
    assert not torch.equal(trainer.net.head.weight.detach(), head["weight"])  # it trained


def test_one_epoch_from_the_saved_run_records_its_source(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    result = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--bsize", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    run_dir = cache / NAME / "finetune" / "role" / "ft"
    document = json.loads((run_dir / "results.json").read_text())
    source = linear_run(cache)
    assert document["init"]["mode"] == "linear"
    assert document["init"]["run_dir"] == str(source)
    assert document["init"]["best_pt_sha256"] == sha256_file(source / "best.pt")
    assert document["init"]["handoff"] == ["phi"] and document["init"]["ran_linear_phase"] is False
    assert document["backbone"]["image_size"] == SIZE  # the linear run's, not the protocol's 448
    assert document["selection"]["params"]["k"] == load_head(source)["params"]["k"]
    assert [e["epoch"] for e in document["configs"][0]["epochs"]] == [1]
    best = torch.load(run_dir / "best.pt", weights_only=True)
    assert best["handoff"]["phi"].shape == (16, 3) and best["epoch"] == 1
    assert {k.split(".")[0] for k in best["model"]} == {"trunk", "head"}
    assert (run_dir / "summary.md").read_text().startswith(f"# {NAME} / role")


def test_init_none_starts_from_a_seeded_fresh_head(tmp_path_factory, tmp_path):
    cache = base_cache(tmp_path_factory.getbasetemp())
    one, _ = _trainer(cache, init="none", loss="an", weights="random", image_size=SIZE)
    two, _ = _trainer(cache, init="none", loss="an", weights="random", image_size=SIZE)
    linear = load_head(linear_run(cache))
    assert torch.equal(one.net.head.weight, two.net.head.weight)  # seeded
    assert not torch.equal(one.net.head.weight.detach(), linear["weight"])
    bound = 1.0 / np.sqrt(one.net.head.in_features)  # nn.Linear's default initialisation
    assert float(one.net.head.weight.detach().abs().max()) <= bound

    mine = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    result = finetune(mine, "--loss", "an", "--init", "none", "--weights", "random",
                      "--image-size", str(SIZE), "--epochs", "1", "--lr", "1e-3", "--bsize", "8",
                      "--run-id", "fresh")
    assert result.exit_code == 0, result.output
    document = json.loads((mine / NAME / "finetune" / "an" / "fresh" / "results.json").read_text())
    assert document["init"]["mode"] == "none"
    assert document["selection"]["batch_size"] == 8 and document["published"]["setting"] == "finetune"
    assert document["configs"][0]["epochs"][0]["images_per_second"] > 0


def test_init_best_trains_the_linear_phase_first_when_there_is_no_run(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    shutil.rmtree(cache / NAME / "runs")
    result = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--bsize", "4",
                      "--run-id", "ft")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "role" / "ft" / "results.json").read_text())
    assert document["init"]["ran_linear_phase"] is True
    linear = json.loads((tmp_path / document["init"]["run_dir"] / "results.json").read_text())
    # LinearInit's fixed linear hyperparameters for ROLE: lr 1e-3, batch 16, 25 epochs
    assert linear["grid"]["lr"] == [1e-3] and linear["grid"]["batch_size"] == [16]
    assert linear["protocol"]["epochs"] == 25


def test_a_probe_run_is_never_a_linearinit_start(tmp_path_factory, tmp_path):
    from dataset_fixtures import invoke

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    probe = invoke("train-linear", "--dataset", NAME, "--cache", cache, "--loss", "role",
                   "--search", "probe", "--lr", "1", "--weight-decay", "0", "--bsize", "4",
                   "--epochs", "1", "--run-id", "probe", "--quiet", "--no-plots", "--device",
                   "cpu", "--jobs", "1")
    assert probe.exit_code == 0, probe.output
    run_dir = cache / NAME / "runs" / "role" / "probe"
    refused = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--bsize", "4",
                       "--init", str(run_dir))
    assert refused.exit_code != 0 and "is a --search probe run" in refused.output
    # --init best passes over it (whatever its validation mAP) to the protocol's run
    document = json.loads((run_dir / "results.json").read_text())
    document["selection"]["val_map"] = 100.0
    (run_dir / "results.json").write_text(json.dumps(document))
    chosen = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--bsize", "4",
                      "--run-id", "ft")
    assert chosen.exit_code == 0, chosen.output
    started = json.loads((cache / NAME / "finetune" / "role" / "ft" / "results.json").read_text())
    assert started["init"]["run_dir"] == str(linear_run(cache))
