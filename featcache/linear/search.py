"""The protocol's hyperparameter search for one loss: every grid point, every seed, one selection.

Grid points that share a seed and a batch size train together as stacked heads
(:class:`featcache.linear.trainer.GroupTrainer`). With several CPU workers, a group whose
training does not read its evaluation trains first and hands each epoch's heads back; its
evaluation then runs in pieces on whichever worker is free (the same numbers: the same
operations on the same weights), so a worker done with a fast group evaluates the slow one's
epochs instead of waiting. Selection follows the reference code
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
from typing import Any, cast

import torch

from featcache.heads import LinearHeads
from featcache.interrupt import check_stop
from featcache.linear.data import TrainingSplits
from featcache.linear.evaluation import EpochState, Evaluation, HeadResult, TrainedGroup
from featcache.linear.member import Member, evaluation_can_move
from featcache.linear.trainer import GroupTrainer
from featcache.linear.workers import map_groups
from featcache.losses import DataFacts, ResolvedParams, loss_class
from featcache.progress import progress as progress_bar
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
    seconds: float
    notes: list[str] = field(default_factory=list)
    probe: dict | None = None  # the probe search's record (:mod:`featcache.linear.search_modes.probe`)

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
               job: Ranks | None = None, evaluate_elsewhere: bool = True) -> SearchResult:
    """Train and select every configuration of ``spec`` on ``data``.

    Groups (one per seed and batch size) train independently (:mod:`featcache.linear.workers`):
    on the CPU ``jobs`` of them at once in worker processes (default: one per core), each with
    one intra-op thread; under ``torchrun`` (``job``) spread over the ranks. The numbers never
    depend on ``jobs`` or on the number of ranks, nor on ``evaluate_elsewhere`` (False: every
    group evaluates where it trains; see :func:`run_searches`).
    """
    return run_searches(data, [spec], device, progress, jobs, job,
                        evaluate_elsewhere=evaluate_elsewhere)[0]


@dataclass(frozen=True)
class _TrainGroup:
    """Train one group of a search (and evaluate it there, unless it may be deferred)."""

    search: int
    group: tuple[int, int]  # (seed, batch size)


@dataclass
class _EvaluateEpochs:
    """Evaluate consecutive epochs of a group trained by :meth:`GroupTrainer.train_only`."""

    search: int
    group: tuple[int, int]
    empty_heads: LinearHeads
    epochs: list[EpochState]


@dataclass
class _PendingEvaluation:
    """A trained group waiting for its epochs' evaluations."""

    trained: TrainedGroup
    pieces: int
    seconds: float = 0.0  # evaluation time, all pieces

    def take(self, epochs: Sequence[EpochState], found: Sequence[tuple], seconds: float,
             ) -> list[HeadResult] | None:
        """One evaluated piece (``found``: each epoch's validation mAP, clean and observed, and
        per-class test AP); the heads' results once every piece is in."""
        for done, (val_map, val_map_observed, test_ap) in zip(epochs, found, strict=True):
            done.val_map, done.val_map_observed, done.test_ap = val_map, val_map_observed, test_ap
        self.pieces -= 1
        self.seconds += seconds
        return None if self.pieces else self.trained.finish(self.trained.epochs, self.seconds)[0]


@dataclass
class _Search:
    """One search being run: its data (fitted to the loss), its resolved spec, its groups."""

    data: TrainingSplits
    spec: SearchSpec
    groups: list[tuple[int, int]]
    done: dict[tuple[int, int], list[HeadResult]] = field(default_factory=dict)
    evaluating: dict[tuple[int, int], _PendingEvaluation] = field(default_factory=dict)
    span: tuple[float, float] = (math.inf, -math.inf)  # wall-clock start and end of its groups
    _evaluation: Evaluation | None = None  # this process's, built on first use

    def evaluation(self) -> Evaluation:
        if self._evaluation is None:
            self._evaluation = Evaluation(self.data)
        return self._evaluation

    def timed(self, began: float, ended: float) -> None:
        self.span = (min(self.span[0], began), max(self.span[1], ended))

    def result(self, seconds: float) -> SearchResult:
        seeds = []
        for seed in self.spec.seeds:
            heads = [h for bs in self.spec.batch_sizes for h in self.done[(seed, bs)]]
            seeds.append(SeedResult(seed=seed, heads=heads,
                                    selected=select_first_best(heads, lambda h: h.best_val)))
        return SearchResult(spec=self.spec, seeds=seeds, seconds=seconds,
                            notes=list(self.data.notes))


def workers_evaluate_elsewhere(device: torch.device, jobs: int, job: Ranks | None) -> bool:
    """Whether a group's evaluation may leave its worker: only where other local workers can
    take it (several CPU worker processes, one rank), and only for groups whose loss allows it
    (:func:`~featcache.linear.trainer.evaluation_can_move`)."""
    return device.type == "cpu" and jobs > 1 and (job is None or job.world == 1)


def run_searches(data: TrainingSplits, specs: Sequence[SearchSpec],
                 device: torch.device | str = "cpu", progress: bool = True,
                 jobs: int | None = None, job: Ranks | None = None,
                 on_done: Callable[[SearchResult], None] | None = None,
                 evaluate_elsewhere: bool = True) -> list[SearchResult]:
    """Several searches on the same data (``--loss all``), their groups sharing the workers:
    a worker done with one loss's group starts the next one's, so no core waits for a slow
    group to finish. ``on_done`` sees each search as soon as all its groups are trained (in
    the order they finish; under ``torchrun`` once every rank is done, in the order of
    ``specs``). A search's ``seconds`` run from its first group's start to its last group's
    end. ``evaluate_elsewhere`` (the default) lets local CPU workers evaluate the groups that
    train without reading their evaluation (module docstring); False keeps each group's
    evaluation in its own worker, as before (the same numbers; ``benchmarks.linear`` times
    both).
    """
    device = torch.device(device)
    searches = []
    for spec in specs:
        check_grid(spec.learning_rates, spec.batch_sizes)
        fitted = loss_class(spec.loss).fit_data(data)
        spec = spec.resolved(fitted.facts)
        searches.append(_Search(fitted, spec, [(seed, batch_size) for seed in spec.seeds
                                                for batch_size in spec.batch_sizes]))
    return _SharedWorkers(searches, device, progress, jobs, job, on_done,
                          evaluate_elsewhere).run(len(data.train))


#: what a task gives back: a group's heads (or, trained only, the group to evaluate elsewhere),
#: or an evaluated piece's epochs; with its wall-clock start and end
_Outcome = tuple[list[HeadResult] | TrainedGroup | list[tuple], float, float]


class _SharedWorkers:
    """The groups of several searches on one pool of workers: :meth:`work` runs a task where a
    worker is free, :meth:`finished` takes its outcome where the searches are kept."""

    def __init__(self, searches: list[_Search], device: torch.device, progress: bool,
                 jobs: int | None, job: Ranks | None,
                 on_done: Callable[[SearchResult], None] | None, evaluate_elsewhere: bool):
        self.searches, self.device, self.on_done = searches, device, on_done
        self.tasks: list[_TrainGroup | _EvaluateEpochs] = [
            _TrainGroup(i, group) for i, search in enumerate(searches) for group in search.groups]
        jobs = max(1, jobs or usable_cpus())
        self.show = progress and (job is None or job.world == 1 or job.is_main)
        self.job = job
        # then every worker may help, even beyond the number of groups
        self.evaluate_elsewhere = (
            evaluate_elsewhere and workers_evaluate_elsewhere(device, jobs, job)
            and any(evaluation_can_move(loss_class(search.spec.loss), search.spec.early_stop)
                    for search in searches))
        self.workers = jobs if self.evaluate_elsewhere else min(jobs, len(self.tasks))
        self.epochs_per_evaluation = max(1, math.ceil(
            max((s.spec.epochs for s in searches), default=1) / (4 * jobs)))
        self.results: list[SearchResult | None] = [None] * len(searches)
        self.evaluated: Any = None  # the bar of epochs evaluated elsewhere, while running

    def run(self, train_rows: int) -> list[SearchResult]:
        # the epochs handed to other workers, evaluated or not yet (grows as groups finish training)
        self.evaluated = progress_bar(total=0, unit="epoch", desc="evaluating trained groups",
                                      disable=not (self.show and self.evaluate_elsewhere),
                                      leave=False, position=self.workers)
        # a group's cost: its steps per epoch, plus about a hundred steps' worth of evaluation
        costs = [train_rows // task.group[1] + 100 for task in self.tasks]
        try:
            map_groups(self.work, self.tasks, costs, self.device, self.workers, self.job,
                       on_result=self.finished)
        finally:
            self.evaluated.close()
        done = [result for result in self.results if result is not None]
        if len(done) != len(self.results):
            raise RuntimeError("a search finished without training any group")
        return done

    def work(self, task: _TrainGroup | _EvaluateEpochs) -> _Outcome:
        search = self.searches[task.search]
        started = time.time()  # wall clock: comparable between the worker processes
        if isinstance(task, _EvaluateEpochs):
            check_stop()
            found = [(done.val_map, done.val_map_observed, done.test_ap) for done in
                     search.evaluation().evaluate_epochs(task.empty_heads, task.epochs)]
            return found, started, time.time()  # the weights stay where they are
        seed, batch_size = task.group
        configs = [c for c in search.spec.configs(seed) if c.batch_size == batch_size]
        trainer = GroupTrainer(search.data, [Member(search.spec.loss, tuple(configs))],
                               search.spec.epochs,
                               search.spec.val_variant, search.spec.early_stop, self.device)
        position = self.tasks.index(task) % self.workers
        outcome = (trainer.train_only(self.show, position)
                   if self.evaluate_elsewhere and trainer.can_defer
                   else trainer.run(self.show, position)[0])
        return outcome, started, time.time()

    def finished(self, index: int | None, task: _TrainGroup | _EvaluateEpochs,
                 outcome: _Outcome) -> list[_EvaluateEpochs]:
        search = self.searches[task.search]
        value, began, ended = outcome
        search.timed(began, ended)
        if isinstance(task, _EvaluateEpochs):  # its value: each epoch's evaluation
            self.evaluated.update(len(task.epochs))
            heads = search.evaluating[task.group].take(task.epochs, cast(list[tuple], value),
                                                       ended - began)
            if heads is None:
                return []
            del search.evaluating[task.group]
        elif isinstance(value, TrainedGroup):
            pieces = value.chunks(self.epochs_per_evaluation)
            if pieces:
                search.evaluating[task.group] = _PendingEvaluation(value, len(pieces))
                self.evaluated.total += len(value.epochs)
                self.evaluated.refresh()
                return [_EvaluateEpochs(task.search, task.group, value.empty_heads, epochs)
                        for epochs in pieces]
            heads = value.finish([])[0]  # no epoch to evaluate
        else:  # a group trained and evaluated where it ran
            heads = cast(list[HeadResult], value)
        search.done[task.group] = heads
        if len(search.done) == len(search.groups):
            result = search.result(search.span[1] - search.span[0])
            self.results[task.search] = result
            if self.on_done is not None:
                self.on_done(result)
        return []

