"""The seeded resampling plan of a bootstrap over test images (and over seeds).

Resample ``b`` of ``n`` test images draws ``n`` row indices with replacement: ``floor(n u)``
of ``n`` uniform numbers from the generator seeded by (resampling seed, ``n``), taken from its
``b n``-th draw on (each resample takes exactly ``n`` draws). The draws thus do not depend on
how many resamples are made at once, on the run or on the order runs are scored in, so every
run scored on the same test images sees the same resampled images (the pairing a comparison
needs). Seeds are drawn per run from a generator seeded by the resampling seed and the run's
key (``dataset/loss``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

#: the default number of resamples and level of an interval
RESAMPLES = 1000
LEVEL = 0.95
#: resamples drawn at a time by :meth:`Resampling.image_counts` (its working arrays stay small)
COUNT_ROWS = 64
#: bytes of image counts a process keeps (every resample's counts of a number of images, drawn
#: once for all the runs scored on those images; larger ones are drawn block by block each time)
KEPT_COUNT_BYTES = 64 << 20


@dataclass(frozen=True)
class Resampling:
    """How many resamples, from which seed, for intervals of which level."""

    resamples: int = RESAMPLES
    seed: int = 0
    level: float = LEVEL

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ValueError(f"resamples must be at least 1, not {self.resamples}")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"level must lie between 0 and 1, not {self.level}")

    def image_indices(self, n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows drawn by resamples ``start`` to ``stop`` (default: all) of ``n`` images: an
        int64 array (resamples, n)."""
        stop = self.resamples if stop is None else stop
        bits = np.random.PCG64(np.random.SeedSequence([self.seed, n]))
        bits.advance(start * n)  # each resample takes exactly n draws: resample b starts at b n
        uniform = np.random.Generator(bits).random((max(stop - start, 0), n))
        return np.minimum((uniform * n).astype(np.int64), n - 1)

    def image_counts(self, n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """How often each image is drawn by resamples ``start`` to ``stop``: float32 (n,
        resamples), images as rows (the layout :class:`~featcache.stats.RankedClasses` reads).
        Read-only where the counts of every resample are kept (:meth:`keep_image_counts`)."""
        stop = self.resamples if stop is None else stop
        kept = _KEPT.get((self, n))
        if kept is not None:
            return kept if (start, stop) == (0, self.resamples) else kept[:, start:stop]
        counts = self._count_draws(n, start, stop)
        if start == 0 and stop == self.resamples:
            _keep(self, n, counts)
        return counts

    def keep_image_counts(self, n: int) -> bool:
        """Make and keep the counts of every resample of ``n`` images, for every later run
        scored on them (they are the same), where they fit :data:`KEPT_COUNT_BYTES`: whether
        they are kept."""
        if (self, n) not in _KEPT and _fits(4 * n * self.resamples):  # float32 counts
            self.image_counts(n)
        return (self, n) in _KEPT

    def _count_draws(self, n: int, start: int, stop: int) -> np.ndarray:
        """The counts of resamples ``start`` to ``stop``, drawn :data:`COUNT_ROWS` resamples at a
        time (the draws of :meth:`image_indices`, in the same order, without its whole
        (resamples, n) arrays)."""
        count = max(stop - start, 0)
        bits = np.random.PCG64(np.random.SeedSequence([self.seed, n]))
        bits.advance(start * n)
        generator = np.random.Generator(bits)
        counts = np.empty((n, count), dtype=np.float32)
        uniform = np.empty((min(COUNT_ROWS, count), n))
        for first in range(0, count, COUNT_ROWS):
            rows = min(COUNT_ROWS, count - first)
            block = generator.random(out=uniform[:rows])
            drawn = np.minimum((block * n).astype(np.int64), n - 1)
            drawn += np.arange(rows)[:, None] * n
            counts[:, first:first + rows] = np.bincount(
                drawn.ravel(), minlength=rows * n).reshape(rows, n).T
        return counts

    def seed_counts(self, seeds: int, key: str) -> np.ndarray:
        """How often each of ``seeds`` seeds is drawn by every resample: int64 (resamples,
        seeds); all ones for one seed."""
        if seeds == 1:
            return np.ones((self.resamples, 1), dtype=np.int64)
        rng = np.random.default_rng([self.seed, seeds, zlib.crc32(key.encode())])
        drawn = rng.integers(0, seeds, (self.resamples, seeds))
        drawn += np.arange(self.resamples)[:, None] * seeds
        return np.bincount(drawn.ravel(), minlength=self.resamples * seeds).reshape(
            self.resamples, seeds)

    def quantiles(self) -> tuple[float, float]:
        """The lower and upper quantile of a two-sided interval of :attr:`level`."""
        tail = (1.0 - self.level) / 2
        return tail, 1.0 - tail

    def to_json(self) -> dict:
        return {"resamples": self.resamples, "seed": self.seed, "level": self.level}


#: the counts of every resample of a plan and a number of images, kept (read-only)
_KEPT: dict[tuple[Resampling, int], np.ndarray] = {}


def _fits(nbytes: int) -> bool:
    """Whether ``nbytes`` more counts stay within :data:`KEPT_COUNT_BYTES`."""
    return nbytes + sum(counts.nbytes for counts in _KEPT.values()) <= KEPT_COUNT_BYTES


def _keep(plan: Resampling, n: int, counts: np.ndarray) -> None:
    if _fits(counts.nbytes):
        counts.flags.writeable = False
        _KEPT[(plan, n)] = counts
