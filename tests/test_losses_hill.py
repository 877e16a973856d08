"""Hill and SPLC (Zhang et al.) against values computed by hand from their definitions and the
authors' code's conventions (xinyu1205/robust-loss-mlml @ dcfa4d5, src/loss_functions/losses.py)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import sig, tensor

from featcache.losses import Targets, create_loss

# One image, L = 3: logits g = [2.0, -1.0, 0.5], targets [1, 0, 0]
LOGITS = [2.0, -1.0, 0.5]


def log_sig(x: float) -> float:
    return math.log(sig(x))


def run(name, observed=(1, 0, 0), epoch=0, params=None, heads=1, logits=LOGITS):
    loss = create_loss(name, 3, num_heads=heads, params=params)
    targets = Targets(tensor([list(observed)]), torch.tensor([0]))
    return loss.forward(tensor([logits], heads), targets, {}, epoch)


def hill_terms(lam=1.5, margin=1.0, gamma=2.0):
    # class 1 (positive): p_m = sigmoid(2 - 1) = 0.7310586, (1 - p_m)^2 = 0.0723295,
    #   -log p_m = 0.3132617 -> 0.0226581
    pm = sig(LOGITS[0] - margin)
    positive = -((1 - pm) ** gamma) * math.log(pm)
    # classes 2, 3 (targets 0): (lam - p) p^2 with p = sigmoid(g), no margin, no focal weight
    # p = 0.2689414: 1.2310586 * 0.0723295 = 0.0890418; p = 0.6224593: 0.8775407 * 0.3874556 = 0.3400081
    negatives = [(lam - sig(g)) * sig(g) ** 2 for g in LOGITS[1:]]
    return [positive, *negatives]


def test_hill_sums_the_matrix_by_default():
    terms = hill_terms()
    assert terms == pytest.approx([0.0226581, 0.0890418, 0.3400081], abs=1e-7)
    assert run("hill").item() == pytest.approx(sum(terms), abs=1e-12)  # 0.4517080
    assert run("hill", params={"sum": 0}).item() == pytest.approx(sum(terms) / 3, abs=1e-12)


def test_hill_parameters():
    terms = hill_terms(lam=2.0, margin=0.5, gamma=1.0)
    assert run("hill", params={"lam": 2.0, "margin": 0.5, "gamma": 1.0}).item() == pytest.approx(
        sum(terms), abs=1e-12)


def test_hill_with_the_gr_repository_settings():
    # GRLoss's hill_loss: -log(p + 1e-7) on positives, (1.5 - p) p^2, mean over B * L: 0.1853259.
    # margin = 0, gamma = 0, sum = 0 gives it up to the 1e-7 guard (-log p here).
    want = (-math.log(sig(2.0)) + 0.0890418 + 0.3400081) / 3
    assert run("hill", params={"margin": 0, "gamma": 0, "sum": 0}).item() == pytest.approx(
        want, abs=1e-7)
    assert want == pytest.approx(0.1853259, abs=1e-6)


def test_hill_treats_observed_negatives_as_targets_zero():
    assert run("hill", observed=(1, -1, 0)).item() == pytest.approx(run("hill").item())


def test_hill_gradient_flows_through_the_focal_weight():
    # d/dg of -(1 - s)^2 log s with s = sigmoid(g - m): 2 (1 - s)^2 s log s - (1 - s)^3
    g = tensor([LOGITS], 1).requires_grad_(True)
    create_loss("hill", 3).forward(g, Targets(tensor([[1, 0, 0]]), torch.tensor([0])), {}, 0).backward()
    s = sig(1.0)
    assert g.grad[0, 0, 0].item() == pytest.approx(2 * (1 - s) ** 2 * s * math.log(s) - (1 - s) ** 3,
                                                   abs=1e-12)
    # negatives: d/dg (1.5 - p) p^2 = (3 p - 3 p^2) p (1 - p)
    p = sig(-1.0)
    assert g.grad[0, 0, 1].item() == pytest.approx((3 * p - 3 * p**2) * p * (1 - p), abs=1e-12)


def splc_terms(epoch, tau=0.6, change_epoch=1):
    # class 1: logit 2 - m = 1, p = 0.7310586: (1 - p)^2 (-log sigmoid(1)) = 0.0226581
    first = (1 - sig(1.0)) ** 2 * -log_sig(1.0)
    terms = [first]
    for g in LOGITS[1:]:
        p = sig(g)
        if epoch >= change_epoch and p > tau:  # corrected: target 1, logit unshifted
            terms.append((1 - p) ** 2 * -log_sig(g))
        else:  # focal BCE towards 0: p^2 (-log sigmoid(-g))
            terms.append(p**2 * -log_sig(-g))
    return terms


def test_splc_before_the_change_epoch_is_focal_margin():
    # classes 2, 3: 0.0723295 * 0.3132617 = 0.0226581; 0.3874556 * 0.9740769 = 0.3774116
    terms = splc_terms(0)
    assert terms == pytest.approx([0.0226581, 0.0226581, 0.3774116], abs=1e-7)
    assert run("splc", epoch=0).item() == pytest.approx(sum(terms), abs=1e-12)  # 0.4227277


def test_splc_corrects_confident_unobserved_labels_from_the_change_epoch():
    # epoch 1: class 3 has p = 0.6225 > 0.6 -> target 1: 0.1425370 * 0.4740770 = 0.0675735
    terms = splc_terms(1)
    assert terms[2] == pytest.approx(0.0675735, abs=1e-7)
    assert run("splc", epoch=1).item() == pytest.approx(sum(terms), abs=1e-12)  # 0.1128896
    assert sum(terms) == pytest.approx(0.1128896, abs=1e-7)
    # tau = 0.65: nothing is above it; change_epoch = 3: nothing corrected at epoch 2
    assert run("splc", epoch=1, params={"tau": 0.65}).item() == pytest.approx(sum(splc_terms(0)))
    assert run("splc", epoch=2, params={"change_epoch": 3}).item() == pytest.approx(
        sum(splc_terms(0)))
    # strict: p exactly tau is not corrected
    assert run("splc", epoch=1, params={"tau": sig(0.5)}).item() == pytest.approx(sum(splc_terms(0)))


def test_splc_never_corrects_observed_negatives():
    # z = -1 on class 3 (p = 0.6225 > tau): stays a target 0 (focal BCE towards 0)
    assert run("splc", observed=(1, 0, -1), epoch=1).item() == pytest.approx(sum(splc_terms(0)))


def test_splc_heads_with_different_change_epochs_and_reductions():
    both = run("splc", epoch=1, heads=2, params={"change_epoch": [1, 2], "sum": [1, 0]})
    assert both.tolist() == pytest.approx([sum(splc_terms(1)), sum(splc_terms(0)) / 3])
