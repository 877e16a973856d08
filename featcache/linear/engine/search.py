"""The protocol's hyperparameter search for one loss: every grid point, every seed, one selection.

Grid points that share a seed and a batch size train together as stacked heads
(:class:`featcache.linear.engine.trainer.GroupTrainer`), each group on one worker. Selection
follows the reference code
(:mod:`featcache.protocol.selection`): per configuration the best epoch by validation mAP, then
the configuration with the best validation mAP (ties go to the earlier grid point: batch sizes
outer, learning rates inner).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from featcache.linear.data import TrainingSplits
from featcache.linear.engine.evaluation import HeadResult
from featcache.linear.engine.member import Member
from featcache.linear.engine.schedule import Outcomes, SharedWorkers
from featcache.linear.engine.stacking import (
    Stackable,
    StackedGroup,
    fit_all,
    stacked_groups,
    unstacked,
)
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
from featcache.runtime import Ranks, usable_cpus


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
    #: the search mode's name when it is not the default one (:mod:`featcache.linear.search_modes`;
    #: e.g. weight decays beside the learning rates, given for batch ``lr_reference_batch``)
    search: str | None = None
    weight_decays: Sequence[float] = (0.0,)
    lr_reference_batch: int | None = None

    def resolved(self, facts: DataFacts) -> SearchSpec:
        """This spec with every loss parameter resolved on data with ``facts``."""
        if isinstance(self.params, ResolvedParams):
            return self
        return replace(self, params=loss_class(self.loss).resolve(self.params, facts=facts))

    @property
    def resolved_params(self) -> ResolvedParams:
        """Every loss parameter, once resolved (:meth:`resolved`; no parameter given: none)."""
        if isinstance(self.params, ResolvedParams):
            return self.params
        if not self.params:
            return ResolvedParams()
        raise TypeError(f"{self.loss}'s parameters are not resolved yet (SearchSpec.resolved)")

    def configs(self, seed: int) -> list[GridPoint]:
        """Grid points of one seed, in the reference's order (batch size outer, lr inner)."""
        return grid_points(self.learning_rates, self.batch_sizes, seed, self.resolved_params,
                           self.weight_decays, self.lr_reference_batch)

    def settings(self) -> dict:
        """What makes two searches the same search (with the data's identity, the run's
        fingerprint)."""
        settings: dict[str, Any] = {
            "loss": self.loss, "learning_rates": list(self.learning_rates),
            "batch_sizes": list(self.batch_sizes), "seeds": list(self.seeds),
            "params": self.resolved_params.values, "epochs": self.epochs,
            "val_variant": self.val_variant, "early_stop": self.early_stop}
        if self.search is not None:  # the default mode's runs keep their fingerprints
            settings.update(search=self.search, weight_decays=list(self.weight_decays),
                            lr_reference_batch=self.lr_reference_batch)
        return settings


@dataclass
class SeedResult:
    seed: int
    heads: list[HeadResult]
    selected: HeadResult


@dataclass
class SearchResult:
    spec: SearchSpec
    seeds: list[SeedResult]
    #: the wall time the search took; trained beside other searches (``--loss all``), its
    #: share of the time they took together (:attr:`shared` says how)
    seconds: float
    notes: list[str] = field(default_factory=list)
    probe: dict | None = None  # the probe search's record (:mod:`featcache.linear.search_modes.probe`)
    #: trained beside other searches: how its ``seconds`` were shared out (:func:`shared_record`)
    shared: dict | None = None

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


def run_search(data: TrainingSplits, spec: SearchSpec, device: torch.device | str = "cpu",
               progress: bool = True, jobs: int | None = None,
               job: Ranks | None = None) -> SearchResult:
    """Train and select every configuration of ``spec`` on ``data``.

    Groups (one per seed and batch size) train independently
    (:mod:`featcache.linear.engine.workers`): on the CPU ``jobs`` of them at once in worker
    processes (default: one per core), each with one intra-op thread; under ``torchrun``
    (``job``) spread over the ranks. The numbers never depend on ``jobs`` or on the number of
    ranks.
    """
    return run_searches(data, [spec], device, progress, jobs, job)[0]


@dataclass
class _Search:
    """One search being run: its data (fitted to the loss), its resolved spec, its groups."""

    data: TrainingSplits
    spec: SearchSpec
    groups: list[tuple[int, int]]
    done: dict[tuple[int, int], list[HeadResult]] = field(default_factory=dict)
    span: tuple[float, float] = (math.inf, -math.inf)  # wall-clock start and end of its groups
    pieces: dict[tuple[int, int], int] = field(default_factory=dict)  # group -> its stacked piece

    def timed(self, began: float, ended: float) -> None:
        self.span = (min(self.span[0], began), max(self.span[1], ended))

    def result(self, seconds: float, shared: dict | None = None) -> SearchResult:
        seeds = []
        for seed in self.spec.seeds:
            heads = [h for bs in self.spec.batch_sizes for h in self.done[(seed, bs)]]
            seeds.append(SeedResult(seed=seed, heads=heads,
                                    selected=select_first_best(heads, lambda h: h.best_val)))
        return SearchResult(spec=self.spec, seeds=seeds, seconds=seconds,
                            notes=list(self.data.notes), shared=shared)


def run_searches(data: TrainingSplits, specs: Sequence[SearchSpec],
                 device: torch.device | str = "cpu", progress: bool = True,
                 jobs: int | None = None, job: Ranks | None = None,
                 on_done: Callable[[SearchResult], None] | None = None,
                 on_idle: Callable[[], None] | None = None) -> list[SearchResult]:
    """Several searches on the same data (``--loss all``) in one pass: the losses that share their
    data, kind of head, seed and batch size train as one stacked group
    (:mod:`featcache.linear.engine.stacking`; each loss's numbers are the ones it gets alone), and
    the groups share the workers (:mod:`featcache.linear.engine.schedule`). ``on_done`` sees each
    search as soon as all its groups are trained (in the order they finish; under ``torchrun`` once
    every rank is done, in the order of the groups). A search's ``seconds`` run from its first
    group's start to its last group's end; with several searches, each gets its share of the
    wall time they took together (:mod:`featcache.linear.engine.timeshare`, recorded in
    :attr:`SearchResult.shared`), so that their seconds add up to at most that time.
    ``on_idle()`` runs once in this process when a CPU worker is first left without a group
    while others still train (e.g. to prepare what writing the results needs).
    """
    device = torch.device(device)
    searches, groups = _planned(data, specs, captures_apart(device))
    results: list[SearchResult | None] = [None] * len(searches)

    # under torchrun every group's outcome arrives once all ranks are done: the searches are
    # finished after all of them, when the timeline holds every task (their shares are exact)
    together = job is not None and job.world > 1
    complete: list[int] = []

    def finish(index: int) -> None:
        search = searches[index]
        span = search.span[1] - search.span[0]
        if len(searches) == 1:
            result = search.result(span)
        else:
            seconds, shared = shared_record(index, searches, outcomes, time.time())
            result = search.result(seconds, shared | {"span_seconds": span})
        results[index] = result
        if on_done is not None:
            on_done(result)

    def keep(index: int, key: tuple[int, int], heads: list[HeadResult], began: float,
             ended: float, piece: int) -> None:
        search = searches[index]
        search.done[key] = heads
        search.pieces[key] = piece
        search.timed(began, ended)
        if len(search.done) == len(search.groups):
            if together:
                complete.append(index)
            else:
                finish(index)

    outcomes = Outcomes(keep, idle=on_idle)
    SharedWorkers(groups, device, progress, max(1, jobs or usable_cpus()), job, outcomes).run()
    for index in complete:
        finish(index)
    done = [result for result in results if result is not None]
    if len(done) != len(results):
        raise RuntimeError("a search finished without training any group")
    return done


#: how a shared search's seconds were counted (results.json ``timings.shared.rule``)
SHARE_RULE = ("each instant of the run split equally among the groups training or evaluating "
              "then, a group's share among its losses by their heads")


def shared_record(index: int, searches: Sequence[_Search], outcomes: Outcomes,
                  now: float) -> tuple[float, dict]:
    """Search ``index``'s share of the wall time of the searches trained together, and what
    results.json records of it: every group it trained in, with the losses stacked there,
    their heads, the group's share of the wall time (``seconds``) and its tasks' durations
    added up (``busy_seconds``: they overlap other groups')."""
    shares = outcomes.timeline.shares(now)
    seconds, groups = 0.0, []
    for (seed, batch_size), piece in sorted(searches[index].pieces.items()):
        group = outcomes.pieces[piece]
        mine = sum(member.heads for owner, member in group.members if owner == index)
        seconds += shares.get(piece, 0.0) * mine / group.heads
        groups.append({"seed": seed, "batch_size": batch_size,
                       "losses": [searches[owner].spec.loss for owner, _ in group.members],
                       "heads": group.heads, "these_heads": mine,
                       "seconds": shares.get(piece, 0.0),
                       "busy_seconds": outcomes.timeline.busy_seconds(piece)})
    return seconds, {"rule": SHARE_RULE, "losses": len(searches), "groups": groups}


def stacked_plan(data: TrainingSplits, specs: Sequence[SearchSpec],
                 device: torch.device | str = "cpu") -> list[StackedGroup]:
    """The stacked groups :func:`run_searches` trains for ``specs`` on ``data`` on ``device``
    (before the CPU workers cut them into pieces): what a run will do, for planning and
    benchmarks."""
    return _planned(data, specs, captures_apart(torch.device(device)))[1]


def captures_apart(device: torch.device) -> bool:
    """Whether the stacked groups keep apart the losses whose step cannot be captured as a CUDA
    graph or follows a schedule: on CUDA, with graphs or without (``FEATCACHE_CUDA_GRAPHS=0``
    trains the same groups step by step, so that the two compare group for group)."""
    return device.type == "cuda"


def _planned(data: TrainingSplits, specs: Sequence[SearchSpec], graphs: bool = False
             ) -> tuple[list[_Search], list[StackedGroup]]:
    """Each search fitted and resolved, and the stacked groups of all of them."""
    for spec in specs:
        check_grid(spec.learning_rates, spec.batch_sizes)
    fitted = fit_all(data, [loss_class(spec.loss) for spec in specs])
    specs = [spec.resolved(f.facts) for spec, f in zip(specs, fitted, strict=True)]
    searches = [_Search(f, spec, [(seed, bs) for seed in spec.seeds for bs in spec.batch_sizes])
                for spec, f in zip(specs, fitted, strict=True)]
    groups = stacked_groups(
        [Stackable(loss_class(s.spec.loss), s.data, s.spec.epochs, s.spec.val_variant,
                   s.spec.early_stop) for s in searches],
        [[Member(s.spec.loss, tuple(c for c in s.spec.configs(seed) if c.batch_size == bs))
          for seed, bs in s.groups] for s in searches], graphs)
    if not stacking_fits(data):
        groups = unstacked(groups)
    return searches, groups


def stacking_fits(data: TrainingSplits) -> bool:
    """Whether the memory plan of ``data`` lets several losses train as one group (a plan that
    could not afford it keeps every loss in a group of its own)."""
    placement = getattr(data, "placement", None)
    return placement is None or placement.stacked
