"""How sure a run's test mAP is, and whether one run really beats another.

>>> featcache.api.map_interval("cache/scene/runs/an/docs")          # doctest: +SKIP
Interval(estimate=72.657..., low=70.582..., high=75.243..., level=0.95, resamples=1000, seed=0)
>>> featcache.load_run("cache/scene/runs/an/docs").map_interval()  # doctest: +SKIP
>>> print(featcache.api.compare("cache/scene/runs/role/docs",
...                             "cache/scene/runs/an/docs"))  # doctest: +SKIP
role - an: -0.21 [-0.74, +0.33], wins 24% of 1000 resamples, p 0.46

The numbers are ``featcache table --ci --versus``'s (the same resampling: the same seed gives
the same intervals): a seeded bootstrap over the test images, and over the seeds of a run of
several, from the scores each run keeps in ``test-scores.h5``
(:mod:`featcache.protocol.test_scores`, :mod:`featcache.stats`; docs/uncertainty.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featcache.errors import InputError
from featcache.protocol.rescore import read_test_scores
from featcache.protocol.runs import RESULTS, RunFolder
from featcache.protocol.test_scores import NoScores, TestScores
from featcache.protocol.uncertainty import run_interval
from featcache.stats import Difference, Interval, RankedClasses, Resampling
from featcache.stats.bootstrap import Scored, resampled_ap
from featcache.stats.intervals import interval_of, paired_difference


@dataclass(frozen=True)
class Comparison:
    """Run A against run B on the same resampled test images."""

    a: Interval
    b: Interval
    difference: Difference  # A - B: paired interval, share of resamples A wins, p-value
    per_class: dict[str, tuple[float, float]]  # the paired interval of each class's AP difference
    names: tuple[str, str] = ("A", "B")

    def __str__(self) -> str:
        d = self.difference
        return (f"{self.names[0]} - {self.names[1]}: {d.text()}, wins {d.wins:.0%} of "
                f"{d.interval.resamples} resamples, p {d.p_value:.2g}")


def _run(run) -> tuple[Path, dict, TestScores]:
    """A run (a folder, its results.json, or a :func:`featcache.load_run` object): its folder,
    results document and test scores (an InputError saying why when it has none)."""
    path = Path(getattr(run, "path", run))
    if path.is_file() and path.name in (RESULTS, "best.pt", "test-scores.h5"):
        path = path.parent
    if not path.is_dir():
        raise InputError(f"run {path} does not exist (give a run folder, e.g. "
                         "cache/<dataset>/runs/<loss>/<run-id>)")
    document = RunFolder(path).results()
    try:
        scores = read_test_scores(path, document)
    except NoScores as exc:
        raise InputError(str(exc)) from exc
    if not np.isfinite(scores.scores).all():
        raise InputError(f"{path}: its test scores are not all finite (a head that diverged): "
                         "no interval")
    return path, document, scores


def _estimate(document: dict) -> float:
    """The test mAP a run reports: the mean over its seeds."""
    summary = document.get("summary") or {}
    value = summary.get("test_map_mean")
    return float(document["selection"]["test_map"] if value is None else value)


def _key(document: dict) -> str:
    return f"{document['dataset']}/{document['loss']}"


def map_interval(run, resamples: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """The bootstrap interval of a run's test mAP: its test images resampled (and its seeds,
    when it has several) ``resamples`` times from ``seed``."""
    _, document, scores = _run(run)
    return run_interval(scores, _estimate(document), _key(document),
                        Resampling(resamples, seed, level))


def compare(run_a, run_b, resamples: int = 1000, seed: int = 0,
            level: float = 0.95) -> Comparison:
    """Run A against run B, both scored on the same resampled test images (paired): each
    run's interval, the interval of A - B, the share of resamples A wins (ties count half) and
    a two-sided bootstrap p-value; per class, the paired interval of the AP difference (points).
    The runs must have been scored on the same test images (the same labels file and rows)."""
    path_a, doc_a, a = _run(run_a)
    path_b, doc_b, b = _run(run_b)
    if not a.same_images(b):
        raise InputError(f"{path_a} and {path_b} were not scored on the same test images (other "
                         "labels files, classes or dropped rows): nothing to pair")
    plan = Resampling(resamples, seed, level)
    key_a, key_b = _key(doc_a), _key(doc_b)
    if key_a == key_b:
        key_b += "#b"  # two runs of one loss: their seeds drawn apart
    class_a, class_b = resampled_ap(
        [Scored(key_a, [RankedClasses(s, a.targets) for s in a.scores]),
         Scored(key_b, [RankedClasses(s, b.targets) for s in b.scores])], plan)
    map_a, map_b = class_a.mean(axis=1) * 100, class_b.mean(axis=1) * 100
    estimate_a, estimate_b = _estimate(doc_a), _estimate(doc_b)
    low, high = np.quantile((class_a - class_b) * 100, plan.quantiles(), axis=0)
    return Comparison(interval_of(estimate_a, map_a, plan), interval_of(estimate_b, map_b, plan),
                      paired_difference(estimate_a - estimate_b, map_a - map_b, plan),
                      {name: (float(x), float(y)) for name, x, y in zip(a.classes, low, high,
                                                                        strict=True)},
                      (doc_a["loss"], doc_b["loss"]))
