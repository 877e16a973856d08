"""``--search probe``: AdamW per head, the scaled lr x weight-decay grid, L2-normalised
features, the refit on train + validation, its records, and the protocol search untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import assert_stacked_adam_matches, synthetic_dataset

from featcache.api import load_run
from featcache.errors import InputError, OptionError
from featcache.heads import LinearHeads
from featcache.linear.data import load_linear_data
from featcache.linear.engine.optimizer import StackedAdam
from featcache.linear.engine.search import SearchSpec, run_search
from featcache.linear.engine.trainer import train_group
from featcache.linear.search_modes.probe import normalised, probe_spec, train_and_val
from featcache.protocol.grid import GridPoint, grid_points
from featcache.protocol.search_modes.probe import PROBE_LEARNING_RATES, PROBE_WEIGHT_DECAYS
from featcache.protocol.selection import LAST_EPOCH

COMMON = ("--epochs", "3", "--bsize", "8,16", "--quiet", "--no-plots", "--device", "cpu",
          "--jobs", "1")


@pytest.mark.parametrize("fused", [True, False])
def test_stacked_adam_with_weight_decay_is_torch_adamw_for_each_head(fused):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 10, generator=generator)
    y = (torch.rand(32, 3, generator=generator) < 0.3).float()
    lrs, decays = [1e-1, 1e-2, 1e-2], [0.5, 0.0, 5.0]
    heads = LinearHeads.create(10, 3, [torch.Generator().manual_seed(s) for s in (5, 6, 7)])
    references = []
    for h, (lr, decay) in enumerate(zip(lrs, decays, strict=True)):
        layer = torch.nn.Linear(10, 3)
        weight, bias = heads.head(h)
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        references.append((layer, torch.optim.AdamW(layer.parameters(), lr=lr,
                                                     weight_decay=decay)))
    adam = StackedAdam(heads.parameters(), lrs, fused=fused, weight_decays=[decays, decays])
    assert_stacked_adam_matches(heads, adam, references, x, y)


def test_probe_grid_scales_the_learning_rates_and_adds_weight_decays():
    points = grid_points([1.0, 0.1], [8, 16], weight_decays=[0.0, 0.5], lr_reference_batch=256)
    assert [(p.batch_size, p.lr, p.weight_decay) for p in points] == [
        (8, 8 / 256, 0.0), (8, 8 / 256, 0.5), (8, 0.1 * 8 / 256, 0.0), (8, 0.1 * 8 / 256, 0.5),
        (16, 16 / 256, 0.0), (16, 16 / 256, 0.5), (16, 0.1 * 16 / 256, 0.0),
        (16, 0.1 * 16 / 256, 0.5)]
    # the protocol's points keep their keys (they seed the heads): no weight decay, no change
    assert GridPoint(1e-3, 8).key() == "lr=0.001|bsize=8|"
    assert GridPoint(1e-3, 8, weight_decay=0.5).key() == "lr=0.001|bsize=8||wd=0.5"
    spec = probe_spec(SearchSpec("an-ls"))
    assert spec.weight_decays == list(PROBE_WEIGHT_DECAYS)
    assert PROBE_WEIGHT_DECAYS == pytest.approx(np.logspace(-6, 2, 7)[::2])
    assert "search" not in SearchSpec("an-ls").settings()  # protocol fingerprints unchanged
    assert spec.settings()["weight_decays"] == spec.weight_decays


def test_normalised_rows_and_the_refit_split(tmp_path):
    data = load_linear_data(*synthetic_dataset(tmp_path))
    unit = normalised(data)
    for name in ("train", "val", "test"):
        torch.testing.assert_close(getattr(unit, name).features.norm(dim=1),
                                   torch.ones(len(getattr(data, name))))
        torch.testing.assert_close(getattr(unit, name).features * getattr(data, name).features
                                   .norm(dim=1, keepdim=True), getattr(data, name).features)
    merged = train_and_val(unit)
    assert len(merged.train) == len(data.train) + len(data.val)
    assert list(merged.train.rows) == list(data.train.rows) + list(data.val.rows)
    torch.testing.assert_close(merged.train.clean[len(data.train):], data.val.clean)
    assert merged.test is unit.test and merged.val is unit.val


def test_probe_run_records_every_choice_and_refits_the_selection(tmp_path):
    synthetic_dataset(tmp_path / "cache")
    cache = tmp_path / "cache"
    result = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an-ls",
                    "--search", "probe", "--weight-decay", "0,0.5", "--lr", "1,10",
                    "--run-id", "p", *COMMON)
    assert result.exit_code == 0, result.output
    folder = cache / "toy" / "runs" / "an-ls" / "p"
    document = json.loads((folder / "results.json").read_text())
    probe = document["probe"]
    assert probe["features"] == "l2-normalised" and probe["weight_decays"] == [0.0, 0.5]
    assert probe["learning_rates_base"] == [1.0, 10.0] and "256" in probe["lr_scaling"]
    assert document["protocol"]["optimizer"] == "adamw"
    configs = document["seeds"][0]["configs"]
    assert [(c["batch_size"], c["lr"], c["weight_decay"]) for c in configs] == [
        (b, lr * b / 256, wd) for b in (8, 16) for lr in (1.0, 10.0) for wd in (0.0, 0.5)]
    best = max(configs, key=lambda c: c["val_map"])  # first maximum: the protocol's selection
    selection = document["selection"]
    assert (selection["lr"], selection["batch_size"], selection["weight_decay"],
            selection["epoch"]) == (best["lr"], best["batch_size"], best["weight_decay"],
                                    best["best_epoch"])
    assert selection["val_map"] == best["val_map"]
    refit = probe["refit"][0]
    assert refit["test_map_before_refit"] == best["test_map"]
    assert selection["test_map"] == refit["test_map"] == document["summary"]["test_map_mean"]
    # the refit, by hand: the selected configuration on the normalised train + val rows, from
    # the same initialisation, for the selected number of epochs, its last epoch kept
    data = normalised(load_linear_data(cache / "toy" / "labels.h5",
                                       cache / "toy" / "features-toy.h5"))
    config = GridPoint(best["lr"], best["batch_size"], weight_decay=best["weight_decay"])
    head = train_group(train_and_val(data), "an-ls", [config], epochs=best["best_epoch"],
                       val_variant=LAST_EPOCH, progress=False)[0]
    assert refit["rows"] == len(data.train) + len(data.val)
    assert head.best.test_map == pytest.approx(refit["test_map"], abs=1e-9)
    # the run predicts as it was scored: on L2-normalised rows, with the refit head
    run = load_run(folder)
    x = data.test.features.numpy() * 3.0  # any scale: the run normalises
    expected = torch.sigmoid(torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))
                             @ head.weight.T + head.bias).numpy()
    np.testing.assert_allclose(run.predict_proba(x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="--search probe run"):
        run.to_estimator()
    # the protocol's search of the same loss is untouched and reused as before
    again = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an-ls",
                   "--search", "probe", "--weight-decay", "0,0.5", "--lr", "1,10",
                   "--run-id", "p", *COMMON)
    assert "already finished with these settings; reusing it" in again.output
    other = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an-ls",
                   "--run-id", "p", *COMMON)
    assert other.exit_code != 0 and "search" in other.output


def test_probe_defaults_and_refusals(tmp_path):
    synthetic_dataset(tmp_path / "cache")
    cache = tmp_path / "cache"
    result = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an",
                    "--search", "probe", "--run-id", "d", "--epochs", "1", "--quiet",
                    "--no-plots", "--device", "cpu", "--jobs", "1")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / "toy" / "runs" / "an" / "d" / "results.json").read_text())
    assert document["grid"]["lr"] == list(PROBE_LEARNING_RATES)
    assert document["probe"]["weight_decays"] == list(PROBE_WEIGHT_DECAYS)
    refused = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an",
                     "--weight-decay", "0.1", "--device", "cpu")
    assert refused.exit_code != 0 and "--weight-decay belongs to --search probe" in refused.output
    negative = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an",
                      "--search", "probe", "--weight-decay", "-1", "--device", "cpu")
    assert negative.exit_code != 0 and "finite values >= 0" in negative.output
    streamed = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an",
                      "--search", "probe", "--stream", "--device", "cpu")
    assert streamed.exit_code != 0 and "streamed from the file" in streamed.output
    with pytest.raises(OptionError, match="ll-r\\+boostlu train BoostLU heads"):
        from featcache.linear.search_modes.probe import probe_losses
        probe_losses(["an", "ll-r+boostlu"], [], every=False)
    skipped = []
    from featcache.linear.search_modes.probe import probe_losses
    assert probe_losses(["an", "ll-r+boostlu"], skipped, every=True) == ["an"]
    assert skipped[0][0] == "ll-r+boostlu"


def test_the_protocol_search_trains_adam_without_decay_as_before(tmp_path):
    data = load_linear_data(*synthetic_dataset(tmp_path))
    spec = SearchSpec("an-ls", learning_rates=[1e-2, 1e-3], batch_sizes=[8], epochs=2)
    plain = run_search(data, spec, progress=False, jobs=1)
    zero = run_search(data, SearchSpec("an-ls", learning_rates=[1e-2, 1e-3], batch_sizes=[8],
                                       epochs=2, weight_decays=[0.0]), progress=False, jobs=1)
    for a, b in zip(plain.seeds[0].heads, zero.seeds[0].heads, strict=True):
        assert torch.equal(a.weight, b.weight) and a.best.test_map == b.best.test_map


def test_the_ranking_study_ranks_and_correlates_by_hand():
    from benchmarks.probe_ranking import ranks, spearman

    assert ranks([3.0, 1.0, 2.0]) == [1.0, 3.0, 2.0]
    assert ranks([2.0, 2.0, 1.0, 3.0]) == [2.5, 2.5, 4.0, 1.0]  # ties share their mean rank
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # no ties: 1 - 6 sum d^2 / (n (n^2 - 1)); ranks (1,2,3,4) vs (3,4,1,2): sum d^2 = 16
    assert spearman([4, 3, 2, 1], [2, 1, 4, 3]) == pytest.approx(1 - 6 * 16 / (4 * 15))
