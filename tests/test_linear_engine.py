"""Stage two's engine: stacked heads, per-head Adam, device mAP, grid training and selection."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from linear_fixtures import assert_stacked_adam_matches, synthetic_dataset
from sklearn.metrics import average_precision_score

from featcache.heads import BoostLUHeads, LinearHeads, init_linear
from featcache.linear.data import load_linear_data
from featcache.linear.engine.optimizer import StackedAdam
from featcache.linear.engine.search import SearchSpec, run_search, run_searches
from featcache.linear.engine.trainer import train_group
from featcache.losses import loss_class
from featcache.metrics import RankedScores, average_precision, mean_average_precision
from featcache.protocol.grid import GridPoint


# ------------------------------------------------------------------ average precision
def sklearn_ap(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return np.array([0.0 if not targets[:, c].any()
                     else average_precision_score(targets[:, c], scores[:, c])
                     for c in range(targets.shape[1])])


@pytest.mark.parametrize("ties", [False, True])
def test_average_precision_matches_scikit_learn_to_1e6(ties):
    generator = torch.Generator().manual_seed(3)
    scores = torch.rand(3, 400, 6, generator=generator)
    if ties:
        scores = (scores * 8).round() / 8  # many tied scores: one threshold per tie group
    targets = (torch.rand(400, 6, generator=generator) < 0.2).float()
    ap = average_precision(scores, targets)
    for head in range(3):
        expected = sklearn_ap(scores[head].numpy(), targets.numpy())
        np.testing.assert_allclose(ap[head].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_average_precision_on_logits_per_head_targets_and_any_dtype(dtype):
    # negative scores, -0.0 tied with 0.0, ties across classes; float64 takes the generic path
    generator = torch.Generator().manual_seed(4)
    scores = ((torch.randn(2, 300, 4, generator=generator) * 3).round() / 2).to(dtype)
    scores[0, :5, 0] = -0.0
    targets = (torch.rand(2, 300, 4, generator=generator) < 0.3).float()
    ap = average_precision(scores, targets)
    for head in range(2):
        expected = sklearn_ap(scores[head].double().numpy(), targets[head].numpy())
        np.testing.assert_allclose(ap[head].numpy(), expected, atol=1e-12)


def test_one_ranking_serves_several_label_sets():
    generator = torch.Generator().manual_seed(5)
    scores = torch.rand(3, 200, 5, generator=generator)
    clean = (torch.rand(200, 5, generator=generator) < 0.3).float()
    observed = clean * (torch.rand(200, 5, generator=generator) < 0.5)
    ranked = RankedScores(scores)
    for targets in (clean, observed):
        assert torch.equal(ranked.average_precision(targets), average_precision(scores, targets))
    with pytest.raises(ValueError, match="do not fit"):
        ranked.average_precision(clean[:, :3])


def test_a_class_without_positives_gets_ap_zero_as_in_the_reference():
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.4, 0.3]])
    targets = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    ap = average_precision(scores, targets)
    assert ap[1].item() == 0.0
    assert ap[0].item() == pytest.approx(1.0)
    assert mean_average_precision(scores, targets).item() == pytest.approx(50.0)


def test_average_precision_by_hand():
    # scores 0.9 (pos), 0.8 (neg), 0.7 (pos): AP = 1/2 * (1/1 + 2/3)
    ap = average_precision(torch.tensor([[0.9], [0.8], [0.7]]), torch.tensor([[1.0], [0.0], [1.0]]))
    assert ap.item() == pytest.approx(0.5 * (1 + 2 / 3))
    # a tie between a positive and a negative at the top forms one threshold: P = 1/2
    ap = average_precision(torch.tensor([[0.5], [0.5], [0.1]]), torch.tensor([[1.0], [0.0], [0.0]]))
    assert ap.item() == pytest.approx(0.5)


# ------------------------------------------------------------------ heads and optimizer
def test_init_linear_matches_nn_linear_distribution_bounds():
    weight, bias = init_linear(64, 5, torch.Generator().manual_seed(0))
    assert weight.shape == (64, 5) and bias.shape == (5,)
    assert weight.abs().max() <= 1 / 8 and bias.abs().max() <= 1 / 8


def test_stacked_adam_matches_torch_adam_for_each_head():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 10, generator=generator)
    y = (torch.rand(32, 3, generator=generator) < 0.3).float()
    lrs = [1e-1, 1e-3]
    heads = LinearHeads.create(10, 3, [torch.Generator().manual_seed(s) for s in (5, 6)])
    references = []
    for h, lr in enumerate(lrs):
        layer = torch.nn.Linear(10, 3)
        weight, bias = heads.head(h)
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        references.append((layer, torch.optim.Adam(layer.parameters(), lr=lr)))
    adam = StackedAdam(heads.parameters(), lrs)
    assert_stacked_adam_matches(heads, adam, references, x, y)


# ------------------------------------------------------------------ training
@pytest.fixture
def toy(tmp_path):
    labels, features = synthetic_dataset(tmp_path)
    return load_linear_data(labels, features)


def test_a_stacked_head_trains_exactly_like_the_same_configuration_alone(toy):
    grid = [GridPoint(lr, 8) for lr in (1e-2, 1e-3, 1e-4)]
    together = train_group(toy, "an-ls", grid, epochs=3, progress=False)
    alone = train_group(toy, "an-ls", [grid[1]], epochs=3, progress=False)[0]
    torch.testing.assert_close(together[1].weight, alone.weight, rtol=1e-5, atol=1e-6)
    assert [r.val_map for r in together[1].epochs] == pytest.approx(
        [r.val_map for r in alone.epochs], abs=1e-4)


@pytest.mark.parametrize("loss", ["an", "an-ls", "wan", "bce-ls", "iun"])
def test_training_with_a_hand_written_loss_gradient_gives_autograds_numbers(toy, loss, monkeypatch):
    grid = [GridPoint(lr, 8) for lr in (1e-2, 1e-3)]
    calls = []
    hand_written = loss_class(loss).loss_and_grad

    def counted(self, *args):
        calls.append(1)
        return hand_written(self, *args)

    monkeypatch.setattr(loss_class(loss), "loss_and_grad", counted)
    by_hand = train_group(toy, loss, grid, epochs=2, progress=False)
    assert len(calls) == 2 * (len(toy.train) // 8)
    monkeypatch.setattr(loss_class(loss), "loss_and_grad", lambda self, *args: None)
    autograd = train_group(toy, loss, grid, epochs=2, progress=False)
    for ours, theirs in zip(by_hand, autograd, strict=True):
        assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
        assert ours.epochs == theirs.epochs


def test_same_seed_same_numbers_and_another_seed_differs(toy):
    grid = [GridPoint(1e-2, 16, seed=0)]
    first = train_group(toy, "role", grid, epochs=2, progress=False)[0]
    second = train_group(toy, "role", grid, epochs=2, progress=False)[0]
    assert torch.equal(first.weight, second.weight) and torch.equal(first.state["phi"], second.state["phi"])
    other = train_group(toy, "role", [GridPoint(1e-2, 16, seed=1)], epochs=2, progress=False)[0]
    assert not torch.equal(first.weight, other.weight)


def test_best_epoch_is_the_first_with_the_highest_validation_map(toy):
    result = train_group(toy, "an", [GridPoint(1e-2, 8)], epochs=6, progress=False)[0]
    values = [r.val_map for r in result.epochs]
    assert result.best_epoch == int(np.argmax(values))
    assert result.best_val == pytest.approx(max(values))
    assert result.best.test_map == result.epochs[result.best_epoch].test_map


def test_the_saved_head_reproduces_the_best_epoch_test_map(toy):
    result = train_group(toy, "an", [GridPoint(1e-2, 8)], epochs=4, progress=False)[0]
    probs = torch.sigmoid(toy.test.features @ result.weight.t() + result.bias)
    assert mean_average_precision(probs, toy.test.clean).item() == pytest.approx(
        result.best.test_map, abs=1e-6)
    assert result.test_ap.mean().item() * 100 == pytest.approx(result.best.test_map, abs=1e-9)


def test_role_returns_phi_at_the_best_epoch_for_linearinit(toy):
    result = train_group(toy, "role", [GridPoint(1e-3, 8)], epochs=2, progress=False)[0]
    assert result.state["phi"].shape == (len(toy.train), toy.num_classes)


def test_selection_across_configurations_prefers_the_earlier_on_ties(toy, monkeypatch):
    spec = SearchSpec(loss="an", learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=2)
    result = run_search(toy, spec, progress=False)
    heads = result.seeds[0].heads
    assert [(h.config.batch_size, h.config.lr) for h in heads] == [(8, 1e-2), (8, 1e-3), (16, 1e-2), (16, 1e-3)]
    best = max(h.best_val for h in heads)
    assert result.selected is next(h for h in heads if h.best_val == best)


def test_param_lists_become_grid_axes_trained_as_heads(toy):
    spec = SearchSpec(loss="an-ls", learning_rates=(1e-2,), batch_sizes=(8,), epochs=1,
                      params={"eps_neg": [0.0, 0.1, 0.2]})
    result = run_search(toy, spec, progress=False)
    assert [h.config.param_dict["eps_neg"] for h in result.seeds[0].heads] == [0.0, 0.1, 0.2]


def test_epr_takes_k_from_the_labels_file(toy):
    params = loss_class("epr").resolve({}, facts=toy.facts)
    assert params.values["k"] == [pytest.approx(float(toy.labels.train.clean.sum(1).mean()))]
    assert params.sources["k"] == "data"


def test_iu_draws_observed_negatives_with_the_protocol_sampler(toy):
    data = loss_class("iu").fit_data(toy)
    observed = data.train.observed
    assert ((observed == -1).sum(dim=1) == 1).all()
    assert torch.equal(observed.clamp(min=0), toy.train.observed)
    assert any("observed negatives" in note for note in data.notes)


def test_early_stopping_rules_freeze_heads(toy):
    result = train_group(toy, "an", [GridPoint(1e-2, 8)], epochs=8, early_stop="zhou",
                         progress=False)[0]
    if result.stopped_at is not None:
        assert len(result.epochs) == result.stopped_at + 1
        assert result.epochs[-1].val_map <= result.best_val


def test_several_seeds_repeat_the_search_and_report_mean_and_std(toy):
    spec = SearchSpec(loss="an", learning_rates=(1e-2,), batch_sizes=(16,), epochs=2, seeds=(0, 1))
    result = run_search(toy, spec, progress=False)
    tests = [seed.selected.best.test_map for seed in result.seeds]
    assert [seed.seed for seed in result.seeds] == [0, 1] and tests[0] != tests[1]
    summary = result.summary()
    assert summary["seeds"] == 2
    assert summary["test_map_mean"] == pytest.approx(np.mean(tests))
    assert summary["test_map_std"] == pytest.approx(np.std(tests, ddof=1))
    assert result.selected is max((s.selected for s in result.seeds), key=lambda h: h.best_val)


def test_the_number_of_cpu_jobs_does_not_change_the_numbers(toy):
    spec = SearchSpec(loss="role", learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=2)
    one = run_search(toy, spec, progress=False, jobs=1)
    two = run_search(toy, spec, progress=False, jobs=2)
    for a, b in zip(one.seeds[0].heads, two.seeds[0].heads, strict=True):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.state["phi"], b.state["phi"])


def test_several_searches_share_the_workers_and_give_each_its_own_numbers(toy):
    specs = [SearchSpec(loss=loss, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=2)
             for loss in ("an", "iu")]
    finished = []
    together = run_searches(toy, specs, progress=False, jobs=2,
                            on_done=lambda result: finished.append(result.spec.loss))
    assert sorted(finished) == ["an", "iu"]
    for spec, shared in zip(specs, together, strict=True):
        alone = run_search(toy, spec, progress=False, jobs=1)
        assert shared.notes == alone.notes  # iu's observed negatives, drawn for it alone
        for a, b in zip(alone.seeds[0].heads, shared.seeds[0].heads, strict=True):
            assert torch.equal(a.weight, b.weight)
            assert [e.to_json() for e in a.epochs] == [e.to_json() for e in b.epochs]


# ------------------------------------------------------------------ evaluation elsewhere
def _same_heads(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.config == b.config and a.best_epoch == b.best_epoch and a.epochs == b.epochs
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
        assert torch.equal(a.test_ap, b.test_ap) and a.best_val == b.best_val
        assert a.state.keys() == b.state.keys()
        assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)


def test_frozen_boostlu_heads_keep_their_settings_and_score_like_them():
    heads = BoostLUHeads.create(6, 3, [torch.Generator().manual_seed(s) for s in (1, 2)],
                                positions=4, params={"alpha": [1.0, 5.0]})
    again = heads.frozen(heads.weight.detach().clone(), heads.bias.detach().clone())
    assert isinstance(again, BoostLUHeads)
    assert (again.positions, again.params) == (4, {"alpha": [1.0, 5.0]})
    x = torch.randn(5, 4 * 6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again.scores(x), heads.scores(x))


def test_the_search_gives_the_same_numbers_on_one_worker_and_on_two(toy):
    specs = [SearchSpec(loss=name, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=3)
             for name in ("an", "role", "an-ls")]
    spread = run_searches(toy, specs, progress=False, jobs=2)
    alone = run_searches(toy, specs, progress=False, jobs=1)
    for ours, theirs in zip(spread, alone, strict=True):
        assert ours.spec.loss == theirs.spec.loss
        _same_heads(ours.seeds[0].heads, theirs.seeds[0].heads)
        assert ours.seconds > 0


def test_scores_ranked_a_block_of_columns_at_a_time_give_the_same_ap(monkeypatch):
    import featcache.metrics as metrics

    generator = torch.Generator().manual_seed(5)
    scores = (torch.rand(3, 700, 6, generator=generator) * 40).round() / 40  # ties
    shared = (torch.rand(700, 6, generator=generator) < 0.2).float()
    per_head = (torch.rand(3, 700, 6, generator=generator) < 0.3).float()
    whole = RankedScores(scores)
    assert len(whole.blocks) == 1
    monkeypatch.setattr(metrics, "RANK_BLOCK", 1500)  # two columns of 700 rows per block
    blocks = RankedScores(scores)
    assert len(blocks.blocks) == 9
    for targets in (shared, per_head):
        assert torch.equal(blocks.average_precision(targets), whole.average_precision(targets))
    with pytest.raises(ValueError, match="do not fit"):
        blocks.average_precision(shared[:, :5])


@pytest.mark.parametrize("loss", ["an", "role", "iun"])
def test_labels_kept_as_int8_and_uint8_train_exactly_as_float32_labels(toy, loss):
    """A labels file's labels stay compact on the device (a quarter of float32's memory); the
    trainer makes each batch float, so the numbers are those of float32 labels, bit for bit."""
    assert toy.train.observed.dtype == torch.int8 and toy.test.clean.dtype == torch.uint8
    as_float = copy.copy(toy)
    for name in ("train", "val", "test"):
        split = getattr(toy, name)
        setattr(as_float, name, dataclasses.replace(split, observed=split.observed.float(),
                                                    clean=split.clean.float()))
    spec = SearchSpec(loss=loss, learning_rates=(1e-2, 1e-3), batch_sizes=(8,), epochs=2)
    compact = run_search(toy, spec, progress=False, jobs=1)
    wide = run_search(as_float, spec, progress=False, jobs=1)
    for a, b in zip(compact.seeds[0].heads, wide.seeds[0].heads, strict=True):
        assert torch.equal(a.weight, b.weight) and a.epochs == b.epochs
        assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
