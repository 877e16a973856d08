"""Training on features that do not fit in memory: the features file read in blocks.

**How a streamed epoch shuffles.** The protocol draws one permutation of all N training rows
per epoch (:class:`featcache.linear.engine.rows.MemoryRows`). A streamed epoch cuts the file into
blocks of consecutive rows (whole HDF5 chunks, so each block is one sequential read), draws a
permutation of the blocks, takes them ``window`` blocks at a time and draws a permutation of
the rows of each window; the rows left over after a window's last full batch join the next
window. Every row is still seen once per epoch, by the protocol's number of steps
(``N // batch_size``, the last partial batch dropped), but two rows can share a batch only
when their blocks fall in the same window: batches mix ``window x block`` rows, not all N.
With a window as large as the file it is a full shuffle, drawn differently from the
in-memory path's (so not its numbers). Rows keep their place in the file, so a file written
in a meaningful order (by class, by source) is mixed only as far as the window reaches.

Evaluation reads the streamed splits block by block in file order and scores all heads of a
block in one matmul; validation and test stay in memory while the budget allows
(:func:`featcache.linear.memory.plan_placement`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor

from featcache.data.featurefile import FeatureFile
from featcache.data.labelfile import LabelSet
from featcache.data.pseudofile import PseudoLabels
from featcache.heads import LinearHeads
from featcache.linear.data import SplitRows, SplitsMixin, SplitTensors, split_rows
from featcache.linear.memory import Placement


class StreamedRows:
    """One split's features left in the file, read a block of rows at a time."""

    def __init__(self, features: FeatureFile, part: SplitRows, block_rows: int,
                 window_blocks: int, device: torch.device | str = "cpu"):
        self.features, self.official = features, part.official
        self.block_rows, self.window_blocks = block_rows, max(1, window_blocks)
        self.device = torch.device(device)
        self.num_rows = len(part.rows)
        # blocks that hold rows of this split: (first file row, end, split positions, offsets)
        block_of = part.rows // block_rows
        ids, first = np.unique(block_of, return_index=True)
        ends = np.append(first[1:], len(part.rows))
        self.blocks = []
        for block, lo, hi in zip(ids.tolist(), first.tolist(), ends.tolist(), strict=True):
            start = block * block_rows
            self.blocks.append((start, min(start + block_rows, features.rows(part.official)),
                                slice(lo, hi), part.rows[lo:hi] - start))

    def __len__(self) -> int:
        return self.num_rows

    def read(self, blocks: list[int]) -> tuple[Tensor, Tensor]:
        """The split's rows of ``blocks`` (file dtype, on the device) and their positions."""
        total = sum(self.blocks[b][2].stop - self.blocks[b][2].start for b in blocks)
        out = np.empty((total, self.features.dim), dtype=self.features.dtype)
        positions = np.empty(total, dtype=np.int64)
        filled = 0
        for b in blocks:
            start, stop, where, offsets = self.blocks[b]
            rows = len(offsets)
            out[filled:filled + rows] = self.features.read(self.official, start, stop)[offsets]
            positions[filled:filled + rows] = np.arange(where.start, where.stop)
            filled += rows
        return (torch.from_numpy(out).to(self.device),
                torch.from_numpy(positions).to(self.device))

    def epoch(self, order: torch.Generator, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        block_order = torch.randperm(len(self.blocks), generator=order).tolist()
        carry_x: Tensor | None = None
        carry_index: Tensor | None = None
        for first in range(0, len(block_order), self.window_blocks):
            x, index = self.read(block_order[first:first + self.window_blocks])
            if carry_x is not None and carry_index is not None:
                x, index = torch.cat([carry_x, x]), torch.cat([carry_index, index])
            perm = torch.randperm(len(index), generator=order).to(self.device)
            full = len(index) // batch_size
            for step in range(full):
                pick = perm[step * batch_size:(step + 1) * batch_size]
                yield index[pick], x.index_select(0, pick).float()
            rest = perm[full * batch_size:]
            carry_x, carry_index = x.index_select(0, rest), index[rest]

    def scores(self, head: LinearHeads) -> Tensor:
        heads, _, classes = head.weight.shape
        out = torch.empty(heads, self.num_rows, classes, device=head.weight.device)
        for b in range(len(self.blocks)):
            x, _ = self.read([b])
            out[:, self.blocks[b][2]] = head.scores_wide(x)
        return out


@dataclass
class StreamedSplit:
    """A split whose features stay in the file: its labels on the device and its rows."""

    feature_rows: StreamedRows
    observed: Tensor
    clean: Tensor | None
    rows: np.ndarray
    pseudo: Tensor | None = None  # (n, L) pseudo-labels 1 / 0 / -1 (losses that need them)

    def __len__(self) -> int:
        return len(self.feature_rows)


@dataclass
class StreamedLinearData(SplitsMixin):
    """:class:`~featcache.linear.data.LinearData`'s counterpart for features that do not fit in
    memory: the same fields, but streamed splits are :class:`StreamedSplit` (validation and
    test may still be in memory), and ``placement`` says how the file is read."""

    dataset: str
    classes: list[str]
    train: StreamedSplit
    val: StreamedSplit | SplitTensors
    test: StreamedSplit | SplitTensors
    k: float | None
    labels: LabelSet
    features: FeatureFile
    placement: Placement
    notes: list[str] = field(default_factory=list)
    pseudo_choice: str | None = None  # --pseudo-labels NAME
    pseudo_labels: PseudoLabels | None = None  # the set attached to train.pseudo

    @property
    def feature_dim(self) -> int:
        return self.features.dim


def load_streamed_data(labels: LabelSet, features: FeatureFile, placement: Placement,
                       device: torch.device | str = "cpu",
                       pseudo_choice: str | None = None,
                       known_rows: tuple[dict[str, SplitRows], list[str]] | None = None
                       ) -> StreamedLinearData:
    """Labels on the device, the streamed splits left in ``features``, the others read into
    memory block by block; every row checked for NaN or Inf once, block by block (``known_rows``:
    :func:`~featcache.linear.data.split_rows` of this file when the caller has it already)."""
    splits, notes = known_rows or split_rows(labels, features)
    if not placement.train_rows:  # a plan made by hand: what its window is a share of
        placement = replace(placement, train_rows=len(splits["train"].rows))
    for official in ("train", "test"):
        features.check_finite(official, block_rows=placement.block_rows)
    parts: dict[str, StreamedSplit | SplitTensors] = {}
    for name, part in splits.items():
        observed, clean = part.label_tensors(device)
        rows = StreamedRows(features, part, placement.block_rows, placement.window_blocks, device)
        if name in placement.streamed:
            parts[name] = StreamedSplit(rows, observed, clean, part.rows)
        else:
            tensor = torch.empty(len(part.rows), features.dim, device=device)
            for b, block in enumerate(rows.blocks):
                x, _ = rows.read([b])
                tensor[block[2]] = x.float()
            parts[name] = SplitTensors(tensor, observed, clean, part.rows)
    features.close()  # workers open their own handle (HDF5 handles do not survive fork)
    train = parts["train"]
    if not isinstance(train, StreamedSplit):
        raise ValueError("a streamed placement streams the training split")
    return StreamedLinearData(
        dataset=labels.dataset, classes=list(labels.classes), train=train,
        val=parts["val"], test=parts["test"], k=labels.k, labels=labels, features=features,
        placement=placement, notes=notes + [placement.describe()], pseudo_choice=pseudo_choice)
