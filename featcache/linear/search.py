"""The protocol's hyperparameter search for one loss: every grid point, every seed, one selection.

Grid points that share a seed and a batch size train together as stacked heads
(:func:`featcache.linear.trainer.train_group`). Selection follows the reference code
(:mod:`featcache.protocol.selection`): per configuration the best epoch by validation mAP, then
the configuration with the best validation mAP (ties go to the earlier grid point: batch sizes
outer, learning rates inner).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from featcache.linear.data import LinearData
from featcache.linear.trainer import HeadResult, train_group
from featcache.losses import DataFacts, ResolvedParams, loss_class
from featcache.protocol.grid import (
    BATCH_SIZES,
    LEARNING_RATES,
    LINEAR_EPOCHS,
    GridPoint,
    check_grid,
    grid_points,
)
from featcache.protocol.selection import select_first_best
from featcache.runtime import intraop_threads


@dataclass
class SearchSpec:
    """What to search: the loss, the grid with every loss parameter resolved, the protocol options."""

    loss: str
    learning_rates: Sequence[float] = LEARNING_RATES
    batch_sizes: Sequence[int] = BATCH_SIZES
    #: every loss parameter resolved, or the values given (resolved by :func:`run_search`)
    params: ResolvedParams | Mapping[str, Sequence[float]] = field(default_factory=dict)
    seeds: Sequence[int] = (0,)
    epochs: int = LINEAR_EPOCHS
    val_variant: str = "clean"
    early_stop: str = "none"

    def resolved(self, facts: DataFacts) -> SearchSpec:
        """This spec with every loss parameter resolved on data with ``facts``."""
        if isinstance(self.params, ResolvedParams):
            return self
        return replace(self, params=loss_class(self.loss).resolve(self.params, facts=facts))

    def configs(self, seed: int) -> list[GridPoint]:
        """Grid points of one seed, in the reference's order (batch size outer, lr inner)."""
        return grid_points(self.learning_rates, self.batch_sizes, seed, self.params)

    def settings(self) -> dict:
        """What makes two searches the same search (with the data's identity, the run's
        fingerprint)."""
        return {"loss": self.loss, "learning_rates": list(self.learning_rates),
                "batch_sizes": list(self.batch_sizes), "seeds": list(self.seeds),
                "params": self.params.values, "epochs": self.epochs,
                "val_variant": self.val_variant, "early_stop": self.early_stop}


@dataclass
class SeedResult:
    seed: int
    heads: list[HeadResult]
    selected: HeadResult


@dataclass
class SearchResult:
    spec: SearchSpec
    seeds: list[SeedResult]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def selected(self) -> HeadResult:
        """The selected head of the seed with the best validation mAP (LinearInit starts here)."""
        return max(self.seeds, key=lambda s: s.selected.best_val).selected

    def summary(self) -> dict:
        """Mean and standard deviation over seeds of the selected configurations' metrics."""
        out: dict[str, float | int | None] = {"seeds": len(self.seeds)}
        for key in ("val_map", "val_map_observed", "test_map", "train_map"):
            values = [getattr(s.selected.best, key) for s in self.seeds]
            if any(v is None for v in values):
                out[f"{key}_mean"] = out[f"{key}_std"] = None
                continue
            out[f"{key}_mean"] = statistics.fmean(values)
            out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        return out


def run_search(data: LinearData, spec: SearchSpec, device: torch.device | str = "cpu",
               progress: bool = True, jobs: int | None = None) -> SearchResult:
    """Train and select every configuration of ``spec`` on ``data``.

    On the CPU the groups (one per seed and batch size) run in ``jobs`` threads at once
    (default: one per core), each with one intra-op thread: small per-step tensors gain
    nothing from splitting across cores, and this way the numbers never depend on ``jobs``.
    """
    check_grid(spec.learning_rates, spec.batch_sizes)
    data = loss_class(spec.loss).fit_data(data)
    spec = spec.resolved(data.facts)
    device = torch.device(device)
    groups = [(seed, batch_size) for seed in spec.seeds for batch_size in spec.batch_sizes]

    def train(group: tuple[int, int]) -> list[HeadResult]:
        seed, batch_size = group
        configs = [c for c in spec.configs(seed) if c.batch_size == batch_size]
        return train_group(data, spec.loss, configs, spec.epochs, spec.val_variant,
                           spec.early_stop, device=device, progress=progress,
                           position=groups.index(group) % max(jobs or 1, 1))

    started = time.perf_counter()
    if device.type == "cpu":
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(groups)))
        with intraop_threads(1):
            if jobs == 1:
                trained = [train(g) for g in groups]
            else:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    trained = list(pool.map(train, groups))
    else:
        jobs = 1
        trained = [train(g) for g in groups]
    by_group = dict(zip(groups, trained, strict=True))
    seeds = []
    for seed in spec.seeds:
        heads = [head for batch_size in spec.batch_sizes for head in by_group[(seed, batch_size)]]
        seeds.append(SeedResult(seed=seed, heads=heads,
                                selected=select_first_best(heads, lambda h: h.best_val)))
    return SearchResult(spec=spec, seeds=seeds, seconds=time.perf_counter() - started,
                        notes=list(data.notes))
