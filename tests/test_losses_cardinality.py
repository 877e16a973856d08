"""The label-cardinality losses of Gharib, Murena and Klami (TMLR 2025), term by term by hand:
``lc-max`` (maximum and mean cardinality), ``lc-exact`` (each image's count), ``lc-dist`` (the
distribution, with the matching that estimates each image's count)."""

from __future__ import annotations

import pytest
import torch
from loss_math import nl, sig, tensor

from featcache.data.kestimate import EstimateRequest
from featcache.errors import LossNeedError, OptionError
from featcache.losses import DataFacts, Targets, create_loss, loss_class
from featcache.losses.cardinality_dist import cardinality_slots, match_cardinalities

# two images, four classes; image 0's positive is class 1, image 1's class 3 (its lowest logit)
LOGITS = [[0.5, -1.0, 2.0, 0.0], [1.0, 0.3, -0.2, -2.0]]
OBSERVED = [[0, 1, 0, 0], [0, 0, 0, 1]]
CLEAN = [[0, 1, 1, 0], [1, 1, 1, 1]]
B, L = 2, 4
HISTOGRAM = ((1, 3), (2, 2), (3, 1))  # P(k) of six images: mean 5/3, maximum 3


def facts(histogram=HISTOGRAM, clean=True) -> DataFacts:
    images = sum(n for _, n in histogram)
    return DataFacts("toy", L, has_clean_train=clean,
                     mean_positives=sum(k * n for k, n in histogram) / images if clean else None,
                     positives_histogram=histogram if clean else ())


def value(name, params=None, epoch=0, state=None, observed=OBSERVED, logits=LOGITS, heads=1):
    loss = create_loss(name, L, heads, params=params, facts=facts())
    targets = Targets(tensor(observed), torch.tensor([0, 1]), tensor(CLEAN))
    return loss.forward(tensor(logits, heads), targets, state or {}, epoch)


def regularizer(rows, targets) -> float:
    """(mean over rows of sum_i f - k)^2 / L^2 with one k (EPR), or the per-image mean."""
    sums = [sum(sig(g) for g in row) for row in rows]
    if not isinstance(targets, list):
        return (sum(sums) / len(sums) - targets) ** 2 / L**2
    return sum((s - k) ** 2 for s, k in zip(sums, targets, strict=True)) / len(sums) / L**2


def test_lc_max_by_hand():
    # K = 2: image 0 ranks 1 (observed), 2, 0, 3 -> classes 0 and 3 below the 2nd are negatives;
    # image 1 ranks 3 (observed, although its logit is lowest), 0, 1, 2 -> classes 1, 2
    terms = [nl(1 - sig(0.5)), nl(sig(-1.0)), 0.0, nl(1 - sig(0.0)),
             0.0, nl(1 - sig(0.3)), nl(1 - sig(-0.2)), nl(sig(-2.0))]
    expected = sum(terms) / (B * L) + regularizer(LOGITS, 1.5)
    assert value("lc-max", {"k_max": 2, "k": 1.5}).item() == pytest.approx(expected, abs=1e-12)
    # K = 4 (every class): observed positives and the regularizer only
    only = (nl(sig(-1.0)) + nl(sig(-2.0))) / (B * L) + regularizer(LOGITS, 1.5)
    assert value("lc-max", {"k_max": 4, "k": 1.5}).item() == pytest.approx(only, abs=1e-12)


def test_lc_max_ties_and_observed_negatives():
    # equal logits: the lower class ranks first; an observed negative is always a negative and
    # never takes one of the K places
    logits = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    observed = [[1, -1, 0, 0], [0, 0, 1, 0]]
    n, p = nl(0.5), nl(0.5)  # neglog(1 - 0.5) = neglog(0.5)
    # K = 2: image 0: 0 (observed), 2, 3, then 1 (observed negative) -> 3 and 1 negatives;
    # image 1: 2 (observed), 0, 1, 3 -> 1 and 3 negatives
    expected = (p + n + 0 + n + 0 + n + p + n) / (B * L) + regularizer(logits, 1.0)
    got = value("lc-max", {"k_max": 2, "k": 1.0}, observed=observed, logits=logits)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_lc_max_per_head_bounds_and_the_negatives_carry_no_gradient_through_the_ranking():
    both = value("lc-max", {"k_max": [2, 4], "k": 1.5}, heads=2)
    assert both[0].item() == pytest.approx(value("lc-max", {"k_max": 2, "k": 1.5}).item(), abs=1e-12)
    assert both[1].item() == pytest.approx(value("lc-max", {"k_max": 4, "k": 1.5}).item(), abs=1e-12)
    logits = tensor(LOGITS, 1).requires_grad_(True)
    loss = create_loss("lc-max", L, params={"k_max": 2, "k": 1.5})
    loss.forward(logits, Targets(tensor(OBSERVED), torch.tensor([0, 1])), {}, 0).sum().backward()
    # class 2 of image 0 (ranked 2nd: no term) gets the regularizer's gradient only
    f = sig(2.0)
    mean = sum(sum(sig(g) for g in row) for row in LOGITS) / B
    assert logits.grad[0, 0, 2].item() == pytest.approx(2 * (mean - 1.5) / L**2 / B * f * (1 - f),
                                                        abs=1e-12)


def test_lc_max_reads_k_max_from_the_data_or_estimates_it():
    resolved = loss_class("lc-max").resolve({}, facts=facts())
    assert resolved.single() == {"k_max": 3.0, "k": pytest.approx(5 / 3)}
    assert resolved.sources == {"k_max": "data", "k": "data"}
    estimated = loss_class("lc-max").resolve({"k_max": [EstimateRequest(2, seed=7)]}, facts=facts())
    record = estimated.estimates["k_max"][0]
    assert record["labeled"] == 2 and record["k_max_true"] == 3.0
    assert record["value"] in (1.0, 2.0, 3.0) and estimated.values["k_max"] == [record["value"]]
    six = loss_class("lc-max").resolve({"k_max": [EstimateRequest(6)]}, facts=facts())
    assert six.values["k_max"] == [3.0]  # every image drawn: the training set's maximum
    single = facts(clean=False)
    assert "--param k_max=VALUE" in loss_class("lc-max").unmet_need(single)
    with pytest.raises(OptionError, match="no clean training labels; pass --param k_max"):
        loss_class("lc-max").resolve({"k_max": [EstimateRequest(2)], "k": 1.0}, facts=single)
    with pytest.raises(OptionError, match="k_max=0.5 is out of range"):
        create_loss("lc-max", L, params={"k_max": 0.5, "k": 1.0})


def test_lc_exact_by_hand():
    # k_n from the clean rows: 2 and 4. Image 0: classes ranked 1 (observed), 2 | 0, 3 negatives;
    # image 1: k = 4, no negatives
    terms = [nl(1 - sig(0.5)), nl(sig(-1.0)), 0.0, nl(1 - sig(0.0)), 0.0, 0.0, 0.0, nl(sig(-2.0))]
    expected = sum(terms) / (B * L) + regularizer(LOGITS, [2, 4])
    assert value("lc-exact").item() == pytest.approx(expected, abs=1e-12)


def test_lc_exact_needs_clean_counts():
    reason = loss_class("lc-exact").unmet_need(facts(clean=False))
    assert "number of positives" in reason and "single positives only" in reason
    loss = create_loss("lc-exact", L)
    with pytest.raises(Exception, match="clean labels"):
        loss.forward(tensor(LOGITS, 1), Targets(tensor(OBSERVED), torch.tensor([0, 1])), {}, 0)


def test_the_matching_slots_follow_the_distribution():
    # 7 images: 7 * (3, 2, 1) / 6 = 3.5, 2.33, 1.17 -> floors 3, 2, 1 and one more for k = 1
    assert cardinality_slots(HISTOGRAM, 7).tolist() == [1, 1, 1, 1, 2, 2, 3]
    assert cardinality_slots(HISTOGRAM, 6).tolist() == [1, 1, 1, 2, 2, 3]
    assert cardinality_slots(((0, 1), (2, 1)), 2).tolist() == [1, 2]  # at least 1 each
    # the image with the m-th smallest predicted count gets the m-th smallest slot
    predicted = torch.tensor([[2.5, 0.1, 1.0, 0.1], [0.0, 3.0, 2.0, 1.0]])
    got = match_cardinalities(predicted, torch.tensor([1, 1, 2, 3]))
    assert got.tolist() == [[3, 1, 2, 1], [1, 3, 2, 1]]


def test_lc_dist_is_lc_max_first_then_lc_exact_with_the_matched_counts():
    loss = create_loss("lc-dist", L, facts=facts())
    state = loss.init_state(tensor(OBSERVED), tensor(CLEAN))
    assert state["cardinality"].tolist() == [[0.0, 0.0]]
    # epoch 0: lc-max with P(k)'s maximum 3 and mean 5/3
    first = value("lc-dist", state=state, epoch=0)
    assert first.item() == pytest.approx(value("lc-max", {"k_max": 3, "k": 5 / 3}).item(), abs=1e-12)
    # after the epoch: image 1 predicts more positives than image 0 -> it gets the larger slot
    probs = torch.tensor([[[0.1, 0.9, 0.1, 0.1], [0.9, 0.9, 0.9, 0.9]]])
    logged = loss.end_epoch(0, 2, lambda: probs, state)
    slots = cardinality_slots(HISTOGRAM, 2).tolist()  # 2 * (3, 2, 1) / 6 = 1, 0.67, 0.33 -> 1, 2
    assert slots == [1, 2] and state["cardinality"].tolist() == [[1.0, 2.0]]
    assert logged == {"cardinality_mean": [1.5]}
    # then lc-exact with k = (1, 2): image 0 keeps its observed positive only, image 1 ranks
    # 3 (observed), 0 | 1, 2 negatives
    terms = [nl(1 - sig(0.5)), nl(sig(-1.0)), nl(1 - sig(2.0)), nl(1 - sig(0.0)),
             0.0, nl(1 - sig(0.3)), nl(1 - sig(-0.2)), nl(sig(-2.0))]
    expected = sum(terms) / (B * L) + regularizer(LOGITS, [1, 2])
    assert value("lc-dist", state=state, epoch=1).item() == pytest.approx(expected, abs=1e-12)


def test_lc_dist_needs_the_distribution():
    reason = loss_class("lc-dist").unmet_need(facts(clean=False))
    assert "distribution of the number of positives" in reason
    with pytest.raises(LossNeedError, match="positives_histogram"):
        create_loss("lc-dist", L).init_state(tensor(OBSERVED))
    counted = create_loss("lc-dist", L)  # without the data's facts: P(k) of the rows' labels
    counted.init_state(tensor(OBSERVED), tensor(CLEAN))
    assert counted.histogram == ((2, 1), (4, 1))


@pytest.mark.slow
def test_lc_dist_fine_tunes_with_its_matching_and_its_run_keeps_label_sets(tmp_path_factory,
                                                                           tmp_path):
    """Stage three: two epochs (lc-max's terms, then the matched counts), state in the
    checkpoint, and the run's validation scores and label sets kept."""
    import json

    from helpers_finetune import NAME, SIZE, copy_cache, finetune

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    result = finetune(cache, "--loss", "lc-dist", "--init", "none", "--weights", "random",
                      "--image-size", str(SIZE), "--epochs", "2", "--lr", "1e-3", "--bsize", "8",
                      "--run-id", "card")
    assert result.exit_code == 0, result.output
    run_dir = cache / NAME / "finetune" / "lc-dist" / "card"
    document = json.loads((run_dir / "results.json").read_text())
    epochs = document["configs"][0]["epochs"]
    assert all(1.0 <= e["extra"]["cardinality_mean"] <= 3.0 for e in epochs)
    assert (run_dir / "val-scores.h5").is_file()
    assert [entry["level"] for entry in document["label_sets"]["levels"]] == [0.8, 0.9, 0.95]
