"""Estimating k from M fully labelled images (Cole et al., supplement B): the interval, the
command, and ``--param k=estimate:M`` in EPR and ROLE."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dataset_fixtures import invoke

from featcache.data.kestimate import (
    EstimateRequest,
    estimate_k,
    k_interval,
    positive_histogram,
    sample_estimates,
)
from featcache.errors import InputError, OptionError
from featcache.losses import DataFacts, loss_class
from featcache.protocol.runs import load_results


def test_worked_example_without_replacement():
    # four images with 1, 1, 2, 4 positives, M = 2 without replacement: the six pairs give
    # k_M = 1 (1/6), 1.5 (2/6), 2.5 (2/6), 3 (1/6); k* = 8/4 = 2. The 5th percentile of 10^5 draws
    # lies in the mass at 1, the 95th in the mass at 3.
    histogram = positive_histogram(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0],
                                             [1, 1, 1, 1]]))
    assert histogram == ((1, 2), (2, 1), (4, 1))
    interval = k_interval(histogram, 2)
    assert (interval.k_true, interval.low, interval.high) == (2.0, 1.0, 3.0)
    estimates = sample_estimates(histogram, 2, 60_000, seed=3)
    frequencies = {v: float(np.mean(estimates == v)) for v in (1.0, 1.5, 2.5, 3.0)}
    assert frequencies == pytest.approx({1.0: 1 / 6, 1.5: 2 / 6, 2.5: 2 / 6, 3.0: 1 / 6}, abs=0.01)
    # every image once (M = N): no variance at all; with replacement M = 4 could give 4.0
    assert set(sample_estimates(histogram, 4, 1000).tolist()) == {2.0}


def test_true_k_lies_in_the_interval_of_a_generated_set():
    # 3000 images whose positive counts are drawn uniformly from {1, 2, 3}: k = 2
    rng = np.random.RandomState(0)
    counts = rng.randint(1, 4, size=3000)
    clean = np.zeros((3000, 8), dtype=np.uint8)
    for row, count in enumerate(counts):
        clean[row, rng.choice(8, count, replace=False)] = 1
    histogram = positive_histogram(clean)
    for labeled in (5, 10, 25):
        interval = k_interval(histogram, labeled)
        assert interval.contains(2.0) and interval.contains(interval.k_true)
        assert interval.low < interval.high
    # the intervals narrow as M grows
    widths = [k_interval(histogram, m).high - k_interval(histogram, m).low for m in (5, 25, 200)]
    assert widths == sorted(widths, reverse=True)


def test_seeded_and_checked():
    histogram = ((1, 50), (3, 50))
    assert k_interval(histogram, 5, seed=1) == k_interval(histogram, 5, seed=1)
    with pytest.raises(OptionError, match="M = 101 .* between 1 and the 100 training images"):
        k_interval(histogram, 101)
    with pytest.raises(InputError, match="needs full"):
        k_interval((), 5)
    assert EstimateRequest.parse("estimate:5") == EstimateRequest(5, 1200)
    assert EstimateRequest.parse("estimate:25:7") == EstimateRequest(25, 7)
    assert EstimateRequest.parse("1.5") is None
    with pytest.raises(OptionError, match="estimate:M or estimate:M:SEED"):
        EstimateRequest.parse("estimate:five")


@pytest.mark.shared_data
def test_voc2012_intervals_match_the_supplements_table_a2(shared_data):
    # Table A2, VOC12: I_5 = (1.0, 2.0), I_10 = (1.1, 1.9), I_25 = (1.2, 1.7), on the 5717
    # official training images (k* = 1.457)
    clean = np.load(shared_data / "voc2012_labels" / "voc2012_train_labels.npy")
    histogram = positive_histogram(clean)
    for labeled, published in ((5, (1.0, 2.0)), (10, (1.1, 1.9)), (25, (1.2, 1.7))):
        interval = k_interval(histogram, labeled)
        assert (round(interval.low, 1), round(interval.high, 1)) == published
    assert k_interval(histogram, 5).k_true == pytest.approx(1.457, abs=1e-3)


def test_estimate_resolves_k_and_is_recorded():
    histogram = ((1, 60), (2, 30), (4, 10))
    facts = DataFacts("toy", 6, mean_positives=1.6, positives_histogram=histogram)
    resolved = loss_class("epr").resolve({"k": [EstimateRequest(5), 2.0]}, facts=facts)
    record = resolved.estimates["k"][0]
    assert resolved.sources["k"] == "estimate" and resolved.values["k"] == [record["value"], 2.0]
    assert record == estimate_k(histogram, EstimateRequest(5))
    assert record["labeled"] == 5 and record["k_true"] == pytest.approx(1.6)
    assert record["value"] * 5 == pytest.approx(round(record["value"] * 5))  # a mean of 5 counts
    assert resolved.estimates["k"][1] is None and "k" in resolved.chosen()
    with pytest.raises(OptionError, match="'lr_mult' cannot be estimated.*only k can"):
        loss_class("role").resolve({"lr_mult": [EstimateRequest(5)]}, facts=facts)
    with pytest.raises(OptionError, match="no clean training labels"):
        loss_class("role").resolve({"k": [EstimateRequest(5)]},
                                   facts=DataFacts("toy", 6, source="x.h5"))


@pytest.fixture
def known_k(cache_dir, tmp_path):
    """A feature set whose 400 training images have 1, 2 or 3 positives in turn: k* = 2."""
    rng = np.random.RandomState(1)
    y = np.zeros((400, 6), dtype=np.uint8)
    for row in range(400):
        y[row, rng.choice(6, row % 3 + 1, replace=False)] = 1
    x = (y @ rng.randn(6, 12) + 0.5 * rng.randn(400, 12)).astype(np.float32)
    np.savez(tmp_path / "known.npz", X_train=x, X_test=x[:100], Y_train=y, Y_test=y[:100],
             label_names=np.array([f"c{i}" for i in range(6)]),
             feature_names=np.array([f"f{i}" for i in range(12)]))
    made = invoke("prepare", "features", "--npz", tmp_path / "known.npz", "--name", "known")
    assert made.exit_code == 0, made.output
    return cache_dir


def test_estimate_k_command(known_k, tmp_path):
    out = tmp_path / "k.json"
    result = invoke("estimate-k", "--dataset", "known", "--labeled", "5,25", "--sweep", "10",
                    "--json", out)
    assert result.exit_code == 0, result.output
    assert "|   5 |" in result.output and "k sweep in I_5:" in result.output
    document = json.loads(out.read_text())
    assert [r["labeled"] for r in document["intervals"]] == [5, 25]
    for record in document["intervals"]:
        assert record["k_true"] == pytest.approx(800 / 400, abs=0.01)  # 1, 2, 3 in turn
        assert record["low"] <= 2.0 <= record["high"] and record["draws"] == 100_000
        assert record["sweep"][0] == record["low"] and record["sweep"][-1] == record["high"]
        assert len(record["sweep"]) == 10
    bad = invoke("estimate-k", "--dataset", "known", "--labeled", "500")
    assert bad.exit_code == 1 and "between 1 and the 400 training images" in bad.output


def test_train_linear_with_k_estimated_from_five_images(known_k):
    result = invoke("train-linear", "--dataset", "known", "--loss", "epr,role", "--param",
                    "k=estimate:5", "--epochs", "2", "--lr", "1e-2", "--bsize", "16", "--run-id",
                    "est", "--quiet", "--no-plots", "--device", "cpu")
    assert result.exit_code == 0, result.output
    for loss in ("epr", "role"):
        document = load_results(known_k / "known" / "runs" / loss / "est")
        record = document["grid"]["params_estimates"]["k"][0]
        assert document["grid"]["params_source"]["k"] == "estimate"
        assert record["labeled"] == 5 and record["seed"] == 1200
        assert document["selection"]["params"]["k"] == record["value"]
        assert record["k_true"] == pytest.approx(2.0, abs=0.01)
    bad = invoke("train-linear", "--dataset", "known", "--loss", "an-ls", "--param",
                 "eps_pos=estimate:5", "--run-id", "bad")
    assert bad.exit_code == 1 and "cannot be estimated" in bad.output
    bad = invoke("train-linear", "--dataset", "known", "--loss", "epr", "--param", "k=estimate:x",
                 "--run-id", "bad")
    assert bad.exit_code == 2 and "estimate:M or estimate:M:SEED" in bad.output
