"""Where a batch's rows and labels come from during training: what the trainer asks of them.

:class:`MemoryRows` holds the split as one tensor on the device and draws each epoch as the
protocol does: one seeded permutation of every row, cut into batches (the last partial batch
dropped). The streamed source (:mod:`featcache.linear.stream`) offers the same two calls,
reading the features file in chunks. :class:`EpochLabels` holds the labels of one epoch's
batches, gathered once an epoch where the epoch's order is known up front.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch import Tensor

from featcache.heads import LinearHeads
from featcache.linear.data import SplitData
from featcache.losses import Targets


class FeatureRows(Protocol):
    """A split's features as the trainer uses them."""

    def __len__(self) -> int: ...

    def epoch(self, order: torch.Generator, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """One training pass: (rows of the split, their float32 features) per batch, in an
        order drawn from ``order``; ``len(self) // batch_size`` batches."""
        ...

    def scores(self, head: LinearHeads) -> Tensor:
        """Probabilities of every head on every row, (H, N, L), rows in split order."""
        ...


class MemoryRows:
    """A split's features as one (N, D) float32 tensor on the training device."""

    def __init__(self, features: Tensor):
        self.features = features
        self.scorer = SplitScorer(features)

    def __len__(self) -> int:
        return self.features.shape[0]

    def epoch(self, order: torch.Generator, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        for index in self.order(order, batch_size).view(-1, batch_size):
            yield index, self.gather(index)

    def order(self, order: torch.Generator, batch_size: int) -> Tensor:
        """One epoch's rows in the order its batches take them, (steps x B,): one seeded
        permutation of every row (drawn on the host, sent to the device once), the rows of the
        last partial batch dropped."""
        perm = torch.randperm(len(self), generator=order).to(self.features.device)
        return perm[:len(self) // batch_size * batch_size]

    def gather(self, index: Tensor) -> Tensor:
        """The features of rows ``index``."""
        return self.features.index_select(0, index)

    def scores(self, head: LinearHeads) -> Tensor:
        return self.scorer(head)


class SplitScorer:
    """Scores one split's features for every head, by the faster all-heads matmul wherever it
    gives exactly the per-head matmul's numbers.

    The first call computes both and compares them bit for bit: a BLAS kernel's summation
    order depends on the shapes (and threads), not on the values, so equal results on real
    data mean the same order. Where they differ (some shapes do), every call stays on the
    per-head kernel. Either way the numbers are :meth:`LinearHeads.scores`'.
    """

    def __init__(self, features: Tensor):
        self.features = features
        self.wide: bool | None = None

    def __call__(self, head: LinearHeads) -> Tensor:
        if self.wide:
            return head.scores_wide(self.features)
        exact = head.scores(self.features)
        if self.wide is None:
            self.wide = torch.equal(exact, head.scores_wide(self.features))
        return exact


class EpochLabels:
    """The training split's labels as the losses see them (:class:`~featcache.losses.Targets`),
    for one epoch's batches: float32 observed and full labels and the pseudo-labels as stored,
    each (steps, B, L), filled once an epoch (:meth:`fill`) in buffers that stay where they are
    (what a CUDA graph reads), or gathered batch by batch (:meth:`gather`) where the epoch's
    order is not known up front (streamed rows)."""

    def __init__(self, train: SplitData, steps: int, batch_size: int, device: torch.device,
                 buffers: bool = True):
        self.train = train
        shape = (steps if buffers else 0, batch_size, train.observed.shape[1])
        self.observed = torch.empty(shape, device=device)
        self.clean = None if train.clean is None else torch.empty(shape, device=device)
        self.pseudo = (None if train.pseudo is None
                       else torch.empty(shape, dtype=train.pseudo.dtype, device=device))

    def fill(self, rows: Tensor) -> None:
        """The labels of the epoch's rows (steps x B,), in batch order (a float32 copy of a
        compact label is the value ``.float()`` gives)."""
        for buffer, source in ((self.observed, self.train.observed),
                               (self.clean, self.train.clean), (self.pseudo, self.train.pseudo)):
            if buffer is not None and source is not None:
                buffer.view(-1, buffer.shape[-1]).copy_(source.index_select(0, rows))

    def batch(self, step: int, index: Tensor) -> Targets:
        """Batch ``step`` of the filled epoch (rows ``index``)."""
        return Targets(self.observed[step], index,
                       None if self.clean is None else self.clean[step],
                       None if self.pseudo is None else self.pseudo[step])

    def take(self, counter: Tensor, index: Tensor) -> Targets:
        """The batch a device step counter (1,) points at, read on the device (a captured step)."""
        def read(buffer: Tensor) -> Tensor:
            return buffer.index_select(0, counter).view(buffer.shape[1:])

        return Targets(read(self.observed), index,
                       None if self.clean is None else read(self.clean),
                       None if self.pseudo is None else read(self.pseudo))

    def gather(self, index: Tensor) -> Targets:
        """The labels of rows ``index``, gathered now."""
        train = self.train
        return Targets(train.observed.index_select(0, index).float(), index,
                       None if train.clean is None else train.clean.index_select(0, index).float(),
                       None if train.pseudo is None else train.pseudo.index_select(0, index))
