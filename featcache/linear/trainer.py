"""Train a group of linear heads that share a batch size, all at once.

One group = one seed and one batch size; its heads are the grid's learning rates (and loss
parameter values). Each epoch draws one seeded permutation of the training rows, steps through
it in batches (the last partial batch is dropped, as the reference code's training loader does),
then evaluates every head on the whole validation and test splits (the reference also drops the
last partial batch there; we evaluate every example). Per-head selection follows the reference:
the best epoch is the first one with the highest validation mAP
(:mod:`featcache.protocol.selection`).

Evaluation need not run where the heads train: without early stopping and without state
trained beside the heads, a group's training does not depend on its evaluation, so
:meth:`GroupTrainer.train_only` keeps each epoch's heads (:class:`TrainedGroup`) and other
workers evaluate them (:class:`Evaluation`, :meth:`TrainedGroup.finish`): the same operations
on the same weights, so the same numbers, with no core left idle while the slowest group
evaluates (:mod:`featcache.linear.search`).

A stop request (Ctrl-C, :mod:`featcache.interrupt`) is honoured at the next training step or
before the next evaluation: the group is abandoned (it has no partial output) and
:class:`~featcache.errors.Interrupted` rises to the search, which keeps the losses whose groups
all finished.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from featcache.errors import OptionError
from featcache.interrupt import check_stop
from featcache.linear.data import TrainingSplits
from featcache.linear.heads import StackedAdam, StackedLinear, create_heads
from featcache.linear.memory import FLOAT32, STACKED_SCORES_BYTES
from featcache.linear.rows import FeatureRows, MemoryRows
from featcache.losses import SPMLLoss, Targets, create_loss
from featcache.metrics import RankedScores, average_precision
from featcache.progress import progress as progress_bar
from featcache.protocol.grid import GridPoint
from featcache.protocol.records import EpochRecord
from featcache.protocol.seeds import derive_seed
from featcache.protocol.selection import (
    check_early_stop,
    check_val_variant,
    selection_score,
    should_stop,
)


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


def train_group(data: TrainingSplits, loss_name: str, configs: Sequence[GridPoint], epochs: int,
                val_variant: str = "clean", early_stop: str = "none",
                device: torch.device | str = "cpu", progress: bool = True,
                position: int = 0) -> list[HeadResult]:
    """Train the heads of ``configs`` (one seed, one batch size) together; one result each."""
    if not configs:
        return []
    return GroupTrainer(data, loss_name, configs, epochs, val_variant, early_stop,
                        torch.device(device)).run(progress, position)


def _float_labels(loss: SPMLLoss, observed: Tensor, clean: Tensor | None
                  ) -> tuple[Tensor, Tensor | None]:
    """The training split's labels as float32 for the loss's ``init_state``: copies of the
    compact labels only for a loss that keeps per-example state (the others would build and
    drop two (N, L) float matrices, the largest allocation of a one-configuration run)."""
    if type(loss).init_state is SPMLLoss.init_state:
        return observed, clean
    return observed.float(), None if clean is None else clean.float()


def evaluation_can_move(loss: type[SPMLLoss], early_stop: str) -> bool:
    """Whether groups of ``loss`` train without ever reading their evaluation (no early
    stopping, no state trained beside the heads), so that others may evaluate their epochs
    (:meth:`GroupTrainer.train_only`)."""
    return early_stop == "none" and not loss.learned_state


class GroupTrainer:
    """The stacked heads, loss state and optimizer of one group; its per-head bookkeeping is
    :attr:`book` (:class:`GroupRecord`)."""

    def __init__(self, data: TrainingSplits, loss_name: str, configs: Sequence[GridPoint],
                 epochs: int, val_variant: str, early_stop: str, device: torch.device):
        batch_size, seed = configs[0].batch_size, configs[0].seed
        if any(c.batch_size != batch_size or c.seed != seed for c in configs):
            raise ValueError("train_group needs configurations with one batch size and one seed")
        check_early_stop(early_stop)
        check_val_variant(val_variant, data.val.clean is not None, data.labels.path)
        self.steps = len(data.train) // batch_size
        if self.steps == 0:
            raise OptionError(f"batch size {batch_size} is larger than the {len(data.train)} "
                              "training rows")
        self.data, self.configs, self.epochs = data, list(configs), epochs
        self.loss_name, self.val_variant, self.early_stop = loss_name, val_variant, early_stop
        self.batch_size, self.seed, self.device = batch_size, seed, device
        heads, classes = len(configs), data.num_classes
        params = {k: [c.param_dict[k] for c in configs] for k in configs[0].param_dict}
        self.loss = create_loss(loss_name, classes, heads, params=params, facts=data.facts)

        self.head = create_heads(
            self.loss, data.feature_dim, data.spatial_shape, classes,
            [torch.Generator().manual_seed(derive_seed(seed, "head", c.key())) for c in configs],
            device=device, source=str(getattr(data.features, "path", None) or "the features"))
        state = self.loss.init_state(
            *_float_labels(self.loss, data.train.observed, data.train.clean),
            generator=torch.Generator().manual_seed(derive_seed(seed, "state", batch_size)))
        self.state = {k: v.detach().to(device) for k, v in state.items()}
        self.learned = self.loss.learned_state_lr_mults()
        for name in self.learned:
            self.state[name].requires_grad_(True)
        lrs = [c.lr for c in configs]
        self.optim_params = self.head.parameters() + [self.state[name] for name in self.learned]
        decays = [c.weight_decay for c in configs]  # the probe search's; the head's alone
        self.adam = StackedAdam(self.optim_params, [lrs, lrs] + [
            [lr * m for lr, m in zip(lrs, self.learned[name], strict=True)] for name in self.learned],
            weight_decays=[decays, decays] + [[0.0] * heads for _ in self.learned]
            if any(decays) else None)
        self.order = torch.Generator().manual_seed(derive_seed(seed, "order", batch_size))
        self.learned_tensors = [self.state[name] for name in self.learned]
        # a hand-written loss gradient, until the loss says it has none (state it trains keeps
        # autograd)
        self.by_hand = not self.learned
        self.train_rows = feature_rows(data.train)
        self.book = GroupRecord(self.configs, self.steps, val_variant, early_stop,
                                self.head.weight.detach().clone(),
                                self.head.bias.detach().clone(),
                                {name: self.state[name].detach().clone() for name in self.learned})

    @property
    def can_defer(self) -> bool:
        """Whether the training never reads its evaluation (no early stopping, no state trained
        beside the heads): then :meth:`train_only` may leave the evaluation to others."""
        return evaluation_can_move(type(self.loss), self.early_stop)

    def run(self, progress: bool, position: int) -> list[HeadResult]:
        """Train and evaluate every epoch here; each head's result."""
        started = time.perf_counter()
        evaluation = Evaluation(self.data)
        bar = self.progress_bar(progress, position)
        for epoch in range(self.epochs):
            done = self.train_and_finish(epoch)
            bar.update(self.steps)
            check_stop()
            for h in self.book.record(evaluation.evaluate(self.head, done)):
                # A stopped head keeps its best weights and stops moving (its learning rates are 0).
                self.adam.set_lr(h, 0.0)
            bar.set_postfix(best_val=f"{float(self.book.best_val.max()):.2f}")
            if not self.book.active.any():
                break
        bar.close()
        return self.book.results(time.perf_counter() - started)

    def train_only(self, progress: bool, position: int) -> TrainedGroup:
        """Train every epoch and keep each epoch's heads for evaluation elsewhere (only where
        :attr:`can_defer`)."""
        if not self.can_defer:
            raise ValueError("this group's training reads its evaluation; use run()")
        started = time.perf_counter()
        bar = self.progress_bar(progress, position)
        epochs = []
        for epoch in range(self.epochs):
            done = self.train_and_finish(epoch)
            done.weight, done.bias = done.weight.clone(), done.bias.clone()
            epochs.append(done)
            bar.update(self.steps)
        bar.close()
        return TrainedGroup(self.head.without_weights(), epochs, self.book, time.perf_counter() - started)

    def progress_bar(self, progress: bool, position: int):
        return progress_bar(
            total=self.epochs * self.steps, unit="step", disable=not progress, leave=False,
            mininterval=1.0, position=position,
            desc=f"{self.loss_name} bs={self.batch_size} seed={self.seed} x{len(self.configs)}")

    def train_and_finish(self, epoch: int) -> EpochState:
        """One epoch's training and the loss's end-of-epoch update: what its evaluation needs."""
        self.loss.begin_epoch(epoch, self.epochs, self.state)
        loss_sum, running = self.train_epoch(epoch)
        return self.finish_epoch(epoch, loss_sum, running)

    def train_epoch(self, epoch: int) -> tuple[Tensor, TrainingPredictions | None]:
        """One pass in a seeded order: (per-head loss sum, the predictions made while training)."""
        train = self.data.train
        loss_sum = torch.zeros(len(self.configs), dtype=torch.float64, device=self.device)
        running = (TrainingPredictions(len(self.configs), self.steps * self.batch_size,
                                       self.data.num_classes, self.device)
                   if train.clean is not None else None)
        for step, (index, x) in enumerate(self.train_rows.epoch(self.order, self.batch_size)):
            check_stop()
            per_head, logits = self.train_step(x, index, epoch)
            loss_sum += per_head
            if running is not None:
                running.put(step * self.batch_size, index, logits)
        return loss_sum, running

    def train_step(self, x: Tensor, index: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        """One Adam step of every head on the batch ``x`` (rows ``index`` of the training split).

        The loss's gradient comes from its hand-written form where it has one
        (:meth:`~featcache.losses.SPMLLoss.loss_and_grad`, the same bits), else from autograd
        run through the loss only; the heads' gradients are two batched matmuls
        (:meth:`StackedLinear.grads`). Returns the per-head loss and the batch's logits.
        """
        train = self.data.train
        targets = Targets(train.observed.index_select(0, index).float(), index,
                          None if train.clean is None else train.clean.index_select(0, index).float(),
                          None if train.pseudo is None else train.pseudo.index_select(0, index))
        logits = self.head.forward(x)
        if self.loss.masked_pass:  # IGNORE: the second pass, on the positive's masked maps
            keep = self.loss.position_mask(self.head.last_cam(x), targets.observed)
            targets.masked = self.head.masked_logits(x, keep)
        by_hand = self.loss.loss_and_grad(logits, targets, self.state, epoch) if self.by_hand else None
        if by_hand is not None:
            per_head, grad_logits = by_hand
            self.adam.step(self.head.grads(x, grad_logits))
            return per_head, logits
        self.by_hand = False
        logits.requires_grad_(True)
        per_head = self.loss.forward(logits, targets, self.state, epoch)
        grads = torch.autograd.grad(per_head.sum(), [logits, *self.learned_tensors])
        self.adam.step([*self.head.grads(x, grads[0]), *grads[1:]])
        return per_head.detach(), logits.detach()

    def finish_epoch(self, epoch: int, loss_sum: Tensor,
                     running: TrainingPredictions | None) -> EpochState:
        """The loss's end-of-epoch update and the training mAP, then what the evaluation of
        this epoch needs (the heads as they are now: views, not copies)."""
        with torch.no_grad():
            extra = self.loss.end_epoch(epoch, self.epochs,
                                        lambda: self.train_rows.scores(self.head),
                                        self.state) or {}
        weight, bias = self.head.weight.detach(), self.head.bias.detach()
        state = {name: self.state[name].detach() for name in self.learned}
        train_map = (running.mean_average_precision(self.data.train.clean)
                     if running is not None else None)
        return EpochState(epoch, loss_sum, extra, weight, bias, state, train_map=train_map)


class Evaluation:
    """What evaluating a group's heads reads: the validation and test rows and their labels."""

    def __init__(self, data: TrainingSplits):
        self.data = data
        self.val_rows, self.test_rows = feature_rows(data.val), feature_rows(data.test)
        self.val_observed = (data.val.observed == 1).float()
        self.test_targets = (data.test.clean if data.test.clean is not None
                             else (data.test.observed == 1).float())

    @torch.no_grad()
    def evaluate(self, heads: StackedLinear, done: EpochState) -> EpochState:
        """Validation and test mAP of heads like ``heads`` (a group's heads, or the same
        :meth:`~StackedLinear.without_weights`) with ``done``'s weights, the epoch ``done.epoch``."""
        head = heads.frozen(done.weight, done.bias)
        observed, clean, done.test_ap = self._aps(self.val_rows.scores(head),
                                                  lambda: self.test_rows.scores(head))
        done.val_map_observed = _map(observed)
        if clean is not None:
            done.val_map = _map(clean)
        return done

    def _aps(self, val_scores: Tensor, test_scores) -> tuple[Tensor, Tensor | None, Tensor]:
        """Per-class AP (..., L) of validation scores against the observed and (when known) the
        full labels, and of the test scores (``test_scores()``, made once the validation split
        is ranked) against the test labels."""
        val = RankedScores(val_scores)
        observed = val.average_precision(self.val_observed)
        clean = (val.average_precision(self.data.val.clean)
                 if self.data.val.clean is not None else None)
        return observed, clean, average_precision(test_scores(), self.test_targets)

    @torch.no_grad()
    def evaluate_epochs(self, heads: StackedLinear, epochs: Sequence[EpochState],
                        ) -> list[EpochState]:
        """:meth:`evaluate` of several epochs of one group: their heads scored together (one
        matmul per split, where that gives each epoch's numbers exactly) and ranked together
        (each (head, class) column's AP is computed alone either way), when they are plain
        linear heads on rows held in memory and the scores stay under
        :data:`STACKED_SCORES_BYTES`; else one epoch at a time."""
        rows = max(len(self.val_rows), len(self.test_rows))
        width = len(epochs) * heads.num_heads * self.data.num_classes
        if (type(heads) is not StackedLinear or len(epochs) < 2
                or not isinstance(self.val_rows, MemoryRows)
                or not isinstance(self.test_rows, MemoryRows)
                or rows * width * FLOAT32 > STACKED_SCORES_BYTES):
            return [self.evaluate(heads, done) for done in epochs]
        stacked = heads.frozen(torch.cat([done.weight for done in epochs]),
                               torch.cat([done.bias for done in epochs]))
        per_epoch = (len(epochs), -1, self.data.num_classes)
        observed, clean, test = self._aps(
            self.val_rows.scores_of_epochs(stacked, len(epochs)),
            lambda: self.test_rows.scores_of_epochs(stacked, len(epochs)))
        for index, done in enumerate(epochs):
            done.val_map_observed = _map(observed.view(per_epoch)[index])
            if clean is not None:
                done.val_map = _map(clean.view(per_epoch)[index])
            done.test_ap = test.view(per_epoch)[index].clone()
        return list(epochs)


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

    def record(self, done: EpochState) -> list[int]:
        """Keep one evaluated epoch (epochs arrive in order); the heads early stopping stops
        now (they keep their best weights)."""
        epoch, val_map, val_observed_map = done.epoch, done.val_map, done.val_map_observed
        test_map, train_map, extra = _map(done.test_ap), done.train_map, done.extra
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
            self.keep_best(improved, selection, done)
        stop = self.active & should_stop(self.early_stop, self.best_val, selection, improved)
        stopped = torch.nonzero(stop).flatten().tolist()
        for h in stopped:
            self.active[h] = False
            self.stopped_at[h] = epoch
        return stopped

    def keep_best(self, improved: Tensor, selection: Tensor, done: EpochState) -> None:
        mask = improved.to(self.best_weight.device).view(-1, 1, 1)
        self.best_val = torch.where(improved, selection, self.best_val)
        self.best_weight = torch.where(mask, done.weight, self.best_weight)
        self.best_bias = torch.where(mask, done.bias, self.best_bias)
        for name in self.best_state:
            self.best_state[name] = torch.where(mask, done.state[name], self.best_state[name])
        self.best_test_ap = torch.where(improved.view(-1, 1), done.test_ap.cpu(), self.best_test_ap)

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
class TrainedGroup:
    """A group trained without its evaluation (:meth:`GroupTrainer.train_only`): each epoch's
    heads, to evaluate anywhere (:class:`Evaluation`), then :meth:`finish` in order."""

    empty_heads: StackedLinear  # the group's heads without weights, which evaluation scores with
    epochs: list[EpochState]
    book: GroupRecord
    seconds: float

    def chunks(self, size: int) -> list[list[EpochState]]:
        """The epochs in consecutive runs of ``size`` (the units handed to evaluators)."""
        return [self.epochs[i:i + size] for i in range(0, len(self.epochs), max(1, size))]

    def finish(self, evaluated: Sequence[EpochState], seconds: float = 0.0) -> list[HeadResult]:
        """Each head's result from every epoch evaluated (in order), ``seconds`` of evaluation
        added to the training's."""
        for done in evaluated:
            self.book.record(done)
        return self.book.results(self.seconds + seconds)


@dataclass
class EpochState:
    """One finished epoch of a group: what its evaluation reads, then what it found."""

    epoch: int
    loss_sum: Tensor
    extra: dict
    weight: Tensor
    bias: Tensor
    state: dict[str, Tensor]
    val_map: Tensor | None = None
    val_map_observed: Tensor | None = None
    test_ap: Tensor | None = None
    train_map: Tensor | None = None


class TrainingPredictions:
    """The predictions each training row got from the step that trained on it (one epoch).

    This is the reference code's training-set mAP (Cole et al. Table 2, "label recovery"):
    each row's prediction from the step that trained on it, against the clean labels; rows of
    the dropped last batch are left out.
    """

    def __init__(self, heads: int, rows: int, classes: int, device: torch.device):
        self.probs = torch.empty(heads, rows, classes, device=device)
        self.index = torch.empty(rows, dtype=torch.int64, device=device)

    def put(self, start: int, index: Tensor, logits: Tensor) -> None:
        stop = start + index.shape[0]
        self.probs[:, start:stop] = torch.sigmoid(logits)
        self.index[start:stop] = index

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


def feature_rows(split) -> FeatureRows:
    """The feature rows of a split: its tensor, or the streamed source it carries."""
    rows = getattr(split, "feature_rows", None)
    return rows if rows is not None else MemoryRows(split.features)


def _map(ap: Tensor) -> Tensor:
    """mAP in percent per head (CPU float64) from per-class AP (..., L)."""
    return (ap.mean(dim=-1) * 100.0).cpu()
