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

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from featcache.errors import OptionError
from featcache.heads import LinearHeads, MapHeads
from featcache.interrupt import check_stop
from featcache.linear.data import TrainingSplits
from featcache.linear.evaluation import (
    EpochState,
    Evaluation,
    GroupRecord,
    HeadResult,
    TrainedGroup,
    TrainingPredictions,
    feature_rows,
)
from featcache.linear.heads import StackedAdam, create_heads
from featcache.losses import MaskedPassLoss, SPMLLoss, Targets, create_loss
from featcache.progress import progress as progress_bar
from featcache.protocol.grid import GridPoint
from featcache.protocol.seeds import derive_seed
from featcache.protocol.selection import check_early_stop, check_val_variant


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


def masked_pass(loss: SPMLLoss, head: LinearHeads) -> tuple[MaskedPassLoss, MapHeads] | None:
    """The loss and the heads of a masked second pass (a :class:`MaskedPassLoss` on heads with
    class activation maps), None for the other losses."""
    if not isinstance(loss, MaskedPassLoss):
        return None
    if not isinstance(head, MapHeads):
        raise TypeError(f"loss {loss.name!r} needs heads with class activation maps")
    return loss, head


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
        self.masked_pass = masked_pass(self.loss, self.head)
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
        (:meth:`LinearHeads.grads`). Returns the per-head loss and the batch's logits.
        """
        train = self.data.train
        targets = Targets(train.observed.index_select(0, index).float(), index,
                          None if train.clean is None else train.clean.index_select(0, index).float(),
                          None if train.pseudo is None else train.pseudo.index_select(0, index))
        logits = self.head.forward(x)
        if self.masked_pass is not None:  # IGNORE: the second pass, on the positive's masked maps
            loss, head = self.masked_pass
            targets.masked = head.masked_logits(x, loss.position_mask(head.last_cam(x),
                                                                       targets.observed))
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
        clean = self.data.train.clean
        train_map = (running.mean_average_precision(clean)
                     if running is not None and clean is not None else None)
        return EpochState(epoch, loss_sum, extra, weight, bias, state, train_map=train_map)


