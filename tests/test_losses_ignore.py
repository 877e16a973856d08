"""IGNORE (Song et al. ECCV 2024): the loss, its thresholds and its masks against the authors'
formulas (written out below from gyeong-ryeol-song/SPML-IGNORE, float64, value and gradient)
and against values computed by hand on tiny tensors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from loss_math import nl, sig

from featcache.errors import LossStateError
from featcache.losses import DataFacts, HeadKind, MaskedPassLoss, Targets, create_loss, loss_class
from featcache.losses.ignore import image_keep_mask, position_keep_mask
from featcache.protocol.loss_choice import choose_losses

F64 = torch.float64


# ------------------------------------------------------- the authors' formulas, written out
# A reference independent of featcache's code, transcribed from the authors' files; the
# authors' args namespace is kept so each line can be compared with theirs.
def ref_neg_log(x):  # losses.py neg_log (LOG_EPSILON = 1e-5)
    return -torch.log(x + 1e-5)


def ref_loss_an(preds, labels):  # losses.py loss_an
    loss = torch.zeros_like(labels)
    loss[labels == 1] = ref_neg_log(preds[labels == 1])
    loss[labels == 0] = ref_neg_log(1.0 - preds[labels == 0])
    return loss


def ref_ignore_loss(logits, mask_logits, logits_st, label_vec, args, gap_t, avg_t, epoch):
    """losses.py ``ignore_loss`` (epoch 1-based, as train_resnet.py passes it)."""
    preds, preds_s = torch.sigmoid(logits), torch.sigmoid(logits_st)
    gap = torch.abs(logits - mask_logits).detach()
    if args.lat:
        pseudo = ((gap > gap_t) & (logits > avg_t)).to(logits.dtype).detach()
    else:
        pseudo = (gap > gap_t).to(logits.dtype).detach()
    if epoch <= args.warm_up:
        mask = torch.zeros_like(label_vec)
    else:
        mask = (pseudo - label_vec).clip(max=1.0, min=0.0)
    fn_mask = (torch.ones_like(mask) - mask).detach()
    loss_spbc = ref_neg_log(preds[label_vec == 1]).mean()
    consistency = F.mse_loss(logits_st, logits)
    loss_mtx = ref_loss_an(preds_s if args.strong_aug else preds, label_vec)
    loss_ignore = loss_mtx[fn_mask.bool()].mean()
    return (args.spbc_weight * loss_spbc + args.ignore_weight * loss_ignore
            + args.reg_weight * consistency)


def ref_thresholds(logits, mask_logits, label_vec, args, gap_t, avg_t):
    """train_resnet.py ``run_train_resnet``: the two moving averages, updated before the loss."""
    gap = torch.abs(logits - mask_logits).clone().detach()
    logits_cp = logits.clone().detach()
    gap_t = args.gap_lambda * gap_t + (1 - args.gap_lambda) * gap[label_vec.bool()].mean()
    avg_t = args.avg_lambda * avg_t + (1 - args.avg_lambda) * (logits_cp.sum(dim=0)
                                                               / label_vec.size(0))
    return gap_t, avg_t


def ref_cam_minmax_norm(cam):  # functions.py cam_minmax_norm: over dim 0, the batch
    return (cam - cam.min(dim=0)[0]) / cam.max(dim=0)[0]


def ref_masked_image(image, cam_w, label_vec, cam_threshold):
    """functions.py ``generate_resnet_cam_and_mask`` (one positive per row, as SPML has)."""
    cam = ref_cam_minmax_norm(cam_w[label_vec.bool(), :, :])
    cam = F.interpolate(cam.unsqueeze(1), size=(image.size(2), image.size(3)), mode="bilinear",
                        align_corners=False)
    idx = label_vec.sum(dim=1) == 1
    cam_mask = torch.where(cam > cam_threshold, 1, 0).to(image.dtype)
    cam_mask_mod = torch.ones(image.size(0), 1, image.size(-2), image.size(-1), dtype=image.dtype)
    cam_mask_mod[idx] = cam_mask
    return image * cam_mask_mod


def authors_args(**changes):
    """config.py's defaults with the README's VOC ResNet-50 run (spbc_weight 0.1)."""
    args = dict(lat=True, warm_up=3, strong_aug=True, spbc_weight=0.1, ignore_weight=1.0,
                reg_weight=0.5, gap_lambda=0.999, avg_lambda=0.999, cam_threshold=0.8)
    args.update(changes)
    return SimpleNamespace(**args)


def single_positives(batch, classes, generator):
    labels = torch.zeros(batch, classes, dtype=F64)
    labels[torch.arange(batch), torch.randint(classes, (batch,), generator=generator)] = 1.0
    return labels


# ------------------------------------------------------------------------------ equal to theirs
@pytest.mark.parametrize("changes", [{}, {"lat": False}, {"gap_lambda": 0.5, "avg_lambda": 0.7},
                                     {"spbc_weight": 0.5, "reg_weight": 0.0, "warm_up": 0}])
def test_loss_and_gradient_equal_the_authors_code_over_several_steps(changes):
    """Six steps through warm-up and after: the thresholds carried in featcache's state and the
    authors' variables agree, and so do the loss and its gradients (plain and strong logits)."""
    args = authors_args(**changes)
    params = {k: float(getattr(args, k)) for k in ("spbc_weight", "ignore_weight", "reg_weight",
                                                    "gap_lambda", "avg_lambda", "cam_threshold")}
    params.update(warm_up=float(args.warm_up), lat=float(args.lat))
    loss = create_loss("ignore", 6, params=params)
    generator = torch.Generator().manual_seed(3)
    labels = single_positives(8, 6, generator)
    state = loss.init_state(labels)
    gap_t, avg_t = 0, torch.zeros(1, 6, dtype=F64)
    for epoch in range(6):  # featcache's epochs are 0-based, the authors' 1-based
        logits = torch.randn(8, 6, dtype=F64, generator=generator, requires_grad=True)
        strong = torch.randn(8, 6, dtype=F64, generator=generator, requires_grad=True)
        masked = logits.detach() + 2 * torch.randn(8, 6, dtype=F64, generator=generator)
        gap_t, avg_t = ref_thresholds(logits, masked, labels, args, gap_t, avg_t)
        expected = ref_ignore_loss(logits, masked, strong, labels, args, gap_t, avg_t, epoch + 1)
        want = torch.autograd.grad(expected, [logits, strong])
        mine_logits = logits.detach().clone().requires_grad_(True)
        mine_strong = strong.detach().clone().requires_grad_(True)
        got = loss(mine_logits, Targets(labels, torch.arange(8), masked=masked.unsqueeze(0),
                                        strong=mine_strong.unsqueeze(0)), state, epoch)
        have = torch.autograd.grad(got, [mine_logits, mine_strong])
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        for a, b in zip(have, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state["gap_threshold"].view(()), gap_t.view(()))
        torch.testing.assert_close(state["avg_threshold"].view(1, 6), avg_t)


def test_without_a_strong_view_it_is_the_authors_loss_with_strong_aug_off_and_no_consistency():
    """Stage two (cached features): the strong view is the plain one."""
    args = authors_args(strong_aug=False, warm_up=0)
    loss = create_loss("ignore", 5, params={"warm_up": 0}, dataset="voc")
    generator = torch.Generator().manual_seed(4)
    labels = single_positives(6, 5, generator)
    state = loss.init_state(labels)
    logits = torch.randn(6, 5, dtype=F64, generator=generator, requires_grad=True)
    masked = logits.detach() + torch.randn(6, 5, dtype=F64, generator=generator)
    gap_t, avg_t = ref_thresholds(logits, masked, labels, args, 0, torch.zeros(1, 5, dtype=F64))
    expected = ref_ignore_loss(logits, masked, logits, labels, args, gap_t, avg_t, 1)
    got = loss(logits, Targets(labels, torch.arange(6), masked=masked.unsqueeze(0)), state, 0)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(got, logits)[0],
                               torch.autograd.grad(expected, logits)[0], rtol=1e-12, atol=1e-12)


def test_stacked_heads_each_get_their_own_loss_thresholds_and_parameters():
    args = [authors_args(warm_up=0, gap_lambda=g, spbc_weight=w) for g, w in ((0.9, 0.1),
                                                                              (0.5, 0.5))]
    loss = create_loss("ignore", 4, num_heads=2,
                       params={"warm_up": 0, "gap_lambda": [0.9, 0.5], "spbc_weight": [0.1, 0.5]})
    generator = torch.Generator().manual_seed(5)
    labels = single_positives(5, 4, generator)
    state = loss.init_state(labels)
    logits = torch.randn(2, 5, 4, dtype=F64, generator=generator)
    strong = torch.randn(2, 5, 4, dtype=F64, generator=generator)
    masked = logits + torch.randn(2, 5, 4, dtype=F64, generator=generator)
    got = loss(logits, Targets(labels, torch.arange(5), masked=masked, strong=strong), state, 1)
    for h in range(2):
        gap_t, avg_t = ref_thresholds(logits[h], masked[h], labels, args[h], 0,
                                      torch.zeros(1, 4, dtype=F64))
        expected = ref_ignore_loss(logits[h], masked[h], strong[h], labels, args[h], gap_t,
                                   avg_t, 2)
        torch.testing.assert_close(got[h], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state["gap_threshold"][h].view(()), gap_t.view(()))


def test_the_image_mask_equals_the_authors_masked_image():
    """Normalised over the batch at each position, divided by the max, interpolated, > 0.8."""
    generator = torch.Generator().manual_seed(6)
    labels = single_positives(5, 3, generator)
    cam = torch.randn(5, 3, 4, 4, dtype=F64, generator=generator) + 0.5
    image = torch.randn(5, 3, 32, 32, dtype=F64, generator=generator)
    for threshold in (0.8, 0.3):
        expected = ref_masked_image(image, cam, labels, threshold)
        keep = image_keep_mask(cam, labels, threshold, (32, 32))
        assert torch.equal(image * keep, expected)
        assert 0 < float(keep.mean()) < 1  # the example masks something and keeps something
    # the loss's own method reads its cam_threshold
    loss = create_loss("ignore", 3, params={"cam_threshold": 0.3})
    assert torch.equal(loss.image_mask(cam, labels, (32, 32)) * image,
                       ref_masked_image(image, cam, labels, 0.3))


def test_the_position_mask_is_the_image_mask_at_the_maps_resolution():
    """Stage two thresholds the same normalised map without interpolation (bilinear to the
    same size is the identity), one mask per stacked head."""
    generator = torch.Generator().manual_seed(7)
    labels = single_positives(6, 4, generator)
    cam = torch.randn(2, 6, 3, 3, 4, dtype=F64, generator=generator)  # (H, B, h, w, L)
    keep = position_keep_mask(cam.reshape(2, 6, 9, 4), labels, 0.5)
    for h in range(2):
        per_image = image_keep_mask(cam[h].permute(0, 3, 1, 2), labels, 0.5, (3, 3))
        assert torch.equal(keep[h], per_image.reshape(6, 9))
        ones = torch.ones(6, 1, 3, 3, dtype=F64)
        assert torch.equal(keep[h].reshape(6, 1, 3, 3),
                           ref_masked_image(ones, cam[h].permute(0, 3, 1, 2), labels, 0.5))


def test_rows_without_exactly_one_positive_keep_everything_and_stay_out_of_the_norm():
    cam = torch.tensor([[[1.0, 2.0]], [[4.0, 0.0]], [[9.0, 9.0]]], dtype=F64)  # (B=3, L=1, P=2)
    cam = cam.transpose(1, 2).unsqueeze(0)  # (H=1, B=3, P=2, L=1)
    labels = torch.tensor([[1.0], [1.0], [0.0]], dtype=F64)
    # rows 0, 1: position 0 min 1 max 4 -> (0, 0.75); position 1 min 0 max 2 -> (1, 0)
    keep = position_keep_mask(cam, labels, 0.7)
    assert keep.tolist() == [[[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]]
    assert position_keep_mask(cam, torch.zeros(3, 1, dtype=F64), 0.7).eq(1).all()


# -------------------------------------------------------------------------------- by hand
# B = 2, L = 3. Logits g = [[2, 1, -1], [0.5, 3, 2]], masked pass [[2, -1, -1], [0.5, 1, -2]]:
# gap [[0, 2, 0], [0, 2, 4]]; observed positives (0, 0) and (1, 1), their mean gap 1.
# gap_lambda = avg_lambda = 0.5 from 0: T_gap = 0.5, T_avg = 0.5 * [1.25, 2, 0.5] = [0.625, 1, 0.25].
G = [[2.0, 1.0, -1.0], [0.5, 3.0, 2.0]]
GM = [[2.0, -1.0, -1.0], [0.5, 1.0, -2.0]]
Z = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]


def _hand_loss(warm_up=0, lat=1, strong=None):
    loss = create_loss("ignore", 3, params={"gap_lambda": 0.5, "avg_lambda": 0.5,
                                            "warm_up": warm_up, "lat": lat, "spbc_weight": 0.1})
    labels = torch.tensor(Z, dtype=F64)
    state = loss.init_state(labels)
    targets = Targets(labels, torch.arange(2), masked=torch.tensor([GM], dtype=F64),
                      strong=None if strong is None else torch.tensor([strong], dtype=F64))
    value = loss(torch.tensor(G, dtype=F64), targets, state, 0)
    return value.item(), state


def test_by_hand_rejection_needs_a_large_gap_and_a_logit_above_its_class_average():
    value, state = _hand_loss()
    assert state["gap_threshold"].item() == pytest.approx(0.5)
    assert state["avg_threshold"].flatten().tolist() == pytest.approx([0.625, 1.0, 0.25])
    # unobserved: (0,1) gap 2 > 0.5 but g = 1 is not > 1: kept; (0,2), (1,0) gap 0: kept;
    # (1,2) gap 4, g = 2 > 0.25: rejected. 5 entries kept.
    spbc = (nl(sig(2.0)) + nl(sig(3.0))) / 2
    kept = (nl(sig(2.0)) + nl(1 - sig(1.0)) + nl(1 - sig(-1.0)) + nl(1 - sig(0.5))
            + nl(sig(3.0))) / 5
    assert value == pytest.approx(0.1 * spbc + kept, abs=1e-12)


def test_by_hand_without_lat_the_gap_alone_rejects():
    value, _ = _hand_loss(lat=0)  # (0,1) is rejected too: 4 entries kept
    spbc = (nl(sig(2.0)) + nl(sig(3.0))) / 2
    kept = (nl(sig(2.0)) + nl(1 - sig(-1.0)) + nl(1 - sig(0.5)) + nl(sig(3.0))) / 4
    assert value == pytest.approx(0.1 * spbc + kept, abs=1e-12)


def test_by_hand_warm_up_rejects_nothing_but_moves_the_thresholds():
    value, state = _hand_loss(warm_up=1)  # epoch 0 is the first (1-based 1 <= warm_up 1)
    assert state["gap_threshold"].item() == pytest.approx(0.5)
    spbc = (nl(sig(2.0)) + nl(sig(3.0))) / 2
    every = sum(nl(sig(g)) if z else nl(1 - sig(g))
                for gs, zs in zip(G, Z, strict=True) for g, z in zip(gs, zs, strict=True)) / 6
    assert value == pytest.approx(0.1 * spbc + every, abs=1e-12)


def test_by_hand_the_strong_view_takes_the_an_term_and_the_consistency_term():
    strong = [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    value, _ = _hand_loss(strong=strong)
    spbc = (nl(sig(2.0)) + nl(sig(3.0))) / 2  # on the plain view
    kept = (nl(sig(1.0)) + nl(1 - sig(0.0)) + nl(1 - sig(0.0)) + nl(1 - sig(0.0))
            + nl(sig(1.0))) / 5  # (1, 2) rejected, AN on the strong view
    mse = sum((s - g) ** 2 for ss, gs in zip(strong, G, strict=True)
              for s, g in zip(ss, gs, strict=True)) / 6
    assert value == pytest.approx(0.1 * spbc + kept + 0.5 * mse, abs=1e-12)


def test_observed_negatives_count_as_negatives_and_are_never_rejected():
    loss = create_loss("ignore", 3, params={"warm_up": 0, "gap_lambda": 0.5, "avg_lambda": 0.5})
    labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, -1.0]], dtype=F64)  # (1, 2) observed -1
    state = loss.init_state(labels)
    logits = torch.tensor([G], dtype=F64)
    reject = loss.rejected(logits, torch.tensor([GM], dtype=F64), labels, state, 0)
    assert not reject[0, 1, 2] and reject.sum() == 0
    # the same batch with (1, 2) unobserved rejects it (the by-hand example above)
    unobserved = labels.clamp(min=0)
    assert loss.rejected(logits, torch.tensor([GM], dtype=F64), unobserved,
                         loss.init_state(unobserved), 0)[0, 1, 2]


# -------------------------------------------------------------------------- declarations
def test_declarations_defaults_and_refusals():
    cls = loss_class("ignore")
    assert issubclass(cls, MaskedPassLoss) and cls.head is HeadKind.CAM and cls.reference == "Song et al. ECCV 2024" and cls.year == 2024
    assert cls.default_values("voc")["spbc_weight"] == 0.1
    assert cls.default_values("coco")["spbc_weight"] == 0.5
    assert cls.default_values("coco") == {
        "spbc_weight": 0.5, "ignore_weight": 1.0, "reg_weight": 0.5, "gap_lambda": 0.999,
        "avg_lambda": 0.999, "cam_threshold": 0.8, "warm_up": 3, "lat": 1}
    loss = create_loss("ignore", 3)
    with pytest.raises(LossStateError, match="Targets.masked"):
        loss(torch.zeros(2, 3), Targets(torch.tensor(Z), torch.arange(2)), loss.init_state(
            torch.tensor(Z)), 0)
    facts = DataFacts(dataset="toy", num_classes=5, backbone="toy")
    chosen, skipped = choose_losses("all", facts)
    assert "ignore" not in chosen
    assert "featcache features --dataset toy --backbone toy --spatial" in dict(skipped)["ignore"]
    chosen, _ = choose_losses("all", DataFacts(dataset="toy", num_classes=5,
                                               spatial_features=True))
    assert "ignore" in chosen


def test_featcache_losses_lists_ignore_with_its_reference_and_conventions():
    from click.testing import CliRunner

    from featcache.cli import cli

    result = CliRunner().invoke(cli, ["losses", "ignore"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.startswith("ignore (Song et al. ECCV 2024): IGNORE: Information Gap-based")
    for convention in ("gyeong-ryeol-song/SPML-IGNORE", "over the batch at each position",
                       "> cam_threshold", "positions of the cached feature map zeroed",
                       "spbc_weight = 0.5 [voc 0.1]", "warm_up = 3", "lat = 1",
                       "needs: spatial feature maps"):
        assert convention in text, convention
    listing = CliRunner().invoke(cli, ["losses"])
    assert "ignore" in listing.output and "Song et al. ECCV 2024" in listing.output
