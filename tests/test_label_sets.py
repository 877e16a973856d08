"""Conformal label sets calibrated on single positives: the rules by hand, their guarantee on
exchangeable data, and what runs record, ``predict --sets``, ``table --sets``, the report and the
API do with them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.stats.label_sets import (
    calibrate,
    conformal_index,
    evaluate,
    shares,
    single_positives,
    smallest_top_k,
)

# three calibration rows of three classes; each row's single positive
SCORES = np.array([[0.9, 0.5, 0.1], [0.2, 0.6, 0.7], [0.3, 0.8, 0.4]])
POSITIVES = np.array([1, 0, 2])


def test_the_conformal_position():
    assert conformal_index(9, 0.9) == 8  # ceil(10 * 0.9) = 9th smallest
    assert conformal_index(8, 0.9) is None  # ceil(9 * 0.9) = 9 > 8: every class kept
    assert conformal_index(19, 0.95) == 18 and conformal_index(18, 0.95) is None
    assert conformal_index(3, 0.5) == 1  # ceil(4 * 0.5) = 2nd smallest
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        conformal_index(10, 1.0)


def test_the_three_rules_by_hand():
    # rank: r_y - p_y = 2 - 0.5, 3 - 0.2, 2 - 0.4 = 1.5, 2.8, 1.6; level 0.5: 2nd smallest, 1.6
    rank = calibrate(SCORES, POSITIVES, 0.5, "rank")
    assert rank.cut == pytest.approx(1.6) and rank.rows == 3
    assert rank.top() == (1, pytest.approx(0.4))  # top 1, and the 2nd where p >= 0.4
    new = np.array([[0.7, 0.45, 0.1], [0.7, 0.35, 0.1], [0.1, 0.2, 0.3]])
    assert rank.sets(new).tolist() == [[True, True, False], [True, False, False],
                                       [False, False, True]]
    assert rank.to_json(["a", "b", "c"]) == {
        "method": "rank", "level": 0.5, "calibration_rows": 3, "score": pytest.approx(1.6),
        "top_k": 1, "next_probability": pytest.approx(0.4)}
    # threshold: p_y = 0.5, 0.2, 0.4; the ceil(4 * 0.5) = 2nd largest, 0.4
    threshold = calibrate(SCORES, POSITIVES, 0.5, "threshold")
    assert threshold.cut == pytest.approx(0.4)
    assert threshold.sets(new).tolist() == [[True, True, False], [True, False, False],
                                            [False, False, False]]
    assert "probability at least 0.4" in threshold.describe(["a", "b", "c"])
    # class: one row per class, too few for 0.5 (needs 1 row: ceil(2 * 0.5) = 1 <= 1): its p_y
    per_class = calibrate(SCORES, POSITIVES, 0.5, "class")
    assert per_class.cut == pytest.approx((0.2, 0.5, 0.4))
    at_09 = calibrate(SCORES, POSITIVES, 0.9, "class")  # one row cannot calibrate 0.9
    assert at_09.cut == (-math.inf,) * 3 and at_09.sets(new).all()
    assert at_09.to_json(["a", "b", "c"])["per_class"] == {"a": None, "b": None, "c": None}
    assert "3 of 3 classes always kept" in at_09.describe(["a", "b", "c"])
    with pytest.raises(ValueError, match="choose one of rank, threshold, class"):
        calibrate(SCORES, POSITIVES, 0.5, "top")


def test_single_positives_draw_one_of_several():
    observed = np.array([[1, 0, 0], [0, 0, 0], [0, 1, -1], [1, 1, 0]])
    rows, positives = single_positives(observed, seed=3)
    assert rows.tolist() == [0, 2, 3] and positives[:2].tolist() == [0, 1]
    assert positives[2] in (0, 1)
    assert single_positives(observed, seed=3)[1].tolist() == positives.tolist()  # seeded


def test_shares_sizes_and_the_smallest_top_k_by_hand():
    scores = np.array([[0.9, 0.8, 0.1, 0.2], [0.1, 0.2, 0.9, 0.3]])
    targets = np.array([[1, 0, 1, 0], [0, 1, 1, 1]])
    sets = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=bool)
    assert shares(sets, targets).tolist() == [0.5, pytest.approx(2 / 3)]
    # top-1 holds 1/2 and 1/3 (mean 0.417), top-2 1/2 and 2/3, top-3 1/2 and 1, top-4 all
    assert smallest_top_k(scores, targets, 0.4) == 1
    assert smallest_top_k(scores, targets, 0.5) == 2
    assert smallest_top_k(scores, targets, 0.75) == 3
    assert smallest_top_k(scores, targets, 0.9) == 4
    rule = calibrate(SCORES[:, :3], POSITIVES, 0.5, "threshold")
    found = evaluate(rule, np.array([[0.5, 0.1, 0.45]]), np.array([[1, 1, 0]]))
    assert found["share"]["estimate"] == 0.5 and found["mean_size"]["estimate"] == 2.0
    assert found["rows"] == 1 and found["smallest_top_k"] == 1 and found["empty_sets"] == 0


@pytest.mark.parametrize("method", ["rank", "threshold", "class"])
def test_the_sets_hold_a_random_positive_at_the_level_on_exchangeable_rows(method):
    """Many draws of calibration and test rows from one distribution: the share held,
    averaged over the draws, is at least the level (the guarantee is in expectation)."""
    rng = np.random.default_rng(0)
    classes, held = 5, []
    for _ in range(60):
        truth = rng.random((300, classes)) < 0.35
        truth[np.arange(300), rng.integers(0, classes, 300)] = True
        scores = np.clip(0.5 * truth + 0.6 * rng.random((300, classes)), 0, 1)
        observed = np.array([np.eye(classes, dtype=int)[rng.choice(np.flatnonzero(row))]
                             for row in truth[:150]])
        rows, positives = single_positives(observed)
        rule = calibrate(scores[:150][rows], positives, 0.8, method)
        held.append(shares(rule.sets(scores[150:]), truth[150:]).mean())
    assert np.mean(held) >= 0.8 - 0.01, np.mean(held)
    assert np.mean(held) <= 0.9  # and not every class: the sets are informative


# ------------------------------------------------------------------ runs, commands, API
@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One stage-two run on a synthetic set, trained once for the tests that read it."""
    cache = tmp_path_factory.mktemp("sets") / "cache"
    synthetic_dataset(cache)
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r1",
                    "--epochs", "3", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots",
                    "--cache", cache)
    assert result.exit_code == 0, result.output
    return cache, cache / "toy" / "runs" / "an" / "r1"


def test_a_run_records_its_sets_and_predict_uses_them(toy_run):
    from featcache import load_run

    cache, run_dir = toy_run
    document = json.loads((run_dir / "results.json").read_text())
    record = document["label_sets"]
    assert (run_dir / record["scores"]).is_file() and record["method"] == "rank"
    assert record["calibration"]["rows"] == document["sizes"]["val"] == 24
    assert [entry["level"] for entry in record["levels"]] == [0.8, 0.9, 0.95]
    test = record["levels"][1]["test"]
    assert test["rows"] == 60 and test["share"]["low"] <= test["share"]["estimate"] <= 1
    run = load_run(run_dir)
    rule = run.label_set_rule(0.9)
    assert rule.to_json(run.classes) == {k: v for k, v in record["levels"][1].items()
                                         if k != "test"}
    features = cache / "toy" / "features-toy.h5"
    result = invoke("predict", "--run", run_dir, "--features", features, "--split", "test",
                    "--sets", "0.9", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    expected = run.predict_sets(features, 0.9)
    got = [[c["class"] for c in line["labels"]] for line in lines]
    assert got == [[run.classes[i] for i in np.argsort(-p, kind="stable") if row[i]]
                   for p, row in zip(run.predict_proba(features)[-60:], expected[-60:],
                                     strict=True)]
    assert "label sets at level 0.9 (rank)" in result.stderr
    assert "24 validation rows" in result.stderr and "val-scores.h5" in result.stderr
    csv = invoke("predict", "--run", run_dir, "--features", features, "--split", "test",
                 "--sets", "0.8", "--sets-method", "threshold")
    header = csv.stdout.splitlines()[0].split(",")
    assert header[-1] == "labels" and len(header) == 2 + len(run.classes)
    refused = invoke("predict", "--run", run_dir, "--features", features, "--sets", "0.9",
                     "--top-k", "2")
    assert refused.exit_code != 0 and "without --top-k and --threshold" in refused.output
    (run_dir / "val-scores.h5").rename(run_dir / "kept.h5")
    try:
        missing = invoke("predict", "--run", run_dir, "--features", features, "--sets", "0.9")
    finally:
        (run_dir / "kept.h5").rename(run_dir / "val-scores.h5")
    assert missing.exit_code != 0 and "has no val-scores.h5" in missing.output
    assert "featcache train-linear --dataset toy --loss an --run-id r1" in missing.output


def test_table_and_report_show_the_sets_beside_map(toy_run):
    cache, run_dir = toy_run
    shown = invoke("table", cache / "toy" / "runs", "--sets", "0.9")
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.stdout.splitlines() if line.startswith("| an "))
    entry = json.loads((run_dir / "results.json").read_text())["label_sets"]["levels"][1]
    assert f"{entry['test']['share']['estimate']:.3f} [" in row
    assert row.rstrip(" |").endswith(f" {entry['test']['smallest_top_k']}")
    flat = invoke("table", cache / "toy" / "runs", "--sets", "0.85", "--sets-method", "class",
                  "--format", "json")
    computed = json.loads(flat.stdout)[0]  # a level the run did not record: computed again
    assert computed["level"] == 0.85 and computed["method"] == "class"
    assert 0 < computed["share"] <= 1 and computed["calibration rows"] == 24
    assert invoke("table", cache / "toy" / "runs", "--sets", "0.9", "--ci").exit_code != 0
    report = invoke("report", cache / "toy", "--out", cache / "r.html")
    assert report.exit_code == 0, report.output
    page = (cache / "r.html").read_text()
    assert 'id="label-sets"' in page and "share @0.9" in page


def test_the_estimator_calibrates_on_its_validation_rows():
    from featcache import SPMLClassifier
    from featcache.errors import OptionError

    rng = np.random.default_rng(1)
    truth = rng.random((200, 4)) < 0.3
    truth[np.arange(200), rng.integers(0, 4, 200)] = True
    X = (truth @ rng.standard_normal((4, 8)) + 0.5 * rng.standard_normal((200, 8))).astype("f4")
    y = np.array([rng.choice(np.flatnonzero(row)) for row in truth])
    clf = SPMLClassifier(loss="an", epochs=3, lr=1e-2, validation_fraction=0.2).fit(X, y)
    assert clf.calibration_.scores.shape == (40, 4)
    sets = clf.predict_sets(X, 0.9)
    assert sets.shape == (200, 4) and sets.dtype == np.int64 and sets.sum(1).min() >= 1
    assert (clf.predict_sets(X, 0.5).sum() <= sets.sum())
    with pytest.raises(OptionError, match="validation_fraction"):
        SPMLClassifier(loss="an", epochs=1).fit(X, y).predict_sets(X)
