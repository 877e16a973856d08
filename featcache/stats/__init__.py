"""Uncertainty of test mAP: the bootstrap over test images (and seeds), fast.

- ``resample``: the seeded resampling plan (:class:`Resampling`): which test images each
  resample draws (the same draws for every run scored on the same images, so comparisons are
  paired) and which seeds;
- ``weighted_ap``: average precision under bootstrap weights without re-sorting
  (:class:`RankedClasses`: each class ranked once, the resamples as weights on the ranked rows);
- ``bootstrap``: resampled per-class AP of runs of one or several seeds, many runs at once;
- ``intervals``: percentile intervals, paired differences with the share of resamples won, and
  Holm's correction for many comparisons.

NumPy and SciPy only: the protocol layer, the report and the Python API build on it.
"""

from featcache.stats.intervals import Difference, Interval, holm, interval_of, paired_difference
from featcache.stats.resample import Resampling
from featcache.stats.weighted_ap import RankedClasses

__all__ = ["Difference", "Interval", "RankedClasses", "Resampling", "holm", "interval_of",
           "paired_difference"]
