"""The GR loss (Chen et al. 2024) against values computed by hand from its definition and the
authors' code's conventions (yan4xi1/GRLoss @ 5e13f7f: losses.py, models.py, train.py)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import tensor

from featcache.errors import LossStateError
from featcache.losses import Targets, create_loss
from featcache.losses.gr import gr_schedule, schedule_steps

# One image, L = 3: z = [1, 0, 0] and p = [0.8, 0.3, 0.6]; T = 8 epochs, the code's defaults
# beta = [w0, wT, b0, bT] = [0, 2, -2, -2], alpha = [mu0, sigma0, muT, sigmaT] = [0.5, 2, 0.8, 0.5],
# q2 = 0.01, q3 = 1.
PROBS = [0.8, 0.3, 0.6]


def logits(probs=PROBS, heads=1):
    return tensor([[math.log(p / (1 - p)) for p in probs]], heads)


def gr(params=None, num_epochs=8, heads=1):
    loss = create_loss("gr", 3, num_heads=heads, params=params)
    loss.begin_epoch(0, num_epochs, {})
    return loss


def value(loss, observed, epoch, probs=PROBS, heads=1):
    targets = Targets(tensor([observed]), torch.tensor([0]))
    return loss.forward(logits(probs, heads), targets, {}, epoch)


def test_schedule_follows_the_code_offset_between_the_pairs():
    # train.py: w = w0 + (wT - w0) max(epoch - n - 1, 0) / (T - n), mu = mu0 + (muT - mu0)
    # max(epoch - n, 0) / (T - n), epoch 1-based, n = linear_init = 0. 0-based e: w moves e/T,
    # mu moves (e + 1)/T.
    values = {k: [v] for k, v in {"w_start": 0.0, "w_end": 10.0, "b_start": -2.0, "b_end": -8.0,
                                  "mu_start": 0.5, "mu_end": 0.8, "sigma_start": 2.0,
                                  "sigma_end": 0.5}.items()}
    like = torch.zeros(1)
    expected = {  # e: (w, b, mu, sigma), the research note's table for T = 8
        0: (0.0, -2.0, 0.5375, 1.8125), 1: (1.25, -2.75, 0.575, 1.625),
        4: (5.0, -5.0, 0.6875, 1.0625), 7: (8.75, -7.25, 0.8, 0.5),
    }
    for epoch, (w, b, mu, sigma) in expected.items():
        s = gr_schedule(values, epoch, 8, like)
        assert (s.w, s.b, s.mu, s.sigma) == pytest.approx((w, b, mu, sigma), abs=1e-12)
    # w and b never reach their end values; mu and sigma reach theirs in the last epoch
    assert schedule_steps(7, 8, lead=0) == 7 and schedule_steps(7, 8, lead=1) == 8
    # a schedule shorter than the run holds its end values
    assert schedule_steps(11, 8, lead=0) == 8


def test_first_epoch_matches_the_hand_computed_loss():
    # e = 0: w = 0, b = -2, mu = 0.5 + 0.3/8 = 0.5375, sigma = 2 - 1.5/8 = 1.8125.
    k = 1 / (1 + math.exp(2.0))  # sigmoid(0 * p - 2) = 0.1192029, for every p
    positive = -math.log(0.8 + 1e-7)  # 0.2231434 (the code's 1e-7 guard)

    def unobserved(p, mu, sigma, k):
        v = math.exp(-0.5 * ((p - mu) / sigma) ** 2)
        l2 = (1 - p**0.01) / 0.01  # GCE towards positive, q2 = 0.01
        l3 = (1 - (1 - p) ** 1) / 1  # GCE towards negative, q3 = 1: p
        return v * (k * l2 + (1 - k) * l3)

    first = unobserved(0.3, 0.5375, 1.8125, k)  # 0.9914517 * 0.4068957 = 0.4034174
    second = unobserved(0.6, 0.5375, 1.8125, k)  # 0.9994056 * 0.5892149 = 0.5888647
    assert first == pytest.approx(0.4034174, abs=1e-7)
    assert second == pytest.approx(0.5888647, abs=1e-7)
    want = (positive + first + second) / 3  # mean over B * L = 3 entries: 0.4051419
    assert value(gr(), [1, 0, 0], 0).item() == pytest.approx(want, abs=1e-12)
    assert want == pytest.approx(0.4051419, abs=1e-7)
    # Cole's 1e-5 guard would give 0.4051377: the test tells the two epsilons apart
    assert abs(want - (-math.log(0.8 + 1e-5) + first + second) / 3) > 4e-6


def test_last_epoch_matches_the_hand_computed_loss():
    # e = 7 of 8: w = 2 * 7/8 = 1.75, b = -2, mu = 0.8, sigma = 0.5
    def unobserved(p):
        k = 1 / (1 + math.exp(-(1.75 * p - 2.0)))
        v = math.exp(-0.5 * ((p - 0.8) / 0.5) ** 2)
        return v * (k * (1 - p**0.01) / 0.01 + (1 - k) * p)

    # p = 0.3: K = sigmoid(-1.475) = 0.1861838, V = exp(-0.5) -> 0.2832262
    # p = 0.6: K = sigmoid(-0.95) = 0.2788848, V = exp(-0.08) -> 0.5305772
    assert unobserved(0.3) == pytest.approx(0.2832262, abs=1e-7)
    assert unobserved(0.6) == pytest.approx(0.5305772, abs=1e-7)
    want = (-math.log(0.8 + 1e-7) + unobserved(0.3) + unobserved(0.6)) / 3  # 0.3456489
    assert value(gr(), [1, 0, 0], 7).item() == pytest.approx(want, abs=1e-12)


def test_observed_negatives_cost_nothing_but_count_in_the_mean():
    # z = [1, 0, -1]: the matrix is [0.2231434, 0.4034174, 0] / 3 = 0.2088536
    assert value(gr(), [1, 0, -1], 0).item() == pytest.approx(
        (-math.log(0.8 + 1e-7) + 0.4034174) / 3, abs=1e-7)


def test_gradient_flows_through_the_gce_terms_only():
    # d loss / d g for an unobserved entry: V [K (-p^(q2 - 1)) + (1 - K) q3 (1-p)^(q3-1)] p (1 - p)
    # / 3, K and V held fixed (the code computes them from preds.detach()).
    g = logits().requires_grad_(True)
    loss = gr()
    loss.forward(g, Targets(tensor([[1, 0, 0]]), torch.tensor([0])), {}, 0).sum().backward()
    k = 1 / (1 + math.exp(2.0))
    for i, p in ((1, 0.3), (2, 0.6)):
        v = math.exp(-0.5 * ((p - 0.5375) / 1.8125) ** 2)
        d_p = v * (k * -(p ** (0.01 - 1)) + (1 - k) * 1.0)
        assert g.grad[0, 0, i].item() == pytest.approx(d_p * p * (1 - p) / 3, abs=1e-10)
    # the positive: d/dg -log(p + 1e-7) = -p (1 - p) / (p + 1e-7), / 3
    assert g.grad[0, 0, 0].item() == pytest.approx(-0.8 * 0.2 / (0.8 + 1e-7) / 3, abs=1e-10)


def test_extreme_logits_give_finite_gradients():
    g = tensor([[[-120.0, 0.0, 95.0]]]).float().requires_grad_(True)
    loss = gr()
    out = loss.forward(g, Targets(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([0])), {}, 3)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(g.grad).all()


def test_schedule_length_comes_from_the_run_or_the_parameter():
    loss = create_loss("gr", 3)
    with pytest.raises(LossStateError, match="begin_epoch"):
        loss.forward(logits(), Targets(tensor([[1, 0, 0]]), torch.tensor([0])), {}, 0)
    # schedule_epochs = 8 with a 25-epoch run: the same loss as T = 8 in the first epochs, the
    # end values held after epoch 8
    fixed = gr({"schedule_epochs": 8}, num_epochs=25)
    assert value(fixed, [1, 0, 0], 0).item() == pytest.approx(value(gr(), [1, 0, 0], 0).item())
    assert value(fixed, [1, 0, 0], 20).item() == pytest.approx(
        value(gr({"w_start": 2.0, "mu_start": 0.8, "sigma_start": 0.5}), [1, 0, 0], 3).item())


def test_heads_with_different_schedules_match_single_runs():
    stacked = gr({"schedule_epochs": [0, 4], "w_end": [2.0, 10.0], "b_end": [-2.0, -8.0]},
                 num_epochs=8, heads=2)
    for epoch in (0, 3, 6):
        both = value(stacked, [1, 0, 0], epoch, heads=2)
        first = value(gr({"w_end": 2.0}), [1, 0, 0], epoch)
        second = value(gr({"schedule_epochs": 4, "w_end": 10.0, "b_end": -8.0}), [1, 0, 0], epoch)
        torch.testing.assert_close(both, torch.cat([first, second]))


@pytest.mark.parametrize("params, shown", [
    ({"sigma_end": 0.0}, r"sigma_end=0 is out of range: sigma_end takes \(0, inf\)"),
    ({"mu_start": 1.5}, r"mu_start=1.5 is out of range: mu_start takes \[0, 1\]"),
    ({"q2": -0.1}, r"q2=-0.1 is out of range"),
    ({"schedule_epochs": 2.5}, r"schedule_epochs=2.5 is out of range: schedule_epochs takes whole"),
])
def test_out_of_range_parameters_are_refused(params, shown):
    from featcache.errors import OptionError

    with pytest.raises(OptionError, match=shown):
        create_loss("gr", 3, params=params)


def test_published_end_to_end_numbers():
    from featcache.published import published, published_k_interval

    assert [published("finetune", "gr", d) for d in ("voc", "coco", "nuswide", "cub")] == [
        89.83, 73.17, 49.08, 21.64]
    assert published("finetune", "ll-r+boostlu", "coco") == 72.89
    assert published_k_interval("coco", 5) == (1.8, 4.4) and published_k_interval("scene", 5) is None
