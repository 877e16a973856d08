"""BoostLU (Kim et al. CVPR 2023): the head shared by both stages, its losses, stage two on a
spatial features file (in memory and streamed), and the refusals.

Hand-computed values are those of /work/notes/issue12-methods.md section 3.5 (float64).
"""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dataset_fixtures import invoke
from linear_fixtures import spatial_features_file, synthetic_dataset

from featcache.data.featurefile import open_features
from featcache.data.labelfile import load_labels
from featcache.errors import InputError, LossNeedError, OptionError
from featcache.heads import BoostLUHeads, HeadModule, LinearHeads, boostlu_pool
from featcache.linear.data import load_linear_data, split_rows
from featcache.linear.engine.member import create_heads
from featcache.linear.engine.search import SearchSpec, run_search
from featcache.linear.memory import GroupShape, SplitSizes, plan_placement
from featcache.linear.stream import StreamedRows, load_streamed_data
from featcache.losses import DataFacts, HeadKind, Targets, create_loss, loss_class
from featcache.losses.boostlu import reference_rate
from featcache.protocol.handoff import load_head
from featcache.protocol.loss_choice import choose_losses
from featcache.protocol.runs import load_results

FAST = ("--epochs", "3", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots")
ATOL = 1e-6

# ---------------------------------------------------------------- worked example (notes 3.5)
# D = 2, h = w = 2, one class, W = [1, -1], bias 0.5; features at the positions (row-major)
# (2,0), (0,1), (1,1), (0,3): CAM = [[2.5, -0.5], [0.5, -2.5]].
POSITIONS = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
W = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)  # (D, L) for one stacked head
B = torch.tensor([[[0.5]]], dtype=torch.float64)


def _example_head(alpha):
    return BoostLUHeads(W.unsqueeze(0).clone(), B.clone(), positions=4, params={"alpha": [alpha]},
                        trainable=True)


def test_the_worked_example_logits_by_hand():
    row = POSITIONS.reshape(1, 8)  # one image, the (h, w, D) layout of the spatial file
    cam = _example_head(5.0).cam(row)
    assert cam.flatten().tolist() == [2.5, -0.5, 0.5, -2.5]
    # alpha = 1: (2.5 - 0.5 + 0.5 - 2.5) / 4 = 0 = the linear head on GAP (0.75, 1.25):
    # 0.75 - 1.25 + 0.5 = 0
    assert _example_head(1.0).forward(row).item() == pytest.approx(0.0, abs=ATOL)
    gap = POSITIONS.mean(dim=0, keepdim=True)
    linear = LinearHeads(W.unsqueeze(0).clone(), B.clone(), trainable=True).forward(gap)
    assert linear.item() == pytest.approx(0.0, abs=ATOL)
    # alpha = 5: boosted [[12.5, -0.5], [2.5, -2.5]] -> 12 / 4 = 3
    logit = _example_head(5.0).forward(row)
    assert logit.item() == pytest.approx(3.0, abs=ATOL)
    # identity: g = linear(GAP) + (alpha - 1) mean relu(CAM) = 0 + 4 * (3 / 4) = 3
    identity = linear + (5.0 - 1.0) * cam.clamp(min=0).mean(dim=2)
    assert identity.item() == pytest.approx(logit.item(), abs=ATOL)


def test_the_worked_example_bce_on_the_boosted_logit():
    logit = _example_head(5.0).forward(POSITIONS.reshape(1, 8))  # (1 head, 1 image, 1 class)
    loss = create_loss("an+boostlu", 1)
    positive = loss(logit, Targets(torch.ones(1, 1, dtype=torch.float64), torch.tensor([0])))
    negative = loss(logit, Targets(torch.zeros(1, 1, dtype=torch.float64), torch.tensor([0])))
    assert positive.item() == pytest.approx(math.log(1 + math.exp(-3.0)), abs=ATOL)  # 0.0485874
    assert positive.item() == pytest.approx(0.0485874, abs=ATOL)
    assert negative.item() == pytest.approx(3.0485874, abs=ATOL)
    # observed negatives (z = -1) count as negatives (labels clipped to >= 0)
    observed_negative = loss(logit, Targets(-torch.ones(1, 1, dtype=torch.float64),
                                            torch.tensor([0])))
    assert observed_negative.item() == pytest.approx(3.0485874, abs=ATOL)


def test_stage_three_head_is_the_same_code_on_a_feature_map():
    torch.manual_seed(0)
    fmap = torch.randn(3, 6, 2, 3, dtype=torch.float64)  # (B, D, h, w)
    head = HeadModule.create(HeadKind.BOOSTLU, 6, 4, {"alpha": 5.0},
                             generator=torch.Generator().manual_seed(0)).double()
    rows = fmap.permute(0, 2, 3, 1).reshape(3, -1)  # the spatial file's (h, w, D) rows
    stacked = BoostLUHeads(head.weight.detach().t().unsqueeze(0).clone(),
                           head.bias.detach().view(1, 1, -1).clone(), positions=6,
                           params={"alpha": [5.0]})
    torch.testing.assert_close(head(fmap), stacked.forward(rows)[0], rtol=0, atol=1e-12)
    # its gradients reach the module's parameters (nn.Linear's layout: weight (L, D))
    head(fmap).sum().backward()
    assert head.weight.grad is not None and head.weight.grad.shape == (4, 6)
    # the worked example on a (B, D, h, w) map: logit 3.0
    conv = HeadModule.create(HeadKind.BOOSTLU, 2, 1, {"alpha": 5.0}, weight=W.t().float(),
                             bias=torch.tensor([0.5])).double()
    example = POSITIONS.t().reshape(1, 2, 2, 2)
    assert conv(example).item() == pytest.approx(3.0, abs=ATOL)
    assert "alpha=5" in repr(conv) and "kind=boostlu" in repr(conv)


def test_boosting_then_pooling_equals_the_identity_on_random_maps():
    torch.manual_seed(1)
    cam = torch.randn(2, 5, 7, 3, dtype=torch.float64)
    for alpha in (1.0, 2.5, 5.0):
        expected = cam.mean(dim=2) + (alpha - 1) * cam.clamp(min=0).mean(dim=2)
        torch.testing.assert_close(boostlu_pool(cam, alpha, dims=2), expected)


def test_hand_written_gradients_equal_autograd_for_several_heads_and_alphas():
    torch.manual_seed(2)
    positions, dim, classes = 6, 5, 4
    x = torch.randn(7, positions * dim, dtype=torch.float64)
    weight = torch.randn(3, dim, classes, dtype=torch.float64)
    bias = torch.randn(3, 1, classes, dtype=torch.float64)
    head = BoostLUHeads(weight.clone(), bias.clone(), positions=positions,
                        params={"alpha": [1.0, 3.0, 5.0]}, trainable=True)
    grad_logits = torch.randn(3, 7, classes, dtype=torch.float64)
    logits = head(x)
    expected = torch.autograd.grad((logits * grad_logits).sum(), head.parameters())
    head.forward(x)
    got = head.grads(x, grad_logits)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # and autograd itself against finite differences
    assert torch.autograd.gradcheck(
        lambda w, b: BoostLUHeads(w, b, positions=positions,
                                  params={"alpha": [1.0, 3.0, 5.0]}).pool(
            BoostLUHeads(w, b, positions=positions,
                         params={"alpha": [1.0, 3.0, 5.0]}).cam(x, w, b)),
        (weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)))


def test_alpha_one_is_the_linear_head_on_pooled_features():
    torch.manual_seed(3)
    x = torch.randn(9, 4 * 8)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    boost = BoostLUHeads.create(8, 5, gens, positions=4, params={"alpha": [1.0, 1.0]})
    linear = LinearHeads(boost.weight.detach().clone(), boost.bias.detach().clone())
    gap = x.view(9, 4, 8).mean(dim=1)
    torch.testing.assert_close(boost.scores(x), linear.scores(gap), rtol=1e-5, atol=1e-6)
    # fresh heads are drawn exactly like nn.Linear(D, L) heads
    plain = LinearHeads.create(8, 5, [torch.Generator().manual_seed(s) for s in (1, 2)])
    assert torch.equal(plain.weight, boost.weight) and torch.equal(plain.bias, boost.bias)


# ------------------------------------------------------------------- the LL losses (notes 3.5)
def _ll(name, epoch, state=None, observed=(1.0, 0.0, 0.0)):
    loss = create_loss(name, 3)
    z = torch.tensor([observed], dtype=torch.float64)
    state = loss.init_state(z) if state is None else state
    logits = torch.tensor([[3.0, 0.0, 2.0]], dtype=torch.float64)
    return loss(logits, Targets(z, torch.tensor([0])), state, epoch).item(), state


@pytest.mark.parametrize("name", ["ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu"])
def test_first_epoch_is_plain_bce_mean(name):
    # BCE [0.0485874, 0.6931472, 2.1269280], mean 0.9562208
    assert _ll(name, 0)[0] == pytest.approx(0.9562208, abs=ATOL)


def test_second_epoch_rejects_or_corrects_the_largest_unobserved_loss():
    assert _ll("ll-r+boostlu", 1)[0] == pytest.approx(0.2472448, abs=ATOL)  # 2.127 rejected
    assert _ll("ll-ct+boostlu", 1)[0] == pytest.approx(0.2895542, abs=ATOL)  # log(1+e^-2)
    value, state = _ll("ll-cp+boostlu", 1)
    assert value == pytest.approx(0.2895542, abs=ATOL)
    # the BoostLU code flips the k-th entry too (>=); Kim 2022's code flips none (> the k-th)
    assert state["observed"][0, 0].tolist() == [1, 0, 1]
    _, kim = _ll("ll-cp", 1)
    assert kim["observed"][0, 0].tolist() == [1, 0, 0]


def test_per_scheme_delta_rel_defaults_and_alpha_recorded():
    assert create_loss("ll-r+boostlu", 3).param_values == {"delta_rel": [0.5], "alpha": [5.0]}
    assert create_loss("ll-ct+boostlu", 3).param_values["delta_rel"] == [0.2]
    assert create_loss("ll-cp+boostlu", 3).param_values["delta_rel"] == [0.1]
    assert create_loss("an+boostlu", 3).param_values == {"alpha": [5.0]}
    for name in ("an+boostlu", "ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu"):
        assert loss_class(name).head is HeadKind.BOOSTLU
    with pytest.raises(OptionError, match=r"alpha=0.5 is out of range: alpha takes \[1, inf\)"):
        create_loss("ll-r+boostlu", 3, params={"alpha": 0.5})


def test_k_follows_the_reference_codes_float_arithmetic():
    # B = 8, L = 20, delta 0.5 %: clean_rate decremented repeatedly gives k = 5 in epoch 5
    # (1 - clean_rate = 0.025000000000000022 -> ceil(4.0000000000000036)), where e * delta
    # exactly gives 4; featcache's Kim-2022 ll-r rounds the round-off away.
    loss = create_loss("ll-r+boostlu", 20)
    assert [loss.num_large(160, e, 0.5) for e in range(10)] == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8]
    kim = create_loss("ll-r", 20)
    assert [kim.num_large(160, e, 0.5) for e in range(10)] == [0, 1, 2, 3, 4, 4, 5, 6, 7, 8]
    assert loss.num_large(320, 5, 0.5) == 9  # B = 16
    assert reference_rate(0, 0.5) == 0.0
    cp = create_loss("ll-cp+boostlu", 20)
    assert [cp.num_large(320, e, 0.1) for e in range(3)] == [0, 1, 1]  # ceil(0.32)


# -------------------------------------------------------------------------- stage two end to end
@pytest.fixture
def spatial(cache_dir):
    labels_path, _ = synthetic_dataset(cache_dir)
    return cache_dir, spatial_features_file(labels_path)


def test_train_linear_boostlu_on_a_spatial_file_records_alpha_and_the_head(spatial):
    cache, path = spatial
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an,ll-r+boostlu",
                    "--run-id", "r1", *FAST)
    assert result.exit_code == 0, result.output
    run = cache / "toy" / "runs" / "ll-r+boostlu" / "r1"
    document = load_results(run)
    assert document["selection"]["params"] == {"delta_rel": 0.5, "alpha": 5.0}
    assert document["grid"]["params"]["alpha"] == [5.0]
    assert document["grid"]["params_source"]["alpha"] == "default"
    assert document["features"]["path"] == str(path)
    assert document["features"]["layout"] == "spatial"
    assert document["features"]["spatial_shape"] == [2, 2, 6]
    assert document["head"] == {"kind": "boostlu", "spatial_shape": [2, 2, 6]}
    assert document["loss_reference"].startswith("Kim et al. CVPR 2023")
    head = load_head(run)
    assert head["weight"].shape == (5, 6) and head["bias"].shape == (5,)
    assert head["params"]["alpha"] == 5.0 and head["head"]["kind"] == "boostlu"
    # the pooled loss of the same call trained on the pooled file, and one table holds both
    pooled = load_results(cache / "toy" / "runs" / "an" / "r1")
    assert pooled["features"]["path"].endswith("features-toy.h5") and "layout" not in pooled["features"]
    assert pooled["head"] == {"kind": "linear"}
    assert (cache / "toy" / "runs" / "table-r1.md").is_file()
    # the selected head's test mAP is the head's own on the spatial rows (recomputed here)
    data = load_linear_data(cache / "toy" / "labels.h5", path)
    stacked = BoostLUHeads(head["weight"].t().unsqueeze(0), head["bias"].view(1, 1, -1), positions=4,
                           params={"alpha": [5.0]})
    from featcache.metrics import average_precision
    ap = average_precision(stacked.scores(data.test.features), data.test.clean)
    assert float(ap.mean() * 100) == pytest.approx(document["selection"]["test_map"], abs=1e-4)
    # a given alpha is a grid axis like any parameter
    again = invoke("train-linear", "--dataset", "toy", "--loss", "ll-cp+boostlu", "--param",
                   "alpha=1,5", "--run-id", "r2", *FAST)
    assert again.exit_code == 0, again.output
    grid = load_results(cache / "toy" / "runs" / "ll-cp+boostlu" / "r2")["grid"]
    assert grid["params"]["alpha"] == [1.0, 5.0] and grid["params_source"]["alpha"] == "given"
    # the BoostLU heads' test scores are kept, exactly those their test AP came from
    for folder in (run, cache / "toy" / "runs" / "ll-cp+boostlu" / "r2"):
        with h5py.File(folder / "test-scores.h5", "r") as h5:
            kept, targets = h5["scores"][0], h5["targets"][()].astype(np.float32)
        recorded = load_results(folder)["selection"]["test_ap_per_class"]
        ap = average_precision(torch.from_numpy(kept), torch.from_numpy(targets)).numpy() * 100
        assert np.allclose(ap, list(recorded.values()), rtol=0, atol=1e-9)


def test_streamed_boostlu_scores_equal_in_memory_and_a_streamed_search_runs(spatial):
    cache, path = spatial
    labels = load_labels(cache / "toy" / "labels.h5")
    features = open_features(path, labels)
    parts, _ = split_rows(labels, features)
    rows = StreamedRows(features, parts["train"], 16, 2)
    head = BoostLUHeads.create(6, 5, [torch.Generator().manual_seed(s) for s in (1, 2)],
                               positions=4, params={"alpha": [5.0, 2.0]})
    in_memory = torch.from_numpy(features.read("train")[parts["train"].rows]).float()
    torch.testing.assert_close(rows.scores(head), head.scores(in_memory), rtol=1e-5, atol=1e-6)
    for index, x in rows.epoch(torch.Generator().manual_seed(0), 8):
        assert torch.equal(x, in_memory[index])

    memory = load_linear_data(cache / "toy" / "labels.h5", path)
    placement = plan_placement(SplitSizes(len(memory.train), len(memory.val), len(memory.test),
                                          5, 24), 2, 16, GroupShape(2), 1, 1 << 36, 0,
                               force_stream=True)
    streamed = load_streamed_data(labels, open_features(path, labels), placement)
    assert streamed.spatial_shape == (2, 2, 6) and streamed.facts.spatial_features
    spec = SearchSpec(loss="ll-r+boostlu", learning_rates=(1e-2, 1e-3), batch_sizes=(8,), epochs=3)
    a = run_search(memory, spec, progress=False).selected.best
    b = run_search(streamed, spec, progress=False).selected.best
    assert abs(a.test_map - b.test_map) < 10.0  # other shuffles, same data and heads
    cli = invoke("train-linear", "--dataset", "toy", "--loss", "ll-r+boostlu", "--stream",
                 "--max-memory", "8GB", "--run-id", "s", *FAST)
    assert cli.exit_code == 0, cli.output
    document = load_results(cache / "toy" / "runs" / "ll-r+boostlu" / "s")
    assert document["settings"]["streaming"]["streamed"] == ["train"]


def test_scoring_blocks_bound_the_rows_float32_features_and_the_planner_counts_them(monkeypatch):
    """A scoring block holds at most CAM_BLOCK elements of class activation maps and of its
    rows' float32 features (wide feature maps: the features bound it); blocks change nothing."""
    import featcache.heads.maps as heads_module
    from featcache.linear.run import group_shape

    head = BoostLUHeads.create(6, 2, [torch.Generator().manual_seed(1)], positions=4,
                               params={"alpha": [5.0]})
    features = torch.rand(10, 4 * 6, generator=torch.Generator().manual_seed(2))
    whole = head.scores(features)
    chunks = []
    monkeypatch.setattr(heads_module, "CAM_BLOCK", 3 * 4 * 6)  # 3 rows of features (6 > 1 x 2)
    original_cam = BoostLUHeads.cam
    monkeypatch.setattr(BoostLUHeads, "cam",
                        lambda self, x, *a: chunks.append(x.shape[0]) or original_cam(self, x, *a))
    torch.testing.assert_close(head.scores(features), whole, rtol=0, atol=1e-7)
    assert chunks == [3, 3, 3, 1]

    sizes = SplitSizes(100, 20, 30, 5, 4 * 6)
    linear, boostlu = group_shape(loss_class("ll-r"), 2, True), group_shape(loss_class("ll-r+boostlu"), 2, True)
    work = heads_module.CAM_BLOCK_TENSORS * (1 << 24) * 4
    assert linear.scoring_work == 0 and boostlu.scoring_work == work
    assert boostlu.bytes(sizes) - linear.bytes(sizes) == work


# ------------------------------------------------------------------------------------ refusals
def test_no_spatial_file_is_one_clear_error_naming_the_command(cache_dir):
    synthetic_dataset(cache_dir)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "ll-r+boostlu", *FAST)
    assert result.exit_code != 0
    assert "featcache features --dataset toy --backbone toy --spatial" in result.output
    assert "Traceback" not in result.output


def test_loss_all_trains_boostlu_only_where_spatial_features_exist():
    facts = DataFacts(dataset="toy", num_classes=5, backbone="toy")
    chosen, skipped = choose_losses("all", facts)
    reasons = dict(skipped)
    assert "ll-r+boostlu" not in chosen and "an" in chosen
    assert "--spatial" in reasons["ll-r+boostlu"]
    with_maps = DataFacts(dataset="toy", num_classes=5, spatial_features=True)
    chosen, _ = choose_losses("all", with_maps)
    assert {"an+boostlu", "ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu"} <= set(chosen)
    with pytest.raises(LossNeedError, match="no spatial features file for toy"):
        choose_losses("ll-r+boostlu", facts)


def test_a_pooled_file_where_spatial_maps_are_needed_is_refused(spatial):
    cache, path = spatial
    with h5py.File(path, "a") as h5:  # a pooled file under the spatial name
        del h5.attrs["layout"]
        del h5.attrs["spatial_shape"]
    result = invoke("train-linear", "--dataset", "toy", "--loss", "ll-r+boostlu", *FAST)
    assert result.exit_code != 0 and "holds pooled features" in result.output
    assert "--spatial" in result.output
    # the heads refuse the wrong kind of rows whoever builds them
    pooled = load_linear_data(cache / "toy" / "labels.h5", cache / "toy" / "features-toy.h5")
    gens = [torch.Generator()]
    with pytest.raises(InputError, match="holds pooled features"):
        create_heads(create_loss("ll-r+boostlu", 5), pooled.feature_dim, pooled.spatial_shape,
                     5, gens)
    with pytest.raises(InputError, match="holds spatial feature maps"):
        create_heads(create_loss("an", 5), 24, (2, 2, 6), 5, gens)


def test_a_spatial_file_without_its_shape_is_refused(spatial):
    cache, path = spatial
    with h5py.File(path, "a") as h5:
        del h5.attrs["spatial_shape"]
    result = invoke("train-linear", "--dataset", "toy", "--loss", "ll-r+boostlu", *FAST)
    assert result.exit_code != 0 and "spatial_shape" in result.output


def test_the_bce_is_computed_with_logits_without_the_1e5_guard():
    # an+boostlu is the authors' loss_an (BCE with logits), not Cole's -log(sigmoid + 1e-5)
    logits = torch.tensor([[[20.0, -20.0]]], dtype=torch.float64)
    z = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    got = create_loss("an+boostlu", 2)(logits, Targets(z, torch.tensor([0])))
    expected = F.binary_cross_entropy_with_logits(logits[0], z)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)
    assert 0.0 < got.item() < 1e-8  # log(1 + e^-20) per entry
    # Cole's an: -log(f + 1e-5) on saturated probabilities is about -log(1 + 1e-5) per entry
    cole = create_loss("an", 2)(logits, Targets(z, torch.tensor([0]))).item()
    assert cole == pytest.approx(-math.log(1 + 1e-5), rel=1e-3)


# ------------------------------------------------------------------------------- the Python API
def test_the_estimator_trains_boostlu_on_spatial_rows_and_predicts_boosted(spatial):
    from featcache.api import SPMLClassifier, load_run

    cache, path = spatial
    data = load_linear_data(cache / "toy" / "labels.h5", path)
    X = data.train.features.numpy()
    Z = data.train.observed.numpy().astype(np.int8)
    clf = SPMLClassifier(loss="ll-r+boostlu", epochs=2, lr=1e-2, spatial_shape=(2, 2, 6)).fit(X, Z)
    assert clf.coef_.shape == (5, 6) and clf.loss_params_ == {"delta_rel": 0.5, "alpha": 5.0}
    head = BoostLUHeads(torch.from_numpy(clf.coef_).t()[None], torch.from_numpy(clf.intercept_)
                        .view(1, 1, -1), positions=4, params={"alpha": [5.0]})
    torch.testing.assert_close(torch.from_numpy(clf.predict_proba(X)),
                               head.scores(torch.from_numpy(X))[0])
    with pytest.raises(LossNeedError, match="spatial_shape=\\(h, w, D\\)"):
        SPMLClassifier(loss="ll-r+boostlu", epochs=1).fit(X, Z)
    with pytest.raises(ValueError, match="spatial_shape \\(2, 2, 5\\) makes 20"):
        SPMLClassifier(loss="ll-r+boostlu", epochs=1, spatial_shape=(2, 2, 5)).fit(X, Z)

    # a stage-two BoostLU run predicts from spatial rows with its boosted head
    result = invoke("train-linear", "--dataset", "toy", "--loss", "ll-r+boostlu", "--run-id", "a",
                    *FAST)
    assert result.exit_code == 0, result.output
    run = load_run(cache / "toy" / "runs" / "ll-r+boostlu" / "a")
    assert run.boostlu_alpha == 5.0 and run.feature_dim == 24
    saved = load_head(run.path)
    expected = BoostLUHeads(saved["weight"].t()[None], saved["bias"].view(1, 1, -1), positions=4,
                            params={"alpha": [5.0]})
    test = data.test.features
    torch.testing.assert_close(torch.from_numpy(run.predict_proba(test.numpy())),
                               expected.scores(test)[0])
    estimator = run.to_estimator()
    assert estimator.spatial_shape == [2, 2, 6]
    np.testing.assert_allclose(estimator.predict_proba(test.numpy()), run.predict_proba(test.numpy()))
    with pytest.raises(InputError, match="takes \\(n, 24\\)"):
        run.predict_proba(test.numpy()[:, :6])


def test_a_spatial_file_named_by_the_backbone_alone_is_found_for_the_same_weights(spatial):
    cache, path = spatial
    root = cache / "toy"
    (root / "features-toy.h5").rename(root / "features-toy-random.h5")  # tag: backbone-weights
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an,ll-r+boostlu",
                    "--run-id", "t", *FAST)
    assert result.exit_code == 0, result.output
    assert load_results(root / "runs" / "ll-r+boostlu" / "t")["features"]["path"] == str(path)
    with h5py.File(path, "a") as h5:
        h5.attrs["weights_sha256"] = "0" * 64  # other weights: not this pooled file's maps
    other = invoke("train-linear", "--dataset", "toy", "--loss", "an,ll-r+boostlu", *FAST)
    assert other.exit_code != 0 and "--spatial" in other.output
