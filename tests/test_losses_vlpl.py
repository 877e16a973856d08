"""VLPL's pseudo-label loss (EM_PL, mvrl/VLPL losses.py) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import batch_mean, entropy, nl, tensor

from featcache.errors import LossStateError
from featcache.losses import Targets, create_loss, loss_class

# Probabilities given as logits ln(p / (1 - p)); VOC's alpha 0.2, beta 0.7 (research note B1.5)
PROBS = [[0.8, 0.6, 0.1], [0.2, 0.3, 0.75]]
LOGITS = [[math.log(p / (1 - p)) for p in row] for row in PROBS]
OBSERVED = [[1, 0, 0], [0, 0, 1]]
PSEUDO = [[1, 1, 0], [0, 1, 1]]  # (from VLPL's rule on the same example: q > 0.3)
B, L = 2, 3


def run(pseudo=PSEUDO, observed=OBSERVED, params=None, dataset="voc", epoch=0, heads=1):
    loss = create_loss("vlpl", L, heads, params=params, dataset=dataset)
    targets = Targets(tensor(observed), torch.tensor([0, 1]), pseudo=tensor(pseudo))
    return loss.forward(tensor(LOGITS, heads), targets, {}, epoch)


def test_the_worked_example_by_hand():
    alpha, beta = 0.2, 0.7
    terms = [
        nl(0.8),                                   # observed positive: -ln(0.8 + 1e-5)
        beta * (0.9 * nl(0.6) + 0.1 * nl(0.4)),   # pseudo-positive, smoothed to 0.9
        -alpha * entropy(0.1),                    # unknown: EM, -alpha H(f)
        -alpha * entropy(0.2),                    # unknown
        beta * (0.9 * nl(0.3) + 0.1 * nl(0.7)),   # pseudo-positive
        nl(0.75),                                 # observed positive (its pseudo-label ignored)
    ]
    expected = batch_mean(terms, B, L)
    assert expected == pytest.approx(0.2525178448, abs=1e-9)
    assert run().item() == pytest.approx(expected, abs=1e-12)
    # one entry spelled out: 0.7 (0.9 (-ln 0.30001) + 0.1 (-ln 0.70001))
    #                      = 0.7 (0.9 * 1.2039394 + 0.1 * 0.3566606) = 0.7834481
    assert terms[4] == pytest.approx(0.7 * (0.9 * 1.2039394 + 0.1 * 0.3566606), abs=1e-6)


def test_without_pseudo_positives_it_is_em():
    zeros = [[0, 0, 0], [0, 0, 0]]
    em = create_loss("em", L, dataset="voc")
    expected = em.forward(tensor(LOGITS, 1), Targets(tensor(OBSERVED), torch.tensor([0, 1])), {}, 0)
    assert run(pseudo=zeros).item() == pytest.approx(expected.item(), abs=1e-12)
    assert expected.item() == pytest.approx(0.0148239195, abs=1e-9)


def test_warmup_epochs_are_plain_em():
    em_value = run(pseudo=[[0, 0, 0], [0, 0, 0]]).item()
    assert run(params={"warmup": 1}, epoch=0).item() == pytest.approx(em_value, abs=1e-12)
    assert run(params={"warmup": 1}, epoch=1).item() == pytest.approx(run().item(), abs=1e-12)


def test_pseudo_negatives_get_no_loss_and_observed_negatives_are_negatives():
    with_negative = [[1, 1, -1], [0, 1, 1]]  # row 0, class 2 (p = 0.1) a pseudo-negative
    terms = [nl(0.8), 0.7 * (0.9 * nl(0.6) + 0.1 * nl(0.4)), 0.0,
             -0.2 * entropy(0.2), 0.7 * (0.9 * nl(0.3) + 0.1 * nl(0.7)), nl(0.75)]
    assert run(pseudo=with_negative).item() == pytest.approx(batch_mean(terms, B, L), abs=1e-12)
    negative = [[1, 0, -1], [0, 0, 1]]  # observed negative (--num-neg): neglog(1 - f)
    terms[2] = nl(0.9)
    assert run(observed=negative, pseudo=with_negative).item() == pytest.approx(
        batch_mean(terms, B, L), abs=1e-12)


def test_heads_with_different_parameters_are_independent():
    stacked = run(params={"beta": [0.7, 1.0], "smoothing": [0.9, 1.0]}, heads=2)
    first = run(params={"beta": 0.7, "smoothing": 0.9})
    second = run(params={"beta": 1.0, "smoothing": 1.0})
    torch.testing.assert_close(stacked, torch.cat([first, second]))


def test_defaults_and_needs():
    for dataset, alpha in {"voc": 0.2, "coco": 0.1, "nuswide": 0.1, "cub": 0.01}.items():
        params = create_loss("vlpl", 3, dataset=dataset).param_values
        assert (params["alpha"][0], params["beta"][0], params["smoothing"][0]) == (alpha, 0.7, 0.9)
    assert [need.key for need in loss_class("vlpl").needs] == ["pseudo_labels"]
    loss = create_loss("vlpl", L)
    with pytest.raises(LossStateError, match="trains on pseudo-labels"):
        loss(tensor(LOGITS), Targets(tensor(OBSERVED), torch.tensor([0, 1])))


def test_heads_with_different_warmups():
    stacked = run(params={"warmup": [0, 1]}, heads=2, epoch=0)
    torch.testing.assert_close(stacked, torch.cat([run(), run(pseudo=[[0, 0, 0], [0, 0, 0]])]))
