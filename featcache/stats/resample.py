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
        resamples), images as rows (the layout :class:`~featcache.stats.RankedClasses` reads)."""
        drawn = self.image_indices(n, start, stop)
        count = drawn.shape[0]
        drawn += np.arange(count)[:, None] * n
        counts = np.bincount(drawn.ravel(), minlength=count * n).reshape(count, n)
        return np.ascontiguousarray(counts.T, dtype=np.float32)

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
