"""featcache.stats: AP under bootstrap weights equals scikit-learn's on every resample (ties
included), seeds then images, draws independent of blocks and threads, Holm, paired
differences, and intervals that cover the true mAP about 95% of the time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from featcache.metrics import average_precision
from featcache.stats import RankedClasses, Resampling, holm, paired_difference
from featcache.stats import bootstrap as bootstrap_module
from featcache.stats.bootstrap import Scored, resampled_ap
from featcache.stats.intervals import interval_of


def _case(seed: int = 0, rows: int = 40, classes: int = 5):
    """Scores with many ties (one decimal), a rare class and a class without positives."""
    rng = np.random.default_rng(seed)
    y = rng.random((rows, classes)) < [0.3, 0.5, 0.2, 0.05, 0.0][:classes]
    s = np.round(rng.random((rows, classes)) + 0.4 * y, 1).astype(np.float32)
    return s, y


def _sklearn_ap(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-class AP by scikit-learn, AP 0 for a class without positives (featcache's rule)."""
    return np.array([average_precision_score(targets[:, c], scores[:, c])
                     if targets[:, c].any() else 0.0 for c in range(scores.shape[1])])


def test_weighted_ap_equals_sklearn_on_every_resample_with_ties():
    s, y = _case()
    plan = Resampling(60, seed=4)
    ours = RankedClasses(s, y).average_precision(plan.image_counts(len(s)))
    drawn = plan.image_indices(len(s))
    expected = np.stack([_sklearn_ap(s[rows], y[rows]) for rows in drawn])
    assert np.abs(ours - expected).max() <= 1e-9
    assert len(np.unique(s)) < len(s) // 2  # the case has ties
    assert (expected[:, 3] == 0).any() and (expected[:, 3] > 0).any()  # resamples lose class 3
    # weights of one: the run's own AP (featcache.metrics, scikit-learn's definition)
    whole = RankedClasses(s, y).average_precision(np.ones((len(s), 1), np.float32))[0]
    assert np.allclose(whole, average_precision(torch.from_numpy(s),
                                                torch.from_numpy(y.astype(np.float32))).numpy(),
                       rtol=0, atol=1e-12)


def test_seeds_are_resampled_then_the_images():
    rows = 30
    runs = [_case(seed, rows)[0] for seed in range(3)]
    _, y = _case(0, rows)
    plan = Resampling(25, seed=1)
    (ours,) = resampled_ap([Scored("toy/an", [RankedClasses(s, y) for s in runs])], plan)
    counts, drawn = plan.seed_counts(3, "toy/an"), plan.image_indices(rows)
    assert counts.sum(axis=1).tolist() == [3] * 25 and (counts != 1).any()
    expected = np.stack([sum(counts[b, k] * _sklearn_ap(runs[k][drawn[b]], y[drawn[b]])
                             for k in range(3) if counts[b, k]) / 3 for b in range(25)])
    assert np.abs(ours - expected).max() <= 1e-9


def test_draws_do_not_depend_on_blocks_threads_or_the_other_runs(monkeypatch):
    s, y = _case(rows=50)
    plan = Resampling(40, seed=9)
    assert np.array_equal(plan.image_indices(50)[15:], plan.image_indices(50, 15, 40))
    other = Scored("toy/b", [RankedClasses(_case(3, 50)[0], y)])
    alone = resampled_ap([Scored("toy/a", [RankedClasses(s, y)])], plan, workers=1)[0]
    monkeypatch.setattr(bootstrap_module, "BLOCK_ELEMENTS", 7 * 50)  # 7 resamples a block
    together = resampled_ap([other, Scored("toy/a", [RankedClasses(s, y)])], plan, workers=2)[1]
    assert np.array_equal(alone, together)


def test_holm_steps_down():
    assert holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]
    assert holm([0.01, 0.012, 0.015, 0.04]) == [True] * 4  # each <= 0.05 / (m - rank)
    assert holm([0.01, 0.02, 0.03, 0.04]) == [True, False, False, False]
    assert holm([0.2, 0.001]) == [False, True]
    assert holm([]) == []


def test_paired_differences():
    plan = Resampling(99)
    same = paired_difference(0.0, np.zeros(99), plan)
    assert (same.interval.low, same.interval.high, same.wins, same.p_value) == (0, 0, 0.5, 1.0)
    assert not same.excludes_zero
    spread = np.linspace(0.5, 2.5, 99)
    better = paired_difference(1.5, spread, plan)
    assert better.wins == 1.0 and better.excludes_zero
    assert better.p_value == pytest.approx(math.erfc(1.5 / spread.std(ddof=1) / math.sqrt(2)))
    assert better.text() == "+1.50 [+0.55, +2.45]"


def _population_ap(prevalence: float, shift: float) -> float:
    """AP of the binormal population: positives' scores N(shift, 1), negatives' N(0, 1)."""
    from scipy.stats import norm

    t = np.linspace(-8, 12, 100_001)
    above_pos, above_neg = norm.sf(t - shift), norm.sf(t)
    precision = prevalence * above_pos / (prevalence * above_pos + (1 - prevalence) * above_neg)
    return float(np.trapezoid(precision * norm.pdf(t - shift), t))


def test_intervals_cover_the_true_map_about_95_percent_of_the_time():
    """Test sets drawn from a population whose mAP is known: the 95% intervals cover it in
    about 95% of draws (percentile intervals of AP run slightly short: 92 to 94% here)."""
    prevalence, shift = np.array([0.3, 0.2, 0.4]), np.array([1.0, 1.5, 2.0])
    truth = 100 * np.mean([_population_ap(p, m) for p, m in zip(prevalence, shift, strict=True)])
    rng = np.random.default_rng(7)
    draws, rows, covered = 200, 600, 0
    for draw in range(draws):
        y = rng.random((rows, 3)) < prevalence
        s = (rng.standard_normal((rows, 3)) + shift * y).astype(np.float32)
        ranked = RankedClasses(s, y)
        plan = Resampling(200, seed=draw)
        (ap,) = resampled_ap([Scored("sim", [ranked])], plan, workers=1)
        estimate = ranked.average_precision(np.ones((rows, 1), np.float32))[0].mean() * 100
        covered += interval_of(estimate, ap.mean(axis=1) * 100, plan).contains(truth)
    assert 0.90 <= covered / draws <= 0.99


def test_image_counts_are_the_indices_counted_whatever_the_block(monkeypatch):
    """The counts are :meth:`Resampling.image_indices` counted per resample, whether drawn a
    few resamples at a time or all at once, for any range of resamples."""
    import featcache.stats.resample as resample

    plan = Resampling(resamples=150, seed=3)
    for n, start, stop in [(37, 0, 150), (1, 0, 150), (200, 7, 133), (5, 149, 150)]:
        drawn = plan.image_indices(n, start, stop)
        expected = np.stack([np.bincount(row, minlength=n) for row in drawn], axis=1)
        for rows in (1, 64, 1000):
            monkeypatch.setattr(resample, "COUNT_ROWS", rows)
            monkeypatch.setattr(resample, "_KEPT", {})
            found = plan.image_counts(n, start, stop)
            assert found.dtype == np.float32 and np.array_equal(found, expected), (n, rows)


def test_image_counts_of_every_resample_are_kept_read_only_within_the_cap(monkeypatch):
    import featcache.stats.resample as resample

    monkeypatch.setattr(resample, "_KEPT", {})
    monkeypatch.setattr(resample, "KEPT_COUNT_BYTES", 4 * 100 * 1000 + 4 * 50 * 1000)
    plan = Resampling()
    first = plan.image_counts(100)
    assert not first.flags.writeable and plan.image_counts(100) is first
    block = plan.image_counts(100, 10, 20)  # a block of kept counts: a view of them
    assert np.shares_memory(block, first) and np.array_equal(
        block, Resampling()._count_draws(100, 10, 20))
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 5.0
    assert plan.keep_image_counts(50)  # fits beside the first
    assert not plan.keep_image_counts(60)  # would not: drawn again each time, not kept
    assert plan.image_counts(60).flags.writeable
    assert set(resample._KEPT) == {(plan, 100), (plan, 50)}
