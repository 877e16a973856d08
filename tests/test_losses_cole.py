"""Cole et al. losses against values computed by hand from their definitions (PROTOCOL.md s.3)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_math import batch_mean, cells, logit, nl, sig, tensor

from featcache.errors import InputError
from featcache.losses import SPMLLoss, Targets, create_loss, loss_class, loss_names
from featcache.losses.terms import unit_gradient

LOGITS = [[0.5, -1.0, 2.0], [-0.3, 0.8, 0.0]]
CLEAN = [[1, 0, 1], [0, 1, 0]]
OBSERVED = [[1, 0, 0], [0, 1, 0]]
OBSERVED_NEG = [[1, -1, 0], [-1, 1, 0]]
B, L = 2, 3


def run(name, observed=OBSERVED, clean=CLEAN, logits=LOGITS, params=None, state=None, heads=1):
    loss = create_loss(name, L, heads, params=params)
    targets = Targets(tensor(observed), torch.arange(len(observed)),
                      None if clean is None else tensor(clean))
    return loss.forward(tensor(logits, heads), targets, state or {}, 0)


def probs():
    return [[sig(x) for x in row] for row in LOGITS]


def test_bce_uses_the_full_labels():
    f = probs()
    terms = [nl(f[b][i]) if CLEAN[b][i] else nl(1 - f[b][i]) for b, i, _ in cells(f)]
    assert run("bce").item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


@pytest.mark.parametrize("eps", [0.1, 0.25])
def test_bce_ls_smooths_with_one_minus_eps_and_eps(eps):
    f = probs()
    terms = []
    for b, i, p in cells(f):
        if CLEAN[b][i]:
            terms.append((1 - eps) * nl(p) + eps * nl(1 - p))
        else:
            terms.append((1 - eps) * nl(1 - p) + eps * nl(p))
    params = None if eps == 0.1 else {"eps": eps}
    assert run("bce-ls", params=params).item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


@pytest.mark.parametrize("name", ["bce", "bce-ls", "iun"])
def test_full_label_losses_refuse_data_without_clean_labels(name):
    with pytest.raises(InputError, match="clean"):
        run(name, clean=None)


def test_iun_adds_every_true_negative_but_not_the_hidden_positive():
    f = probs()
    # z=1: (0,0) and (1,1); true negatives: (0,1), (1,0), (1,2); (0,2) is a hidden positive.
    terms = [nl(f[0][0]), nl(f[1][1]), nl(1 - f[0][1]), nl(1 - f[1][0]), nl(1 - f[1][2])]
    assert run("iun").item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


def test_iu_uses_observed_negatives_only():
    f = probs()
    terms = [nl(f[0][0]), nl(f[1][1]), nl(1 - f[0][1]), nl(1 - f[1][0])]
    assert run("iu", observed=OBSERVED_NEG).item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


def test_an_takes_every_unobserved_label_as_negative():
    f = probs()
    terms = [nl(p) if OBSERVED[b][i] == 1 else nl(1 - p) for b, i, p in cells(f)]
    assert run("an").item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


@pytest.mark.parametrize("name, eps_pos, eps_neg, params", [
    ("an-ls", 0.1, 0.1, None),
    ("an-ls", 0.0, 0.1, {"eps_pos": 0.0}),
    ("an-ls", 0.2, 0.05, {"eps_pos": 0.2, "eps_neg": 0.05}),
    ("n-ls", 0.0, 0.1, None),
])
def test_an_ls_smooths_positives_and_assumed_negatives_separately(name, eps_pos, eps_neg, params):
    f = probs()
    terms = []
    for b, i, p in cells(f):
        if OBSERVED[b][i] == 1:
            terms.append((1 - eps_pos) * nl(p) + eps_pos * nl(1 - p))
        else:
            terms.append((1 - eps_neg) * nl(1 - p) + eps_neg * nl(p))
    assert run(name, params=params).item() == pytest.approx(batch_mean(terms, B, L), rel=1e-7)


def test_wan_weights_assumed_negatives_by_one_over_l_minus_one():
    f = probs()
    terms = [nl(p) if OBSERVED[b][i] == 1 else nl(1 - p) / (L - 1) for b, i, p in cells(f)]
    assert run("wan").item() == pytest.approx(batch_mean(terms, B, L), rel=1e-9)


@pytest.mark.parametrize("k", [1.5, 0.25])
def test_epr_adds_the_expected_positive_regularizer_undivided(k):
    f = probs()
    terms = [nl(f[0][0]), nl(f[1][1])]
    mean_positives = (sum(f[0]) + sum(f[1])) / B
    regularizer = (mean_positives - k) ** 2 / L**2
    expected = batch_mean(terms, B, L) + regularizer
    assert run("epr", params={"k": k}).item() == pytest.approx(expected, rel=1e-9)


def test_epr_and_role_leave_k_to_the_data_even_for_protocol_datasets():
    from featcache.errors import OptionError

    for name in ("epr", "role"):
        assert loss_class(name).default_values("voc")["k"] is None
        assert loss_class(name).default_values(None)["k"] is None
        with pytest.raises(OptionError, match="k"):
            create_loss(name, 20, dataset="voc")
    assert create_loss("role", 312, dataset="cub", params={"k": 31.4}).param_values["k"] == [31.4]


def test_pr_sums_hinges_of_each_positive_against_the_unobserved():
    f = probs()
    # Row 0: positive 0 against 1 and 2; row 1: positive 1 against 0 and 2.
    row0 = max(0, 1 - f[0][0] + f[0][1]) + max(0, 1 - f[0][0] + f[0][2])
    row1 = max(0, 1 - f[1][1] + f[1][0]) + max(0, 1 - f[1][1] + f[1][2])
    assert run("pr").item() == pytest.approx(batch_mean([row0, row1], B, L), rel=1e-9)


def test_pr_counts_a_row_with_two_positives_once_per_positive():
    logits = [[1.0, 0.0, -2.0]]
    f = [sig(x) for x in logits[0]]
    expected = (max(0, 1 - f[0] + f[2]) + max(0, 1 - f[1] + f[2])) / 3
    assert run("pr", observed=[[1, 1, 0]], logits=logits).item() == pytest.approx(expected, rel=1e-9)


def test_pr_compares_against_unobserved_entries_only_not_observed_negatives():
    logits = [[1.0, 0.0, -2.0]]
    f = [sig(x) for x in logits[0]]
    expected = max(0, 1 - f[0] + f[2]) / 3  # class 1 is an observed negative: left out
    assert run("pr", observed=[[1, -1, 0]], logits=logits).item() == pytest.approx(expected, rel=1e-9)


# ----------------------------------------------------------------------------------- ROLE
def role_state(phi_rows):
    return {"phi": tensor(phi_rows, 1).requires_grad_(True)}


def test_role_initialises_phi_as_the_reference_label_estimator():
    observed = torch.tensor([[1, 0, 0], [0, 1, -1], [0, 0, 1]], dtype=torch.float32)
    loss = create_loss("role", 3, num_heads=2, params={"k": 1.0})
    phi = loss.init_state(observed, generator=torch.Generator().manual_seed(7))["phi"]
    assert phi.shape == (2, 3, 3) and phi.requires_grad
    uniform = torch.rand(3, 3, generator=torch.Generator().manual_seed(7))
    q = math.log(0.6 / 0.4)
    for n in range(3):
        for i in range(3):
            z = observed[n, i].item()
            want = logit(0.995) if z == 1 else logit(0.005) if z == -1 else q * (2 * uniform[n, i].item() - 1)
            assert phi[0, n, i].item() == pytest.approx(want, rel=1e-6)
            assert phi[1, n, i].item() == phi[0, n, i].item()
            if z == 0:
                assert abs(phi[0, n, i].item()) <= q


def test_role_hand_over_is_relogited_with_clipping():
    loss = create_loss("role", 2, params={"k": 1.0})
    given = torch.tensor([[0.3, 30.0], [-30.0, -1.2]])
    phi = loss.init_state(torch.zeros(2, 2), initial={"phi": given})["phi"]
    assert phi.requires_grad
    expected = [[0.3, logit(1 - 1e-5)], [logit(1e-5), -1.2]]
    for n in range(2):
        for i in range(2):
            # float32, as the reference: 1 - p near the clip costs about 1e-4 relative
            assert phi[0, n, i].item() == pytest.approx(expected[n][i], rel=3e-4)
    with pytest.raises(InputError, match="phi"):
        loss.init_state(torch.zeros(3, 2), initial={"phi": given})


def test_role_value_and_stop_gradient_structure():
    k = 1.2
    phi_rows = [[2.0, -0.5, 0.1], [0.4, 1.5, -1.0]]
    state = role_state(phi_rows)
    loss = create_loss("role", L, params={"k": k})
    logits = tensor(LOGITS, 1).requires_grad_(True)
    targets = Targets(tensor(OBSERVED), torch.tensor([0, 1]))
    value = loss.forward(logits, targets, state, 0)
    value.sum().backward()

    f, y = probs(), [[sig(x) for x in row] for row in phi_rows]
    terms = []
    for b, i, p in cells(f):
        e = y[b][i]
        pos = OBSERVED[b][i] == 1
        entry = 0.5 * ((nl(p) if pos else 0) + (nl(e) if pos else 0))
        entry += 0.5 * ((e * nl(p) + (1 - e) * nl(1 - p)) + (p * nl(e) + (1 - p) * nl(1 - e)))
        terms.append(entry)
    mean_f = (sum(f[0]) + sum(f[1])) / B
    mean_y = (sum(y[0]) + sum(y[1])) / B
    regularizer = 0.5 * ((mean_f - k) ** 2 + (mean_y - k) ** 2) / L**2
    assert value.item() == pytest.approx(batch_mean(terms, B, L) + regularizer, rel=1e-6)

    # Gradients by hand. The classifier sees y~ as a constant target and the estimator sees f
    # as one: d/dg has no term from bce(y~, sg(f)), d/dphi none from bce(f, sg(y~)).
    for b, i, p in cells(f):
        e, pos = y[b][i], OBSERVED[b][i] == 1
        d_f = (0.5 * (-1 / (p + 1e-5) if pos else 0)
               + 0.5 * (-e / (p + 1e-5) + (1 - e) / (1 - p + 1e-5))) / (B * L)
        d_f += 0.5 * 2 * (mean_f - k) / (B * L**2)
        assert logits.grad[0, b, i].item() == pytest.approx(d_f * p * (1 - p), rel=1e-5)
        d_y = (0.5 * (-1 / (e + 1e-5) if pos else 0)
               + 0.5 * (-p / (e + 1e-5) + (1 - p) / (1 - e + 1e-5))) / (B * L)
        d_y += 0.5 * 2 * (mean_y - k) / (B * L**2)
        assert state["phi"].grad[0, b, i].item() == pytest.approx(d_y * e * (1 - e), rel=1e-5)


def test_role_reads_phi_rows_by_example_index_and_trains_phi_at_lr_mult():
    phi_rows = [[0.0, 0.0, 0.0], [2.0, -0.5, 0.1], [0.4, 1.5, -1.0]]
    loss = create_loss("role", L, params={"k": 1.0})
    state = {"phi": tensor(phi_rows, 1).requires_grad_(True)}
    targets = Targets(tensor(OBSERVED), torch.tensor([1, 2]))
    loss.forward(tensor(LOGITS, 1), targets, state, 0).sum().backward()
    assert torch.all(state["phi"].grad[0, 0] == 0)
    assert torch.all(state["phi"].grad[0, 1:] != 0)
    assert loss.learned_state_lr_mults() == {"phi": [10.0]}
    assert create_loss("role", 3, 2, params={"k": 1, "lr_mult": [5, 20]}).learned_state_lr_mults() == {
        "phi": [5.0, 20.0]}


# ------------------------------------------------------------- hand-written gradients
HAND_GRADIENT = sorted(name for name in loss_names()
                       if loss_class(name).loss_and_grad is not SPMLLoss.loss_and_grad)


def test_the_losses_with_a_hand_written_gradient():
    assert HAND_GRADIENT == ["an", "an-ls", "bce", "bce-ls", "iu", "iun", "n-ls", "wan"]


@pytest.mark.parametrize("name", HAND_GRADIENT)
@pytest.mark.parametrize("scale", [0.1, 3.0, 30.0])
def test_a_hand_written_gradient_is_autograds_bit_for_bit(name, scale):
    """Same loss and same gradient, every bit: random shapes, saturated probabilities (f = 0
    and f = 1 exactly), observed negatives, and per-head parameters where the loss has any."""
    generator = torch.Generator().manual_seed(int(scale * 10))
    for trial in range(40):
        heads, batch, classes = (int(torch.randint(1, high, (), generator=generator))
                                 for high in (5, 17, 30))
        logits = torch.randn(heads, batch, classes, generator=generator) * scale
        logits[..., 0], logits[..., -1] = 100.0, -100.0
        observed = torch.randint(-1, 2, (batch, classes), generator=generator).float()
        clean = torch.randint(0, 2, (batch, classes), generator=generator).float()
        per_head = [0.2 * (h + 1) / heads for h in range(heads)]
        params = ({"an-ls": {"eps_pos": per_head}, "bce-ls": {"eps": per_head}}.get(name)
                  if trial % 2 else None)
        loss = create_loss(name, classes, heads, params=params)
        targets = Targets(observed, torch.arange(batch), clean)
        leaf = logits.clone().requires_grad_(True)
        expected = loss.forward(leaf, targets, {}, 0)
        (expected_grad,) = torch.autograd.grad(expected.sum(), [leaf])
        value, grad = loss.loss_and_grad(logits, targets, {}, 0)
        assert torch.equal(value, expected.detach()), (trial, heads, batch, classes)
        assert torch.equal(grad, expected_grad), (trial, heads, batch, classes)


def test_an_hand_written_gradient_by_hand():
    """AN's gradient against its definition: d/dg = (-1/(f+eps) if z=1 else 1/(1-f+eps)) f(1-f)/(BL)."""
    loss = create_loss("an", L)
    value, grad = loss.loss_and_grad(tensor(LOGITS, 1), Targets(tensor(OBSERVED), torch.arange(B)),
                                     {}, 0)
    for b, i, p in cells(probs()):
        d_f = (-1 / (p + 1e-5) if OBSERVED[b][i] == 1 else 1 / (1 - p + 1e-5)) / (B * L)
        assert grad[0, b, i].item() == pytest.approx(d_f * p * (1 - p), rel=1e-5)
    assert value.item() == pytest.approx(run("an").item(), rel=0, abs=0)


@pytest.mark.parametrize("count", [1, 3, 160, 320, 1620, 7 * 13])
def test_unit_gradient_is_autograds_seed_of_a_mean(count):
    leaf = torch.zeros(count, requires_grad=True)
    (leaf.sum() / count).backward()
    assert torch.equal(unit_gradient(leaf, count), leaf.grad[0])
    assert torch.equal(unit_gradient(leaf, count, -1.0), -leaf.grad[0])
