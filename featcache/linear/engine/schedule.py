"""Where a run's stacked groups train: one pool of workers for every loss of the run.

The searches of a run (``--loss all``) train as stacked groups
(:mod:`featcache.linear.engine.stacking`: the losses that share data, kind of head, seed and
batch size, in one set of heads). On the CPU the groups are cut into pieces of whole losses
until no piece is more than its share of the work among twice as many pieces as workers (each
loss's numbers are its own whatever its group), and ``jobs`` worker processes take them, the
costliest first; each piece is evaluated where it trains. On a GPU every group is one piece
(the most heads per step), and several train at once (:func:`~featcache.linear.engine.workers.
cuda_groups`), those that cannot be captured as CUDA graphs first. Under ``torchrun`` the ranks
share the pieces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from featcache.linear.engine.evaluation import HeadResult
from featcache.linear.engine.graphs import is_capture_error
from featcache.linear.engine.stacking import StackedGroup, balanced
from featcache.linear.engine.timeshare import Timeline
from featcache.linear.engine.trainer import GroupTrainer
from featcache.linear.engine.workers import cuda_groups, fork_is_safe, map_groups
from featcache.runtime import Ranks

log = logging.getLogger(__name__)


@dataclass
class Outcomes:
    """Where the groups' results go: ``keep(search, group key, heads, began, ended, piece)`` for
    each loss of a finished group (``began``, ``ended``: the group's wall-clock start and end;
    ``piece``: the group's index in :attr:`pieces`); every group's run time goes to
    :attr:`timeline`."""

    keep: Callable[[int, tuple[int, int], list[HeadResult], float, float, int], None]
    timeline: Timeline = field(default_factory=Timeline)
    #: the groups as the workers train them (cut into pieces of whole losses on the CPU)
    pieces: Sequence[StackedGroup] = ()
    #: called once when a CPU worker is first left without a group while others still train
    idle: Callable[[], None] | None = None


#: what a worker gives back: each loss's heads' results, with the group's start and end
Outcome = tuple[list[list[HeadResult]], float, float]


class SharedWorkers:
    """A run's stacked groups on one pool of workers: :meth:`work` trains a group where a
    worker is free, :meth:`finished` hands its results to ``outcomes``."""

    def __init__(self, groups: Sequence[StackedGroup], device: torch.device, progress: bool,
                 jobs: int, job: Ranks | None, outcomes: Outcomes):
        self.device, self.outcomes, self.job = device, outcomes, job
        self.show = progress and (job is None or job.world == 1 or job.is_main)
        local = jobs if device.type == "cpu" and fork_is_safe() else 1
        # on the CPU twice as many pieces as workers, so that the workers' shares even out;
        # each worker takes the costliest piece left (numbers do not depend on the cut)
        pieces = 2 * local if local > 1 else 1
        if job is not None and job.world > 1:
            pieces = job.world
        # the costliest first; on a GPU a group whose step cannot be captured first of all
        # (it trains step by step, far slower than the replayed groups beside it)
        self.groups = sorted(balanced(groups, pieces),
                             key=lambda g: (device.type == "cuda" and g.capturable, -g.cost()))
        outcomes.pieces = self.groups
        self.workers = min(jobs, len(self.groups))
        if device.type == "cuda":  # groups at once in threads (progress bars' rows)
            self.workers = min(cuda_groups(), len(self.groups))

    def run(self) -> None:
        map_groups(self.work, list(range(len(self.groups))), [g.cost() for g in self.groups],
                   self.device, self.workers, self.job, on_result=self.finished,
                   on_start=lambda task: self.outcomes.timeline.started(task, time.time()),
                   on_idle=self.outcomes.idle)

    def work(self, index: int) -> Outcome:
        group = self.groups[index]
        started = time.time()  # wall clock: comparable between the worker processes
        results = train_contained(group, self.device, self.show, index % max(1, self.workers))
        return results, started, time.time()

    def finished(self, index: int, task: int, outcome: Outcome) -> None:
        results, began, ended = outcome
        self.outcomes.timeline.finished(task, began, ended, task)
        for (search, member), heads in zip(self.groups[task].members, results, strict=True):
            key = (member.configs[0].seed, member.configs[0].batch_size)
            self.outcomes.keep(search, key, heads, began, ended, task)


def train_contained(group: StackedGroup, device: torch.device, progress: bool,
                    position: int) -> list[list[HeadResult]]:
    """Train ``group``; should an error of a CUDA graph capture reach a group trained with
    graphs (its own capture fails and falls back without one: this is for what that cannot
    contain), it says so and trains the group again from the start without graphs (its
    numbers depend on the group alone), instead of ending the search."""
    def trainer(graphs: bool | None) -> GroupTrainer:
        return GroupTrainer(group.data, [member for _, member in group.members], group.epochs,
                            group.val_variant, group.early_stop, device, graphs=graphs)

    first = trainer(None)
    try:
        return first.run(progress, position)
    except Exception as error:
        if first.graphs is None or not is_capture_error(error):
            raise
        log.warning("%s: a CUDA graph error reached its training (%s); trained again from the "
                    "start without CUDA graphs", first.describe(),
                    str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
    return trainer(False).run(progress, position)
