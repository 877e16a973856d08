"""Where a run's stacked groups train: one pool of workers for every loss of the run.

The searches of a run (``--loss all``) train as stacked groups
(:mod:`featcache.linear.engine.stacking`: the losses that share data, kind of head, seed and batch
size, in one set of heads). On the CPU the groups are cut into pieces of whole losses until no piece
is more than its share of the work among twice as many pieces as workers (each loss's numbers are
its own whatever its group), and ``jobs`` worker processes take them, the costliest first; a piece
whose training does not read its evaluation trains first and hands each epoch's heads back, and
whichever worker is free evaluates them in pieces (the same numbers: the same operations on the same
weights), so no core waits for the slowest group. On a GPU every group is one piece (the most heads
per step). Under ``torchrun`` the ranks share the pieces.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from featcache.heads import LinearHeads
from featcache.interrupt import check_stop
from featcache.linear.engine.evaluation import EpochState, Evaluation, HeadResult, TrainedGroup
from featcache.linear.engine.stacking import StackedGroup, balanced
from featcache.linear.engine.timeshare import Timeline
from featcache.linear.engine.trainer import GroupTrainer
from featcache.linear.engine.workers import fork_is_safe, map_groups
from featcache.progress import progress as progress_bar
from featcache.runtime import Ranks


@dataclass(frozen=True)
class TrainGroup:
    """Train one stacked group (and evaluate it there, unless it may be deferred)."""

    group: int


@dataclass
class EvaluateEpochs:
    """Evaluate consecutive epochs of a group trained by :meth:`GroupTrainer.train_only`."""

    group: int
    empty_heads: LinearHeads
    epochs: list[EpochState]


@dataclass
class PendingEvaluation:
    """A trained group waiting for its epochs' evaluations."""

    trained: TrainedGroup
    pieces: int
    seconds: float = 0.0  # evaluation time, all pieces

    def take(self, epochs: Sequence[EpochState], found: Sequence[tuple], seconds: float,
             ) -> list[list[HeadResult]] | None:
        """One evaluated piece (``found``: each epoch's validation mAP, clean and observed, and
        per-class test AP); each loss's heads' results once every piece is in."""
        for done, (val_map, val_map_observed, test_ap) in zip(epochs, found, strict=True):
            done.val_map, done.val_map_observed, done.test_ap = val_map, val_map_observed, test_ap
        self.pieces -= 1
        self.seconds += seconds
        return None if self.pieces else self.trained.finish(self.trained.epochs, self.seconds)


@dataclass
class Outcomes:
    """Where the groups' results go: ``keep(search, group key, heads, began, ended, piece)`` for
    each loss of a finished group (``piece``: the group's index in :attr:`pieces`); every task's
    run time goes to :attr:`timeline`."""

    keep: Callable[[int, tuple[int, int], list[HeadResult], float, float, int], None]
    evaluating: dict[int, PendingEvaluation] = field(default_factory=dict)
    spans: dict[int, float] = field(default_factory=dict)  # a group's training start
    timeline: Timeline = field(default_factory=Timeline)
    #: the groups as the workers train them (cut into pieces of whole losses on the CPU)
    pieces: Sequence[StackedGroup] = ()


def workers_evaluate_elsewhere(device: torch.device, jobs: int, job: Ranks | None) -> bool:
    """Whether a group's evaluation may leave its worker: only where other local workers can
    take it (several CPU worker processes, forked from a process where that is safe, one rank),
    and only for groups whose losses allow it
    (:func:`~featcache.linear.engine.member.evaluation_can_move`)."""
    return (device.type == "cpu" and jobs > 1 and fork_is_safe()
            and (job is None or job.world == 1))


#: what a task gives back: each loss's heads (or, trained only, the group to evaluate
#: elsewhere), or an evaluated piece's epochs; with its wall-clock start and end
Outcome = tuple[list[list[HeadResult]] | TrainedGroup | list[tuple], float, float]


class SharedWorkers:
    """A run's stacked groups on one pool of workers: :meth:`work` runs a task where a worker is
    free, :meth:`finished` takes its outcome where the searches are kept."""

    def __init__(self, groups: Sequence[StackedGroup], device: torch.device, progress: bool,
                 jobs: int, job: Ranks | None, outcomes: Outcomes, evaluate_elsewhere: bool):
        self.device, self.outcomes, self.job = device, outcomes, job
        self.show = progress and (job is None or job.world == 1 or job.is_main)
        local = jobs if device.type == "cpu" and fork_is_safe() else 1
        # on the CPU twice as many pieces as workers, so that the workers' shares even out;
        # each worker takes the costliest piece left (numbers do not depend on the cut)
        pieces = 2 * local if local > 1 else 1
        if job is not None and job.world > 1:
            pieces = job.world
        self.groups = sorted(balanced(groups, pieces), key=lambda g: -g.cost())
        outcomes.pieces = self.groups
        self.evaluate_elsewhere = (evaluate_elsewhere
                                   and workers_evaluate_elsewhere(device, jobs, job)
                                   and any(group.can_defer for group in self.groups))
        # then every worker may help, even beyond the number of groups
        self.workers = jobs if self.evaluate_elsewhere else min(jobs, len(self.groups))
        self.epochs_per_evaluation = max(1, math.ceil(
            max((g.epochs for g in self.groups), default=1) / (4 * jobs)))
        self.evaluations: dict[int, Evaluation] = {}  # this process's, built on first use
        self.evaluated: Any = None  # the bar of epochs evaluated elsewhere, while running

    def run(self) -> None:
        # the epochs every group that trains first hands to other workers, evaluated or not yet
        handed = sum(g.epochs for g in self.groups if g.can_defer) if self.evaluate_elsewhere else 0
        self.evaluated = progress_bar(total=handed, unit="epoch", desc="evaluating trained groups",
                                      disable=not (self.show and self.evaluate_elsewhere),
                                      leave=False, position=self.workers)
        tasks: list[TrainGroup | EvaluateEpochs] = [TrainGroup(i) for i in range(len(self.groups))]
        try:
            map_groups(self.work, tasks, [g.cost() for g in self.groups], self.device,
                       self.workers, self.job, on_result=self.finished,
                       on_start=lambda task: self.outcomes.timeline.started(task, time.time()))
        finally:
            self.evaluated.close()

    def evaluation(self, group: StackedGroup) -> Evaluation:
        key = id(group.data)
        if key not in self.evaluations:
            self.evaluations[key] = Evaluation(group.data)
        return self.evaluations[key]

    def work(self, task: TrainGroup | EvaluateEpochs) -> Outcome:
        group = self.groups[task.group]
        started = time.time()  # wall clock: comparable between the worker processes
        if isinstance(task, EvaluateEpochs):
            check_stop()
            found = [(done.val_map, done.val_map_observed, done.test_ap) for done in
                     self.evaluation(group).evaluate_epochs(task.empty_heads, task.epochs)]
            return found, started, time.time()  # the weights stay where they are
        trainer = GroupTrainer(group.data, [member for _, member in group.members], group.epochs,
                               group.val_variant, group.early_stop, self.device)
        position = task.group % max(1, self.workers)
        outcome = (trainer.train_only(self.show, position)
                   if self.evaluate_elsewhere and trainer.can_defer
                   else trainer.run(self.show, position))
        return outcome, started, time.time()

    def finished(self, index: int | None, task: TrainGroup | EvaluateEpochs,
                 outcome: Outcome) -> list[EvaluateEpochs]:
        group = self.groups[task.group]
        value, began, ended = outcome
        self.outcomes.spans.setdefault(task.group, began)
        self.outcomes.timeline.finished(task, began, ended, task.group)
        if isinstance(task, EvaluateEpochs):  # its value: each epoch's evaluation
            self.evaluated.update(len(task.epochs))
            results = self.outcomes.evaluating[task.group].take(
                task.epochs, cast(list[tuple], value), ended - began)
            if results is None:
                return []
            del self.outcomes.evaluating[task.group]
        elif isinstance(value, TrainedGroup):
            pieces = value.chunks(self.epochs_per_evaluation)
            if pieces:
                self.outcomes.evaluating[task.group] = PendingEvaluation(value, len(pieces))
                return [EvaluateEpochs(task.group, value.empty_heads, epochs)
                        for epochs in pieces]
            results = value.finish([])  # no epoch to evaluate
        else:  # a group trained and evaluated where it ran
            results = cast(list[list[HeadResult]], value)
        for (search, member), heads in zip(group.members, results, strict=True):
            key = (member.configs[0].seed, member.configs[0].batch_size)
            self.outcomes.keep(search, key, heads, self.outcomes.spans[task.group], ended,
                               task.group)
        return []
