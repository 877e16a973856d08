"""Resampled per-class AP of many runs at once, each of one or several seeds.

Resample ``b`` draws the test images once (:meth:`Resampling.image_counts`, shared by every
run scored on those images: their comparisons are paired) and, for a run of several seeds,
the seeds (:meth:`Resampling.seed_counts`); the run's per-class AP in that resample is the mean,
over the drawn seeds, of each seed's AP on the drawn images. Resamples are processed a block at
a time (the block sized to :data:`BLOCK_ELEMENTS`), the runs of a block on ``workers`` threads
(NumPy and SciPy release the interpreter lock in their loops).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from featcache.stats.resample import Resampling
from featcache.stats.weighted_ap import RankedClasses

#: float32 elements of one block's largest array (a run's segment sums, or the image counts)
BLOCK_ELEMENTS = 1 << 22


@dataclass
class Scored:
    """One run's scores on the test images: every seed's, ranked, and its resampling key."""

    key: str
    seeds: list[RankedClasses]

    @property
    def rows(self) -> int:
        return self.seeds[0].rows


def cpus() -> int:
    """CPUs this process may run on (the default number of threads)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resampled_ap(runs: Sequence[Scored], plan: Resampling,
                 workers: int | None = None) -> list[np.ndarray]:
    """Per-class AP (resamples, L) of each run in every resample; the runs must share their
    test images (the same rows, in the same order). ``workers``: threads (default: the CPUs)."""
    if not runs:
        return []
    workers = cpus() if workers is None else workers
    rows = {run.rows for run in runs}
    if len(rows) > 1:
        raise ValueError(f"runs scored on different numbers of test images ({sorted(rows)})")
    n = rows.pop()
    widest = max(max(ranked.sums for ranked in run.seeds) for run in runs)
    block = max(1, min(plan.resamples, BLOCK_ELEMENTS // max(widest, n, 1)))
    seed_counts = [plan.seed_counts(len(run.seeds), run.key) for run in runs]
    out = [np.zeros((plan.resamples, run.seeds[0].classes)) for run in runs]
    tasks = [(r, s) for r, run in enumerate(runs) for s in range(len(run.seeds))]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for start in range(0, plan.resamples, block):
            stop = min(start + block, plan.resamples)
            counts = plan.image_counts(n, start, stop)

            def one(task: tuple[int, int], counts=counts) -> np.ndarray:
                r, s = task
                return runs[r].seeds[s].average_precision(counts)

            found = pool.map(one, tasks) if workers > 1 else map(one, tasks)
            for (r, s), ap in zip(tasks, found, strict=True):
                ap *= seed_counts[r][start:stop, s, None]
                out[r][start:stop] += ap
    for r, run in enumerate(runs):
        out[r] /= len(run.seeds)
    return out
