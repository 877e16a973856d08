"""AEVLP's GPR loss (Fsoft-AIC/AEVLP losses.py GPR_loss, on the GR loss's K, V and schedule)
against values computed by hand from its definition (the research note's worked example)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import tensor

from featcache.errors import LossStateError, OptionError
from featcache.losses import Targets, create_loss, loss_class

# COCO's settings: beta [0, 10, -2, -8], alpha [0.5, 2, 0.8, 0.5], q2 0.01, q3 1,
# lambda (0.7, 0.5), rho 0.9, reg 0.001, k 2.9; T = 8 epochs. B = 2, L = 4.
PROBS = [[0.9, 0.6, 0.3, 0.05], [0.1, 0.02, 0.8, 0.2]]
OBSERVED = [[1, 0, 0, 0], [0, 0, 1, 0]]
PSEUDO = [[1, 1, 0, 0], [1, 1, 0, 0]]  # row 1 class 1, row 2 classes 0 and 1 pseudo-positive
K_POS = 2.9


def nl7(x: float) -> float:
    """The code's neg_log: -log(x + 1e-7)."""
    return -math.log(x + 1e-7)


def schedule(e_ref: int, T: int = 8):
    """train.py (n = linear_init = 0): w, b move (e_ref - 1)/T, mu, sigma e_ref/T."""
    w = 0 + (10 - 0) * max(e_ref - 1, 0) / T
    b = -2 + (-8 + 2) * max(e_ref - 1, 0) / T
    mu = 0.5 + (0.8 - 0.5) * e_ref / T
    sigma = 2 + (0.5 - 2) * e_ref / T
    return w, b, mu, sigma


def by_hand(e_ref: int, pseudo=PSEUDO) -> float:
    w, b, mu, sigma = schedule(e_ref)
    total = 0.0
    for n, row in enumerate(PROBS):
        for c, p in enumerate(row):
            z, pi = OBSERVED[n][c], pseudo[n][c]
            final = pi if z == 0 else z
            K = 1 / (1 + math.exp(-(w * p + b)))
            V = math.exp(-0.5 * ((p - mu) / sigma) ** 2)
            if z == 1:
                total += nl7(p)
            elif final == 0:  # GR: V [K (1 - p^q2)/q2 + (1 - K) (1 - (1-p)^q3)/q3]
                total += V * (K * (1 - p ** 0.01) / 0.01 + (1 - K) * p)
            elif final == 1:  # window: 1 - clamp(V, 1 - 0.7, 1 - 0.5) in [0.5, 0.7]
                weight = 1 - min(max(V, 0.3), 0.5)
                total += weight * (0.9 * nl7(p) + 0.1 * nl7(1 - p))
            else:  # -1: V (-log(1 - p))
                total += V * nl7(1 - p)
    mean_positives = sum(sum(row) for row in PROBS) / 2  # (1.85 + 1.12) / 2 = 1.485
    return total / 8 + 0.001 * (mean_positives - K_POS) ** 2 / 16


def run(epoch, pseudo=PSEUDO, params=None, heads=1, grad=False):
    loss = create_loss("gpr", 4, heads, dataset="coco", params={"k": K_POS, **(params or {})})
    loss.begin_epoch(epoch, 8, {})
    logits = tensor([[math.log(p / (1 - p)) for p in row] for row in PROBS], heads)
    logits.requires_grad_(grad)
    targets = Targets(tensor(OBSERVED), torch.arange(2), pseudo=tensor(pseudo))
    return loss.forward(logits, targets, {}, epoch), logits


def test_first_and_last_epoch_by_hand():
    # e_ref 1: (w, b, mu, sigma) = (0, -2, 0.5375, 1.8125); e_ref 8: (8.75, -7.25, 0.8, 0.5)
    assert schedule(1) == pytest.approx((0.0, -2.0, 0.5375, 1.8125))
    assert schedule(8) == pytest.approx((8.75, -7.25, 0.8, 0.5))
    assert by_hand(1) == pytest.approx(0.5691767615, abs=1e-9)
    assert by_hand(8) == pytest.approx(0.5846176932, abs=1e-9)
    assert run(0)[0].item() == pytest.approx(by_hand(1), abs=1e-12)  # featcache e = e_ref - 1
    assert run(7)[0].item() == pytest.approx(by_hand(8), abs=1e-12)
    # one entry: row 1 class 2 at e_ref 1, K = sigmoid(-2) = 0.119203,
    # V = exp(-((0.3 - 0.5375)/1.8125)^2 / 2) = 0.991452: 0.991452 (0.119203 * 1.196755 + 0.880797 * 0.3)
    assert 0.991452 * (0.119203 * 1.196755 + 0.880797 * 0.3) == pytest.approx(0.403417, abs=1e-6)


def test_the_weight_window_at_the_last_epoch():
    # V at e_ref 8 (mu 0.8, sigma 0.5): [1,1] p = 0.6 -> 0.923 (clamped to 0.5: weight 0.5),
    # [2,0] p = 0.1 -> 0.375311 (inside: weight 0.624689), [2,1] p = 0.02 -> 0.296 (clamped
    # to 0.3: weight 0.7)
    v = [math.exp(-0.5 * ((p - 0.8) / 0.5) ** 2) for p in (0.6, 0.1, 0.02)]
    assert [1 - min(max(x, 0.3), 0.5) for x in v] == pytest.approx([0.5, 0.624689, 0.7], abs=1e-6)


def test_pseudo_negatives_and_the_gradient():
    with_negative = [[1, 1, 0, 0], [1, 1, 0, -1]]
    assert by_hand(8, with_negative) == pytest.approx(0.5856799845, abs=1e-9)
    assert run(7, with_negative)[0].item() == pytest.approx(by_hand(8, with_negative), abs=1e-12)
    value, logits = run(7, grad=True)
    value.sum().backward()
    # K and V are held fixed (computed from detached predictions), as the code does
    expected = [[-0.01250796, -0.01877122, 0.01523921, 0.00188020],
                [-0.06247679, -0.07700135, -0.02501415, 0.00948632]]
    torch.testing.assert_close(logits.grad[0], tensor(expected), atol=1e-8, rtol=0)


def test_observed_negatives_are_weighted_negatives():
    # --num-neg: final label -1 -> V (-log(1 - p)), as the code's final_labels == -1 branch
    loss = create_loss("gpr", 4, dataset="coco", params={"k": K_POS})
    loss.begin_epoch(0, 8, {})
    g = tensor([[math.log(p / (1 - p)) for p in row] for row in PROBS], 1)
    observed = [[1, 0, 0, -1], [0, 0, 1, 0]]
    got = loss.forward(g, Targets(tensor(observed), torch.arange(2), pseudo=tensor(PSEUDO)), {}, 0)
    base = run(0)[0].item()
    w, b, mu, sigma = schedule(1)
    p = 0.05
    v = math.exp(-0.5 * ((p - mu) / sigma) ** 2)
    k = 1 / (1 + math.exp(-(w * p + b)))
    unknown = v * (k * (1 - p ** 0.01) / 0.01 + (1 - k) * p)
    assert got.item() == pytest.approx(base + (v * nl7(1 - p) - unknown) / 8, abs=1e-12)


def test_dataset_defaults_stacked_heads_and_refusals():
    expected = {"voc": (2.0, -2.0, 1.0, 0.7, 0.4, 0.05), "coco": (10.0, -8.0, 1.0, 0.7, 0.5, 0.001),
                "nuswide": (10.0, -8.0, 1.0, 0.7, 0.5, 0.001), "cub": (10.0, -8.0, 1.5, 0.8, 0.2, 0.01)}
    for dataset, values in expected.items():
        params = create_loss("gpr", 3, dataset=dataset, params={"k": 1.0}).param_values
        keys = ("w_end", "b_end", "q3", "lambda1", "lambda2", "reg")
        assert tuple(params[key][0] for key in keys) == values
        assert (params["rho"][0], params["q2"][0], params["mu_end"][0]) == (0.9, 0.01, 0.8)
    stacked = run(3, params={"rho": [0.9, 1.0]}, heads=2)[0]
    torch.testing.assert_close(stacked, torch.cat([run(3)[0], run(3, params={"rho": 1.0})[0]]))
    with pytest.raises(OptionError, match="lambda2=0.8 > lambda1=0.6"):
        create_loss("gpr", 3, params={"k": 1.0, "lambda1": 0.6, "lambda2": 0.8})
    assert [need.key for need in loss_class("gpr").needs] == ["pseudo_labels"]
    loss = create_loss("gpr", 4, params={"k": 1.0})
    loss.begin_epoch(0, 8, {})
    with pytest.raises(LossStateError, match="trains on pseudo-labels"):
        loss(tensor(PROBS), Targets(tensor(OBSERVED), torch.arange(2)))
