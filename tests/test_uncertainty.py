"""Intervals and paired comparisons of test mAP: the scores runs keep (test-scores.h5), the
interval in results.json, ``featcache table --ci --versus``, the published numbers against our
intervals, older runs scored again, and the Python API against a plain scikit-learn loop."""

from __future__ import annotations

import csv
import io
import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset
from sklearn.metrics import average_precision_score

import featcache.api as api
from featcache import load_run
from featcache.errors import InputError
from featcache.metrics import average_precision
from featcache.protocol.runs import load_results
from featcache.stats import Resampling

FAST = ("--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots",
        "--device", "cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """"voc" (it has published numbers): an, an-ls and wan with seeds 0 and 1; "toy2": an
    and an-ls with one seed."""
    cache = tmp_path_factory.mktemp("uncertainty") / "cache"
    synthetic_dataset(cache, "voc", n_test=80)
    synthetic_dataset(cache, "toy2", seed=1, classes=4)
    for dataset, losses, seeds in (("voc", "an,an-ls,wan", "0,1"), ("toy2", "an,an-ls", "0")):
        result = invoke("train-linear", "--dataset", dataset, "--loss", losses, "--seeds", seeds,
                        "--run-id", "r", "--cache", cache, *FAST)
        assert result.exit_code == 0, result.output
    return cache


def _table(*args) -> str:
    result = invoke("table", *map(str, args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _cells(cache, *args) -> dict:
    document = json.loads(_table(cache / "voc" / "runs", cache / "toy2" / "runs", "--format",
                                 "json", *args))
    return {(row["loss"], dataset): row[dataset] for row in document["rows"]
            for dataset in document["datasets"] if row.get(dataset)} | {"": document}


def test_runs_keep_each_seeds_test_scores_and_their_interval(runs):
    folder = runs / "voc" / "runs" / "wan" / "r"
    document = load_results(folder)
    with h5py.File(folder / "test-scores.h5", "r") as h5:
        scores, seeds = h5["scores"][()], h5["seeds"][()].tolist()
        targets, rows = h5["targets"][()], h5["rows"][()]
    assert scores.shape == (2, 80, 5) and seeds == [0, 1] and rows.tolist() == list(range(80))
    for index, seed in enumerate(document["seeds"]):
        ap = average_precision(torch.from_numpy(scores[index]),
                               torch.from_numpy(targets.astype(np.float32))).numpy() * 100
        recorded = seed["selected"]["test_ap_per_class"]
        assert np.allclose(ap, [recorded[f"c{c}"] for c in range(5)], rtol=0, atol=1e-9)
    interval = document["uncertainty"]["test_map"]
    assert (interval["resamples"], interval["seed"], interval["level"]) == (1000, 0, 0.95)
    assert interval["estimate"] == document["summary"]["test_map_mean"]
    assert interval["low"] < interval["estimate"] < interval["high"]
    assert "seeds are resampled, then the images" in document["uncertainty"]["method"]
    assert api.map_interval(folder).to_json() == interval  # the same resampling
    assert load_run(folder).map_interval().to_json() == interval


def test_table_ci_versus_in_every_format(runs):
    cells = _cells(runs, "--versus", "an")
    whole = cells.pop("")
    assert whole["uncertainty"]["resamples"] == 1000 and whole["uncertainty"]["seed"] == 0
    assert whole["uncertainty"]["comparisons"] == 3  # an-ls and wan on voc, an-ls on toy2
    assert "Holm's correction over the 3 comparisons" in whole["caption"]
    for (loss, dataset), cell in cells.items():
        found = cell["uncertainty"]
        if dataset == "toy2":  # one run, one seed: results.json's own interval
            recorded = load_results(runs / dataset / "runs" / loss / "r")["uncertainty"]
            assert found["interval"] == recorded["test_map"]
        assert found["seeds_resampled"] == ([0, 1] if dataset == "voc" else [0])
        assert found["interval"]["low"] <= cell["mean"] <= found["interval"]["high"]
        if loss == "an":
            assert "versus" not in found
            continue
        versus = found["versus"]
        assert versus["estimate"] == pytest.approx(cell["mean"] - cells[("an", dataset)]["mean"])
        assert 0 <= versus["wins"] <= 1 and 0 <= versus["p_value"] <= 1
        assert isinstance(versus["survives_holm"], bool)
        assert versus["survives_holm"] <= (versus["low"] > 0 or versus["high"] < 0)
    markdown = _table(runs / "voc" / "runs", runs / "toy2" / "runs", "--versus", "an")
    an_ls = cells[("an-ls", "voc")]["uncertainty"]
    interval, versus = an_ls["interval"], an_ls["versus"]
    assert f"{interval['estimate']:.2f} [{interval['low']:.2f}, {interval['high']:.2f}]" in markdown
    assert f"{versus['estimate']:+.2f} [{versus['low']:+.2f}, {versus['high']:+.2f}]" in markdown
    assert "| voc - an" in markdown and "(reference)" in markdown and "percentile bootstrap" in markdown
    rows = list(csv.DictReader(io.StringIO(_table(runs / "voc" / "runs", "--versus", "an",
                                                  "--format", "csv"))))
    wan = next(row for row in rows if row["loss"] == "wan")
    assert float(wan["voc low"]) == cells[("wan", "voc")]["uncertainty"]["interval"]["low"]
    assert float(wan["voc - an wins"]) == cells[("wan", "voc")]["uncertainty"]["versus"]["wins"]
    latex = _table(runs / "voc" / "runs", "--ci", "--format", "latex")
    assert r"\toprule" in latex and "[" in latex


def test_resamples_and_seed_are_options_and_reproducible(runs):
    first = _cells(runs, "--ci", "--resamples", "200", "--ci-seed", "3")
    again = _cells(runs, "--ci", "--resamples", "200", "--ci-seed", "3")
    other = _cells(runs, "--ci", "--resamples", "200", "--ci-seed", "4")
    interval = first[("an", "voc")]["uncertainty"]["interval"]
    assert (interval["resamples"], interval["seed"]) == (200, 3)
    assert first == again and interval != other[("an", "voc")]["uncertainty"]["interval"]


def test_published_numbers_against_our_intervals(runs):
    cells = _cells(runs, "--ci")
    for loss in ("an", "an-ls", "wan"):
        cell = cells[(loss, "voc")]
        interval = cell["uncertainty"]["interval"]
        assert cell["published"] is not None
        assert cell["uncertainty"]["published_inside"] == (
            interval["low"] <= cell["published"] <= interval["high"])
    assert cells[("an", "toy2")]["uncertainty"]["published_inside"] is None
    markdown = _table(runs / "voc" / "runs", "--ci")
    assert "voc published inside" in markdown and "| no " in markdown  # synthetic: far off


def test_an_older_run_without_test_scores_is_scored_again(runs, tmp_path):
    """A run made before test-scores.h5: its best seed's scores come from best.pt and the
    features file (the same numbers), said in a note when the run has other seeds."""
    cache = tmp_path / "cache"
    shutil.copytree(runs / "toy2", cache / "toy2")
    shutil.copytree(runs / "voc", cache / "voc")
    for dataset, loss in (("toy2", "an"), ("voc", "an-ls")):
        (cache / dataset / "runs" / loss / "r" / "test-scores.h5").unlink()
    before, after = _cells(runs, "--versus", "an"), _cells(cache, "--versus", "an")
    assert after[("an", "toy2")]["uncertainty"] == before[("an", "toy2")]["uncertainty"]
    assert after[("an-ls", "toy2")]["uncertainty"] == before[("an-ls", "toy2")]["uncertainty"]
    best = load_results(cache / "voc" / "runs" / "an-ls" / "r")["selection"]["seed"]
    assert after[("an-ls", "voc")]["uncertainty"]["seeds_resampled"] == [best]
    assert any("only seed" in note and "an-ls" in note for note in after[""]["notes"])
    # scores that cannot be had: the cell says why, the table still prints
    (cache / "voc" / "runs" / "an-ls" / "r" / "best.pt").unlink()
    broken = _cells(cache, "--ci")[("an-ls", "voc")]["uncertainty"]
    assert broken["interval"] is None and "cannot be computed again" in broken["reason"]
    assert "[no interval]" in _table(cache / "voc" / "runs", "--ci")
    # scores of a head that diverged (NaN): no interval, said; the API refuses in one line
    with h5py.File(cache / "voc" / "runs" / "wan" / "r" / "test-scores.h5", "r+") as h5:
        h5["scores"][0, 0, 0] = np.nan
    diverged = _cells(cache, "--ci")[("wan", "voc")]["uncertainty"]
    assert diverged["interval"] is None and "cannot be ranked" in diverged["reason"]
    with pytest.raises(InputError, match="not all finite"):
        api.map_interval(cache / "voc" / "runs" / "wan" / "r")


def test_bad_options_are_one_clear_error(runs):
    result = invoke("table", str(runs / "voc" / "runs"), "--versus", "nope")
    assert result.exit_code != 0
    assert "--versus nope: no run of that loss among the runs tabulated (an, an-ls, wan)" in (
        result.output)
    result = invoke("table", str(runs / "voc" / "runs"), "--per-class", "--ci")
    assert result.exit_code != 0 and "featcache report" in result.output
    result = invoke("table", str(runs / "voc" / "runs"), "--ci", "--resamples", "0")
    assert result.exit_code != 0 and "--resamples" in result.output


def _sklearn_maps(scores: np.ndarray, targets: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """mAP (percent) of each resample by a plain per-resample scikit-learn loop."""
    return np.array([100 * np.mean([average_precision_score(targets[rows, c], scores[rows, c])
                                    if targets[rows, c].any() else 0.0
                                    for c in range(targets.shape[1])]) for rows in drawn])


def test_api_intervals_and_comparisons_equal_a_plain_sklearn_loop(runs):
    a, b = runs / "toy2" / "runs" / "an-ls" / "r", runs / "toy2" / "runs" / "an" / "r"
    plan = Resampling(40, seed=5)
    maps = {}
    for folder in (a, b):
        with h5py.File(folder / "test-scores.h5", "r") as h5:
            scores, targets = h5["scores"][0], h5["targets"][()]
        maps[folder] = _sklearn_maps(scores, targets, plan.image_indices(len(targets)))
    interval = api.map_interval(a, resamples=40, seed=5)
    low, high = np.quantile(maps[a], [0.025, 0.975])
    assert abs(interval.low - low) <= 1e-9 and abs(interval.high - high) <= 1e-9
    compared = api.compare(load_run(a), b, resamples=40, seed=5)
    difference = maps[a] - maps[b]
    low, high = np.quantile(difference, [0.025, 0.975])
    assert abs(compared.difference.interval.low - low) <= 1e-9
    assert abs(compared.difference.interval.high - high) <= 1e-9
    assert compared.difference.wins == pytest.approx(
        ((difference > 0).sum() + 0.5 * (difference == 0).sum()) / 40, abs=1e-12)
    assert abs(compared.b.low - np.quantile(maps[b], 0.025)) <= 1e-9
    assert set(compared.per_class) == {"c0", "c1", "c2", "c3"}
    assert str(compared).startswith("an-ls - an: ")
    with pytest.raises(InputError, match="not scored on the same test images"):
        api.compare(a, runs / "voc" / "runs" / "an" / "r")
