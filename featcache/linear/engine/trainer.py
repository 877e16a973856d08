"""Train a group of heads that share a features file, a seed and a batch size, all at once.

One group = one seed and one batch size; its heads are the grid's learning rates (and loss
parameter values) of one loss, or of several losses stacked (:mod:`featcache.linear.engine.member`:
one gather of the batch, one batched matmul for all heads, one optimizer update over all
parameters, each loss's own terms on its own block of heads; every number as it would be for
the loss alone). Each epoch draws one seeded permutation of the training rows, steps through
it in batches (the last partial batch is dropped, as the reference code's training loader does),
then evaluates every head on the whole validation and test splits (the reference also drops the
last partial batch there; we evaluate every example). Per-head selection follows the reference:
the best epoch is the first one with the highest validation mAP
(:mod:`featcache.protocol.selection`).

A stop request (Ctrl-C, :mod:`featcache.interrupt`) is honoured at the next training step or
before the next evaluation: the group is abandoned (it has no partial output) and
:class:`~featcache.errors.Interrupted` rises to the search, which keeps the losses whose groups
all finished.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from featcache.errors import OptionError, plural
from featcache.heads import LinearHeads
from featcache.interrupt import check_stop
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.evaluation import (
    EpochState,
    Evaluation,
    HeadResult,
    TrainingPredictions,
    feature_rows,
)
from featcache.linear.engine.graphs import Body, GraphedEpoch, StepBuffers, graphs_enabled
from featcache.linear.engine.member import LossMember, Member, create_heads
from featcache.linear.engine.optimizer import StackedAdam
from featcache.linear.engine.rows import MemoryRows
from featcache.losses import Targets
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
    trainer = GroupTrainer(data, [Member(loss_name, tuple(configs))], epochs, val_variant,
                           early_stop, torch.device(device))
    return trainer.run(progress, position)[0]


class GroupTrainer:
    """The stacked heads of one group's losses (:class:`~featcache.linear.engine.member.LossMember`,
    each with its loss state and bookkeeping) and the optimizer over all of them."""

    def __init__(self, data: TrainingSplits, members: Sequence[Member], epochs: int,
                 val_variant: str, early_stop: str, device: torch.device):
        configs = [c for member in members for c in member.configs]
        batch_size, seed = configs[0].batch_size, configs[0].seed
        if any(c.batch_size != batch_size or c.seed != seed for c in configs):
            raise ValueError("a group's configurations share one batch size and one seed")
        check_early_stop(early_stop)
        check_val_variant(val_variant, data.val.clean is not None, data.labels.path)
        self.steps = len(data.train) // batch_size
        if self.steps == 0:
            raise OptionError(f"batch size {batch_size} is larger than the {len(data.train)} "
                              "training rows")
        self.data, self.epochs = data, epochs
        self.val_variant, self.early_stop = val_variant, early_stop
        self.batch_size, self.seed, self.device = batch_size, seed, device
        ends = list(itertools.accumulate(member.heads for member in members))
        self.members = [LossMember(member, data, slice(end - member.heads, end), seed,
                                   batch_size, device) for member, end in zip(members, ends,
                                                                              strict=True)]
        self.head = stack_heads([
            create_heads(m.loss, data.feature_dim, data.spatial_shape, data.num_classes,
                         m.generators(), device=device,
                         source=str(getattr(data.features, "path", None) or "the features"))
            for m in self.members])
        for member in self.members:
            member.start_book(self.head, self.steps, val_variant, early_stop)
        lrs = [c.lr for c in configs]
        decays = [c.weight_decay for c in configs]  # the probe search's; the head's alone
        learned = [t for m in self.members for t in m.learned_tensors]
        learned_lrs = [lrs for m in self.members for lrs in m.adam_lrs()]
        learned_heads = [list(range(m.block.start, m.block.stop)) for m in self.members
                         for _ in m.learned_tensors]
        everyone = list(range(self.head.num_heads))
        self.adam = StackedAdam(
            [*self.head.parameters(), *learned], [lrs, lrs, *learned_lrs],
            weight_decays=([decays, decays, *[[0.0] * len(r) for r in learned_lrs]]
                           if any(decays) else None),
            heads=[everyone, everyone, *learned_heads])
        self.order = torch.Generator().manual_seed(derive_seed(seed, "order", batch_size))
        self.train_rows = feature_rows(data.train)

    @property
    def sizes(self) -> list[int]:
        """Each loss's number of heads, in the group's order."""
        return [m.member.heads for m in self.members]

    def run(self, progress: bool, position: int) -> list[list[HeadResult]]:
        """Train and evaluate every epoch here; each loss's heads' results."""
        started = time.perf_counter()
        evaluation = Evaluation(self.data)
        bar = self.progress_bar(progress, position)
        for epoch in range(self.epochs):
            done = self.train_and_finish(epoch)
            bar.update(self.steps)
            check_stop()
            evaluation.evaluate(self.head, done)
            for member, part in zip(self.members, done.parts(self.sizes), strict=True):
                for h in member.record().record(part):
                    # A stopped head keeps its best weights and stops moving (its lr is 0).
                    self.adam.set_lr(member.block.start + h, 0.0)
            bar.set_postfix(best_val=f"{max(float(m.record().best_val.max()) for m in self.members):.2f}")
            if not any(m.record().active.any() for m in self.members):
                break
        bar.close()
        seconds = time.perf_counter() - started
        return [m.record().results(seconds * m.member.heads / self.head.num_heads)
                for m in self.members]

    def progress_bar(self, progress: bool, position: int) -> tqdm:
        names = ",".join(m.member.loss for m in self.members)
        if len(names) > 24:
            names = plural(len(self.members), "loss", "losses")
        return progress_bar(
            total=self.epochs * self.steps, unit="step", disable=not progress, leave=False,
            mininterval=1.0, position=position,
            desc=f"{names} bs={self.batch_size} seed={self.seed} x{self.head.num_heads}")

    def train_and_finish(self, epoch: int) -> EpochState:
        """One epoch's training and the losses' end-of-epoch updates: what its evaluation needs."""
        for member in self.members:
            member.loss.begin_epoch(epoch, self.epochs, member.state)
        loss_sum, running = self.train_epoch(epoch)
        return self.finish_epoch(epoch, loss_sum, running)

    def train_epoch(self, epoch: int) -> tuple[Tensor, TrainingPredictions | None]:
        """One pass in a seeded order: (per-head loss sum, the predictions made while training)."""
        train = self.data.train
        loss_sum = torch.zeros(self.head.num_heads, dtype=torch.float64, device=self.device)
        running = (TrainingPredictions(self.head.num_heads, self.steps * self.batch_size,
                                       self.data.num_classes, self.device)
                   if train.clean is not None else None)
        slots = torch.arange(self.steps * self.batch_size, device=self.device).view(self.steps, -1)

        def body(x: Tensor, index: Tensor, slot: Tensor) -> None:
            per_head, logits = self.train_step(x, index, epoch)
            loss_sum.add_(per_head)
            if running is not None:
                running.put(slot, index, logits, self.head)

        if graphs_enabled(self.device):
            graphed = self.graphed(body, epoch)
            for number, (index, x) in enumerate(self.graph_batches()):
                check_stop()
                graphed(index, x, slots[number])
        else:
            for number, (index, rows) in enumerate(self.train_rows.epoch(self.order,
                                                                         self.batch_size)):
                check_stop()
                body(rows, index, slots[number])
        return loss_sum, running

    def graph_batches(self) -> Iterator[tuple[Tensor, Tensor | None]]:
        """One epoch's batches for a graphed step: (rows of the training split, their features,
        or None where the step gathers them from rows held on the device)."""
        rows = self.train_rows
        if isinstance(rows, MemoryRows):
            return ((index, None) for index in rows.indices(self.order, self.batch_size))
        return rows.epoch(self.order, self.batch_size)

    def graphed(self, body: Body, epoch: int) -> GraphedEpoch:
        """``body`` on fixed buffers, captured as a CUDA graph after a warm-up
        (:mod:`featcache.linear.engine.graphs`)."""
        rows = self.train_rows
        gather = rows.gather if isinstance(rows, MemoryRows) else None
        buffers = StepBuffers(body, self.batch_size, self.device, (self.data.feature_dim,),
                              gather)
        return GraphedEpoch(buffers, f"stage two, bs={self.batch_size} epoch {epoch + 1}",
                            after_replay=self.adam.count_step)

    def train_step(self, x: Tensor, index: Tensor, epoch: int) -> tuple[Tensor, Tensor]:
        """One Adam step of every head on the batch ``x`` (rows ``index`` of the training split):
        one batched matmul for the logits of all heads, each loss's share of the step on its
        block (:meth:`LossMember.step`), the heads' gradients as two batched matmuls
        (:meth:`~featcache.heads.LinearHeads.grads`), one optimizer update. Returns the
        per-head loss and the batch's logits."""
        train = self.data.train
        targets = Targets(train.observed.index_select(0, index).float(), index,
                          None if train.clean is None else train.clean.index_select(0, index).float(),
                          None if train.pseudo is None else train.pseudo.index_select(0, index))
        logits = self.head.forward(x)
        steps = [m.step(self.head, x, logits, targets, epoch) for m in self.members]
        if len(steps) == 1:
            per_head, grad_logits, learned = steps[0]
        else:
            per_head = torch.cat([s[0] for s in steps])
            grad_logits = torch.cat([s[1] for s in steps])
            learned = [g for s in steps for g in s[2]]
        self.head.grads(x, grad_logits, out=self.adam.grads[:2])
        for buffer, grad in zip(self.adam.grads[2:], learned, strict=True):
            buffer.copy_(grad)
        self.adam.step()
        return per_head, logits

    def finish_epoch(self, epoch: int, loss_sum: Tensor,
                     running: TrainingPredictions | None) -> EpochState:
        """The losses' end-of-epoch updates and the training mAP, then what the evaluation of
        this epoch needs (the heads as they are now: views, not copies)."""
        extras = []
        with torch.no_grad():
            for member in self.members:
                scores = functools.partial(self.train_rows.scores, self.head.part(member.block))
                extras.append(member.loss.end_epoch(epoch, self.epochs, scores, member.state)
                              or {})
        weight, bias = self.head.weight.detach(), self.head.bias.detach()
        state = {(i, name): m.state[name].detach() for i, m in enumerate(self.members)
                 for name in m.learned}
        clean = self.data.train.clean
        train_map = (running.mean_average_precision(clean)
                     if running is not None and clean is not None else None)
        return EpochState(epoch, loss_sum, extras, weight, bias, state, train_map=train_map)


def stack_heads(parts: Sequence[LinearHeads]) -> LinearHeads:
    """The heads of several losses as one set of heads (blocks in order); one loss's heads as
    they are. The losses' heads must be of one kind (the group's)."""
    if len(parts) == 1:
        return parts[0]
    kind = type(parts[0])
    if any(type(part) is not kind or part.positions != parts[0].positions for part in parts):
        raise ValueError("a stacked group's losses train heads of one kind on the same rows")
    params = {key: [v for part in parts for v in part.params[key]] for key in parts[0].params}
    return kind(torch.cat([p.weight.detach() for p in parts]),
                torch.cat([p.bias.detach() for p in parts]), positions=parts[0].positions,
                params=params, trainable=True, blocks=[p.num_heads for p in parts])
