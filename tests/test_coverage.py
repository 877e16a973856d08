"""Honest metrics: classes without positives count as AP 0 (the reference's convention) and
every run says so, with the mAP over the classes that have positives; small validation splits
are warned about."""

from __future__ import annotations

import json

import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.metrics import average_precision, mean_average_precision
from featcache.protocol.coverage import MIN_VAL_POSITIVES, ClassCoverage, coverage


def test_the_mean_over_present_classes_is_the_protocol_map_rescaled():
    # class 0: ranked 1, 0, 1, 0 -> AP = (1/1 + 2/3) / 2 = 5/6; class 1: its positive first -> 1;
    # class 2: no positive -> 0 (the reference's convention).
    scores = torch.tensor([[0.9, 0.2, 0.5], [0.8, 0.6, 0.5], [0.7, 0.4, 0.5], [0.1, 0.3, 0.5]])
    targets = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float32)
    assert average_precision(scores, targets).tolist() == pytest.approx([5 / 6, 1.0, 0.0])
    protocol = float(mean_average_precision(scores, targets))
    assert protocol == pytest.approx((5 / 6 + 1 + 0) / 3 * 100)
    cover = coverage("test", ["a", "b", "c"], targets)
    assert cover.missing == ["c"] and cover.positives == (2, 1, 0)
    assert cover.map_over_present(protocol) == pytest.approx((5 / 6 + 1) / 2 * 100)
    note = cover.missing_note(protocol)
    assert note.startswith("1 of 3 classes have no positive in the test split (c): they count as AP 0")
    assert "test mAP 61.11 over all classes, 91.67 over the 2 with positives" in note


def test_a_split_with_few_positives_for_many_classes_is_too_small_to_select_on():
    few = ClassCoverage("validation", tuple("abcd"), (MIN_VAL_POSITIVES - 1, 50, 50, 50))
    assert few.too_small_to_select and "fewer than 5 positives for 1 of 4 classes (a)" in few.small_note()
    enough = ClassCoverage("validation", tuple("abcdefgh"), (4, 50, 50, 50, 50, 50, 50, 50))
    assert not enough.too_small_to_select and enough.small_note() is None
    assert coverage("x", ["a", "b"], [[1, -1], [0, 1]]).positives == (1, 1)  # -1 is no positive


def test_a_run_names_classes_without_test_positives_and_their_mean(cache_dir):
    synthetic_dataset(cache_dir, absent_in_test=(4,))
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r",
                    "--epochs", "2", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert ("featcache: warning: 1 of 5 classes have no positive in the test split (c4)"
            in result.output)
    run = cache_dir / "toy" / "runs" / "an" / "r"
    document = json.loads((run / "results.json").read_text())
    assert document["evaluation"]["test"]["classes_without_positives"] == ["c4"]
    assert document["evaluation"]["test"]["positives_per_class"]["c4"] == 0
    selection = document["selection"]
    assert selection["test_ap_per_class"]["c4"] == 0.0
    assert selection["test_map_classes_with_positives"] == pytest.approx(selection["test_map"] * 5 / 4)
    assert selection["val_map_classes_with_positives"] == pytest.approx(selection["val_map"])
    assert any("count as AP 0" in note for note in document["notes"])
    assert "over the 4 with positives" in (run / "summary.md").read_text()
    line = next(li for li in result.stdout.splitlines() if li.startswith("an:"))
    assert f"test {selection['test_map_classes_with_positives']:.2f} over the classes with positives" in line
    table = invoke("table", run)
    assert "toy: 1 class has no positive in the test split (c4); it counts as AP 0" in table.stdout


def test_a_small_validation_split_is_warned_about(cache_dir):
    synthetic_dataset(cache_dir, n_train=30)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r",
                    "--epochs", "1", "--lr", "1e-2", "--bsize", "4", "--quiet", "--no-plots",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "the validation split has fewer than 5 positives for" in result.output
    assert "selecting epochs and configurations on it is noisy" in result.output
