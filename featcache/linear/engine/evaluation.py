"""What a group's trained epochs become: their evaluation on the validation and test splits
(:class:`Evaluation`, all heads of an epoch scored at once), the per-head
record of every epoch with the best-epoch selection and early stopping (:class:`GroupRecord`),
and each configuration's result (:class:`HeadResult`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from featcache.heads import LinearHeads
from featcache.linear.data import SplitData, SplitTensors, TrainingSplits
from featcache.linear.engine.rows import FeatureRows, MemoryRows
from featcache.linear.stream import StreamedSplit
from featcache.metrics import RankedScores, average_precision
from featcache.protocol.grid import GridPoint
from featcache.protocol.records import EpochRecord
from featcache.protocol.selection import selection_score, should_stop


@dataclass
class HeadResult:
    """Everything one configuration produced."""

    config: GridPoint
    epochs: list[EpochRecord]
    best_epoch: int
    best_val: float
    weight: Tensor  # (L, D) at the best epoch, nn.Linear layout
    bias: Tensor  # (L,)
    state: dict[str, Tensor]  # learned per-example state at the best epoch (ROLE: phi (N, L))
    test_ap: Tensor  # (L,) per-class test AP at the best epoch, in [0, 1]
    stopped_at: int | None = None
    seconds: float = 0.0

    @property
    def best(self) -> EpochRecord:
        return self.epochs[self.best_epoch]



class Evaluation:
    """What evaluating a group's heads reads: the validation and test rows and their labels."""

    def __init__(self, data: TrainingSplits):
        self.data = data
        self.val_rows, self.test_rows = feature_rows(data.val), feature_rows(data.test)
        self.val_observed = (data.val.observed == 1).float()
        self.test_targets = (data.test.clean if data.test.clean is not None
                             else (data.test.observed == 1).float())

    @torch.no_grad()
    def evaluate(self, heads: LinearHeads, done: EpochState) -> EpochState:
        """Validation and test mAP of heads like ``heads`` (of their kind and settings) with
        ``done``'s weights, the epoch ``done.epoch``."""
        head = heads.frozen(done.weight, done.bias)
        observed, clean, done.test_ap = self._aps(self.val_rows.scores(head),
                                                  lambda: self.test_rows.scores(head))
        done.val_map_observed = _map(observed)
        if clean is not None:
            done.val_map = _map(clean)
        return done

    def _aps(self, val_scores: Tensor, test_scores: Callable[[], Tensor]
             ) -> tuple[Tensor, Tensor | None, Tensor]:
        """Per-class AP (..., L) of validation scores against the observed and (when known) the
        full labels, and of the test scores (``test_scores()``, made once the validation split
        is ranked) against the test labels."""
        val = RankedScores(val_scores)
        observed = val.average_precision(self.val_observed)
        clean = (val.average_precision(self.data.val.clean)
                 if self.data.val.clean is not None else None)
        return observed, clean, average_precision(test_scores(), self.test_targets)


class GroupRecord:
    """A group's per-head history, best epoch (the first with the highest validation mAP) and
    early stopping, kept from its evaluated epochs in order."""

    def __init__(self, configs: Sequence[GridPoint], steps: int, val_variant: str,
                 early_stop: str, weight: Tensor, bias: Tensor, state: dict[str, Tensor]):
        heads = len(configs)
        self.configs, self.steps = list(configs), steps
        self.val_variant, self.early_stop = val_variant, early_stop
        self.best_val = torch.full((heads,), -math.inf, dtype=torch.float64)
        self.best_epoch = [-1] * heads
        self.best_weight, self.best_bias, self.best_state = weight, bias, state
        self.best_test_ap = torch.zeros(heads, weight.shape[-1], dtype=torch.float64)
        self.active = torch.ones(heads, dtype=torch.bool)
        self.stopped_at: list[int | None] = [None] * heads
        self.history: list[list[EpochRecord]] = [[] for _ in configs]

    def record(self, done: LossEpoch) -> list[int]:
        """Keep one evaluated epoch (epochs arrive in order); the heads early stopping stops
        now (they keep their best weights)."""
        epoch = done.epoch
        val_map, val_observed_map, test_ap = done.evaluated()
        test_map, train_map, extra = _map(test_ap), done.train_map, done.extra
        selection = selection_score(self.val_variant, val_map, val_observed_map, epoch)
        improved = (selection > self.best_val) & self.active
        for h in range(len(self.configs)):
            if not self.active[h]:
                continue
            self.history[h].append(EpochRecord(
                epoch=epoch, train_loss=float(done.loss_sum[h]) / self.steps,
                val_map=None if val_map is None else float(val_map[h]),
                val_map_observed=float(val_observed_map[h]), test_map=float(test_map[h]),
                train_map=None if train_map is None else float(train_map[h]),
                extra={k: (v[h] if isinstance(v, (list, tuple)) else v) for k, v in extra.items()},
            ))
            if improved[h]:
                self.best_epoch[h] = epoch
        if improved.any():
            self.keep_best(improved, selection, done, test_ap)
        stop = self.active & should_stop(self.early_stop, self.best_val, selection, improved)
        stopped = torch.nonzero(stop).flatten().tolist()
        for h in stopped:
            self.active[h] = False
            self.stopped_at[h] = epoch
        return stopped

    def keep_best(self, improved: Tensor, selection: Tensor, done: LossEpoch,
                  test_ap: Tensor) -> None:
        mask = improved.to(self.best_weight.device).view(-1, 1, 1)
        self.best_val = torch.where(improved, selection, self.best_val)
        self.best_weight = torch.where(mask, done.weight, self.best_weight)
        self.best_bias = torch.where(mask, done.bias, self.best_bias)
        for name in self.best_state:
            self.best_state[name] = torch.where(mask, done.state[name], self.best_state[name])
        self.best_test_ap = torch.where(improved.view(-1, 1), test_ap.cpu(), self.best_test_ap)

    def results(self, seconds: float) -> list[HeadResult]:
        heads = len(self.configs)
        return [HeadResult(
            config=config, epochs=self.history[h], best_epoch=self.best_epoch[h],
            best_val=float(self.best_val[h]),
            weight=self.best_weight[h].t().contiguous().cpu(), bias=self.best_bias[h, 0].cpu(),
            state={name: value[h].cpu() for name, value in self.best_state.items()},
            test_ap=self.best_test_ap[h], stopped_at=self.stopped_at[h], seconds=seconds / heads,
        ) for h, config in enumerate(self.configs)]


@dataclass
class EpochState:
    """One finished epoch of a group: what its evaluation reads, then what it found.

    Tensors hold every head of the group; ``extra`` (what each loss's ``end_epoch`` reported)
    and ``state`` (learned state, keyed by (loss, name)) are per loss, in the group's order.
    """

    epoch: int
    loss_sum: Tensor
    extra: list[dict]
    weight: Tensor
    bias: Tensor
    state: dict[tuple[int, str], Tensor]
    val_map: Tensor | None = None
    val_map_observed: Tensor | None = None
    test_ap: Tensor | None = None
    train_map: Tensor | None = None

    def parts(self, sizes: Sequence[int]) -> list[LossEpoch]:
        """This epoch of each loss of the group (``sizes``: their numbers of heads, in order),
        as it would be for the loss alone (views)."""
        parts, start = [], 0
        for index, size in enumerate(sizes):
            heads = slice(start, start + size)
            start += size

            def cut(value: Tensor | None, heads: slice = heads) -> Tensor | None:
                return None if value is None else value[heads]

            parts.append(LossEpoch(
                self.epoch, self.loss_sum[heads], self.extra[index] if self.extra else {},
                self.weight[heads], self.bias[heads],
                {name: value for (owner, name), value in self.state.items() if owner == index},
                cut(self.val_map), cut(self.val_map_observed), cut(self.test_ap),
                cut(self.train_map)))
        return parts


@dataclass
class LossEpoch:
    """One epoch of one loss of a group, evaluated: what its record keeps."""

    epoch: int
    loss_sum: Tensor
    extra: dict
    weight: Tensor
    bias: Tensor
    state: dict[str, Tensor]
    val_map: Tensor | None
    val_map_observed: Tensor | None
    test_ap: Tensor | None
    train_map: Tensor | None

    def evaluated(self) -> tuple[Tensor | None, Tensor, Tensor]:
        """(validation mAP against full labels or None, against observed labels, per-class test
        AP), refused when the epoch was not evaluated."""
        if self.val_map_observed is None or self.test_ap is None:
            raise ValueError(f"epoch {self.epoch} has not been evaluated")
        return self.val_map, self.val_map_observed, self.test_ap


class TrainingPredictions:
    """The predictions each training row got from the step that trained on it (one epoch).

    This is the reference code's training-set mAP (Cole et al. Table 2, "label recovery"):
    each row's prediction from the step that trained on it, against the clean labels; rows of
    the dropped last batch are left out.
    """

    def __init__(self, heads: int, rows: int, classes: int, device: torch.device):
        self.probs = torch.empty(heads, rows, classes, device=device)
        self.index = torch.empty(rows, dtype=torch.int64, device=device)

    def put(self, slot: Tensor, block: slice, logits: Tensor) -> None:
        """The probabilities of heads ``block`` of a batch's logits (H, B, L) at positions
        ``slot`` (B,) of the epoch (the rows go in :attr:`index` at the same positions)."""
        self.probs[block].index_copy_(1, slot, torch.sigmoid(logits[block]))

    def put_batch(self, number: int, block: slice, logits: Tensor) -> None:
        """:meth:`put` of the epoch's batch ``number``, whose rows take the next B positions."""
        size = logits.shape[1]
        self.probs[block, number * size:(number + 1) * size].copy_(torch.sigmoid(logits[block]))

    def mean_average_precision(self, clean: Tensor) -> Tensor:
        """mAP in percent per head. The rows stay in the order they were trained in (a column's
        AP sums its positives' precisions in the order of their scores, whatever the order of
        the rows: the same numbers as in split order, without a copy of the predictions)."""
        return _map(average_precision(self.probs, positives_in_order(clean, self.index)))


def positives_in_order(clean: Tensor, index: Tensor) -> Tensor:
    """The rows ``index`` of the full labels as a bool matrix: one allocation for a labels
    file's uint8 labels (0 or 1, checked when read, so the bytes are already bools)."""
    rows = clean.index_select(0, index)
    return rows.view(torch.bool) if rows.dtype == torch.uint8 else rows > 0


def feature_rows(split: SplitData) -> FeatureRows:
    """The feature rows of a split: its tensor, or the streamed source it carries."""
    if isinstance(split, StreamedSplit):
        return split.feature_rows
    if isinstance(split, SplitTensors):
        return MemoryRows(split.features)
    raise TypeError(f"a split holds its features or streams them, not {type(split).__name__}")


def _map(ap: Tensor) -> Tensor:
    """mAP in percent per head (CPU float64) from per-class AP (..., L)."""
    return (ap.mean(dim=-1) * 100.0).cpu()
