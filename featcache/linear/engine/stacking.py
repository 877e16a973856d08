"""Which losses of a run train together: the stacked groups of stage two.

Losses whose training reads the same inputs (the same features and training labels, after what their
needs add: observed negatives, a pseudo-label set), the same kind of head, seed and batch size train
as one group (:class:`~featcache.linear.engine.trainer.GroupTrainer`): one gather of the batch, one
batched matmul for all their heads, one optimizer update. Losses with other inputs (spatial maps,
pseudo-labels, observed negatives, another features file) form groups of their own. Every number of
a loss is the one it gets alone (bit for bit on the CPU), so a group may be cut into smaller groups
at will: :func:`balanced` cuts the groups of a run for the workers that share them,
:func:`unstacked` where the memory plan allows no stacking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from featcache.heads import HeadKind
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.member import Member
from featcache.losses import SPMLLoss, loss_class


@dataclass(frozen=True)
class Stackable:
    """One search of a run as the groups see it: its loss, its data fitted to the loss, its
    settings."""

    loss: type[SPMLLoss]
    data: TrainingSplits
    epochs: int
    val_variant: str
    early_stop: str


@dataclass(frozen=True)
class StackedGroup:
    """Losses that train together: their shared data and settings, and each loss's share
    (``members``: (search index, its configurations of this seed and batch size))."""

    data: TrainingSplits
    kind: HeadKind
    seed: int
    batch_size: int
    epochs: int
    val_variant: str
    early_stop: str
    members: tuple[tuple[int, Member], ...]

    @property
    def heads(self) -> int:
        return sum(member.heads for _, member in self.members)

    @property
    def capturable(self) -> bool:
        """Whether every loss's step can be captured as a CUDA graph."""
        return all(loss_class(member.loss).capturable for _, member in self.members)

    def cost(self) -> float:
        """About how much work the group is: its training steps times its heads, plus a
        hundred steps' worth of evaluation per head (what the scheduler balances)."""
        steps = len(self.data.train) // self.batch_size
        return (steps + 100) * self.heads


def fit_all(data: TrainingSplits, losses: Sequence[type[SPMLLoss]]) -> list[TrainingSplits]:
    """Each loss's data (:meth:`~featcache.losses.SPMLLoss.fit_data`), fitted once per kind of
    completion (the needs that add to the data: observed negatives, a pseudo-label set), so
    that losses fitted alike share one object (and so a group)."""
    fitted: dict[tuple, TrainingSplits] = {}
    out = []
    for loss in losses:
        key = tuple((need.key, need.description) for need in loss.needs if need.adapt)
        # data completed once is left as it is by the next loss that needs the same
        fitted[key] = loss.fit_data(fitted.get(key, data))
        out.append(fitted[key])
    return out


def stacked_groups(searches: Sequence[Stackable], configs: Sequence[Sequence[Member]],
                   graphs: bool = False) -> list[StackedGroup]:
    """The groups of a run's searches: for each search, ``configs[i]`` holds one
    :class:`Member` per (seed, batch size) of its grid. Losses join a group when they share
    its data (the same object: fitted alike), kind of head, seed, batch size and settings;
    with ``graphs`` (CUDA graphs), also how their step may be captured
    (:attr:`~featcache.losses.SPMLLoss.capturable`, ``scheduled``: a loss that cannot be
    captured, or whose graph changes every epoch, does not hold back the others). Groups keep
    the order of first appearance, members the order of the searches."""
    groups: dict[tuple, list[tuple[int, Member]]] = {}
    data_of: dict[tuple, TrainingSplits] = {}
    for index, (search, members) in enumerate(zip(searches, configs, strict=True)):
        capture = (search.loss.capturable, search.loss.scheduled) if graphs else ()
        for member in members:
            seed, batch_size = member.configs[0].seed, member.configs[0].batch_size
            key = (id(search.data), search.loss.head, seed, batch_size, search.epochs,
                   search.val_variant, search.early_stop, capture)
            groups.setdefault(key, []).append((index, member))
            data_of[key] = search.data
    out = []
    for key, shares in groups.items():
        _, kind, seed, batch_size, epochs, val_variant, early_stop, _ = key
        out.append(StackedGroup(data_of[key], kind, seed, batch_size, epochs, val_variant,
                                early_stop, tuple(shares)))
    return out


def balanced(groups: Sequence[StackedGroup], pieces: int) -> list[StackedGroup]:
    """``groups`` cut into smaller groups of whole losses (the costliest first) until none is
    more than its share of the work for ``pieces`` workers; a group of one loss stays whole,
    and with one worker every group does."""
    out = list(groups)
    if pieces <= 1:
        return out
    fair = sum(group.cost() for group in out) / pieces
    while out:
        largest = max(range(len(out)), key=lambda i: (out[i].cost(), -i))
        group = out[largest]
        if group.cost() <= fair or len(group.members) < 2:
            break
        half = _halfway(group)
        out[largest:largest + 1] = [replace(group, members=group.members[:half]),
                                    replace(group, members=group.members[half:])]
    return out


def unstacked(groups: Sequence[StackedGroup]) -> list[StackedGroup]:
    """Every loss of ``groups`` in a group of its own (where memory allows no stacking)."""
    return [replace(group, members=(member,)) for group in groups for member in group.members]


def _halfway(group: StackedGroup) -> int:
    """Where to cut a group's members into two of about equal heads (at least one each)."""
    total, running = group.heads, 0
    for index, (_, member) in enumerate(group.members):
        running += member.heads
        if running * 2 >= total:
            return max(1, min(index + 1, len(group.members) - 1))
    return len(group.members) // 2
