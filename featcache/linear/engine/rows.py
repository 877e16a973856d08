"""Where a split's feature rows come from during training: what the trainer asks of them.

:class:`MemoryRows` holds the split as one tensor on the device and draws each epoch as the
protocol does: one seeded permutation of every row, cut into batches (the last partial batch
dropped). The streamed source (:mod:`featcache.linear.stream`) offers the same two calls,
reading the features file in chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch import Tensor

from featcache.heads import LinearHeads


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
        for index in self.indices(order, batch_size):
            yield index, self.gather(index)

    def indices(self, order: torch.Generator, batch_size: int) -> Iterator[Tensor]:
        """One epoch's batches of rows: one seeded permutation of every row (drawn on the host,
        sent to the device once), cut into batches, the last partial batch dropped."""
        perm = torch.randperm(len(self), generator=order).to(self.features.device)
        for step in range(len(self) // batch_size):
            yield perm[step * batch_size:(step + 1) * batch_size]

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
