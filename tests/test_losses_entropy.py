"""Zhou et al. EM, EM-APL and EntMin against hand-computed values (PROTOCOL.md s.4)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import batch_mean, cells, entropy, nl, sig, tensor

from featcache.losses import Targets, create_loss

LOGITS = [[1.5, -0.5, 0.2], [-1.0, 2.0, 0.0]]
OBSERVED = [[1, 0, 0], [0, 1, -1]]
B, L = 2, 3


def run(name, params=None, dataset=None, state=None, heads=1, index=(0, 1)):
    loss = create_loss(name, L, heads, params=params, dataset=dataset)
    targets = Targets(tensor(OBSERVED), torch.tensor(index))
    return loss.forward(tensor(LOGITS, heads), targets, state or {}, 0)


def entropy_terms(sign, alpha):
    f = [[sig(x) for x in row] for row in LOGITS]
    terms = []
    for b, i, p in cells(f):
        z = OBSERVED[b][i]
        terms.append(nl(p) if z == 1 else nl(1 - p) if z == -1 else sign * alpha * entropy(p))
    return terms


@pytest.mark.parametrize("params, dataset, alpha", [
    (None, None, 0.1), (None, "voc", 0.2), (None, "cub", 0.01), ({"alpha": 0.5}, "voc", 0.5)])
def test_em_maximises_the_entropy_of_unobserved_labels(params, dataset, alpha):
    value = run("em", params=params, dataset=dataset).item()
    assert value == pytest.approx(batch_mean(entropy_terms(-1, alpha), B, L), rel=1e-9)


def test_entmin_minimises_it():
    value = run("entmin", params={"alpha": 0.3}).item()
    assert value == pytest.approx(batch_mean(entropy_terms(+1, 0.3), B, L), rel=1e-9)


def test_apl_dataset_defaults_are_the_reference_ones():
    expected = {"voc": (0.2, 0.02, 0.9, 5), "coco": (0.1, 0.9, 0.9, 5),
                "nuswide": (0.1, 0.2, 0.9, 4), "cub": (0.01, 0.4, 0.9, 3)}
    for dataset, values in expected.items():
        params = create_loss("em-apl", 3, dataset=dataset).param_values
        assert tuple(params[k][0] for k in ("alpha", "beta", "theta", "warmup")) == values


# ------------------------------------------------------------------------ pseudo-labelling
# N = 5 rows, 2 classes. Class 0 has 4 unobserved rows (1-4), class 1 has 3 (0, 3, 4).
APL_OBSERVED = [[1, 0], [0, 1], [0, 1], [0, 0], [0, 0]]
PROBS_1 = [[0.9, 0.3], [0.2, 0.9], [0.1, 0.8], [0.2, 0.3], [0.5, 0.6]]
PROBS_2 = [[0.9, 0.1], [0.7, 0.9], [0.05, 0.8], [0.4, 0.35], [0.3, 0.2]]


def apl(heads=1, **params):
    base = {"theta": 1.0, "warmup": 1, "alpha": 0.1, "beta": 0.5}
    base.update(params)
    loss = create_loss("em-apl", 2, heads, params=base)
    return loss, loss.init_state(torch.tensor(APL_OBSERVED, dtype=torch.float32))


def probs_of(rows, heads=1):
    return lambda: torch.tensor(rows, dtype=torch.float32).unsqueeze(0).repeat(heads, 1, 1)


def pseudo_entries(state, head=0):
    p = state["pseudo"][head]
    return {(n, c): round(p[n, c].item(), 6) for n in range(p.shape[0]) for c in range(2)
            if not math.isnan(p[n, c].item())}


def test_apl_selects_int_theta_u_over_remaining_epochs_lowest_with_stable_ties():
    loss, state = apl()
    # U = (4, 3); T = 3, warmup 1: counts int(1.0 * 4 / 2) = 2 and int(3 / 2) = 1.
    log = loss.end_epoch(0, 3, probs_of(PROBS_1), state)
    # class 0 scores rows 1-4: 0.2, 0.1, 0.2, 0.5 -> row 2, then row 1 (tie with row 3: lower row)
    # class 1 scores rows 0, 3, 4: 0.3, 0.3, 0.6 -> row 0 (tie with row 3)
    assert pseudo_entries(state) == {(2, 0): 0.1, (1, 0): 0.2, (0, 1): 0.3}
    assert log["pseudo_labels_added"] == [3]
    # Second round: only entries not yet pseudo-labelled; old soft targets stay as they were.
    loss.end_epoch(1, 3, probs_of(PROBS_2), state)
    assert pseudo_entries(state) == {(2, 0): 0.1, (1, 0): 0.2, (0, 1): 0.3,
                                     (3, 0): 0.4, (4, 0): 0.3, (4, 1): 0.2}


def test_apl_waits_for_warmup_and_is_a_no_op_when_no_epoch_is_left():
    loss, state = apl(warmup=2)
    loss.end_epoch(0, 3, probs_of(PROBS_1), state)  # epoch 1 (1-based) < warmup 2
    assert pseudo_entries(state) == {}
    loss.end_epoch(1, 3, probs_of(PROBS_1), state)  # int(4 / 1) = 4 and int(3 / 1) = 3: all
    assert len(pseudo_entries(state)) == 7
    loss, state = apl(warmup=3)
    loss.end_epoch(2, 3, probs_of(PROBS_1), state)  # T - warmup = 0
    assert pseudo_entries(state) == {}


def test_apl_loss_uses_beta_soft_targets_for_pseudo_labelled_entries():
    loss, state = apl()
    loss.end_epoch(0, 3, probs_of(PROBS_1), state)
    logits = [[0.3, -0.2], [1.1, 0.4], [-0.6, 0.9]]  # rows 0, 1, 2
    targets = Targets(tensor([APL_OBSERVED[n] for n in range(3)]), torch.tensor([0, 1, 2]))
    value = loss.forward(tensor(logits, 1), targets, state, 1).item()
    soft = {(0, 1): 0.3, (1, 0): 0.2, (2, 0): 0.1}
    terms = []
    for n, c, g in cells(logits):
        f = sig(g)
        if APL_OBSERVED[n][c] == 1:
            terms.append(nl(f))
        elif (n, c) in soft:
            s = torch.tensor(soft[(n, c)], dtype=torch.float32).item()  # stored as float32
            terms.append(0.5 * (s * nl(f) + (1 - s) * nl(1 - f)))
        else:
            terms.append(-0.1 * entropy(f))
    assert value == pytest.approx(batch_mean(terms, 3, 2), rel=1e-6)


def test_apl_per_head_warmup_acts_per_head():
    loss, state = apl(heads=2, warmup=[1, 2])
    loss.end_epoch(0, 3, probs_of(PROBS_1, heads=2), state)
    assert len(pseudo_entries(state, 0)) == 3
    assert pseudo_entries(state, 1) == {}
