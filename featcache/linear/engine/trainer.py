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
import logging
import time
import weakref
from collections.abc import Callable, Sequence

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
from featcache.linear.engine.graphs import (
    Backend,
    Branches,
    DeviceBatches,
    GraphedSteps,
    NoStream,
    graph_backend,
    graphs_enabled,
)
from featcache.linear.engine.member import LossMember, Member, create_heads
from featcache.linear.engine.optimizer import StackedAdam
from featcache.linear.engine.rows import EpochLabels, MemoryRows
from featcache.losses import Targets
from featcache.progress import progress as progress_bar
from featcache.protocol.grid import GridPoint
from featcache.protocol.seeds import derive_seed
from featcache.protocol.selection import check_early_stop, check_val_variant

log = logging.getLogger(__name__)


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
                 val_variant: str, early_stop: str, device: torch.device,
                 graphs: bool | None = None):
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
        in_memory = isinstance(self.train_rows, MemoryRows)
        self.labels = EpochLabels(data.train, self.steps, batch_size, device, buffers=in_memory)
        # what every step adds to (kept where they are: a CUDA graph writes them)
        self.loss_sum = torch.zeros(self.head.num_heads, dtype=torch.float64, device=device)
        self.running = (TrainingPredictions(self.head.num_heads, self.steps * batch_size,
                                            data.num_classes, device)
                        if data.train.clean is not None else None)
        self.graphs: GraphedSteps | None = None
        self.batches: DeviceBatches | None = None
        self._graph_path((graphs_enabled(device) if graphs is None else graphs) and in_memory)

    def _graph_path(self, graphed: bool) -> None:
        """On CUDA with graphs: the losses' branches, the graphs' backend and the device
        batches (none where no stream is free); the streams go back to the lease when the
        group is done (:attr:`close`), or forgotten."""
        device = self.device
        self.branches = Branches(device, len(self.members), forked=graphed and device.type == "cuda")
        backend = None
        if graphed:
            try:
                backend = graph_backend(device, joined=self.branches.streams)
            except NoStream as why:
                log.warning("%s: trains without CUDA graphs: %s", self.describe(), why)
                self.branches.close()
        if backend is not None:
            self.batches = DeviceBatches(self.steps, self.batch_size, device)
            self.graphs = GraphedSteps(backend, self.describe(), self.adam)
        self.close = weakref.finalize(self, _release, backend, self.branches)

    @property
    def sizes(self) -> list[int]:
        """Each loss's number of heads, in the group's order."""
        return [m.member.heads for m in self.members]

    def run(self, progress: bool, position: int) -> list[list[HeadResult]]:
        """Train and evaluate every epoch here; each loss's heads' results. The group's
        streams are given back at the end (:attr:`close`)."""
        try:
            return self._run(progress, position)
        finally:
            self.close()

    def _run(self, progress: bool, position: int) -> list[list[HeadResult]]:
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

    def describe(self) -> str:
        """The group in a few words: its losses, batch size, seed and heads."""
        names = ",".join(m.member.loss for m in self.members)
        if len(names) > 24:
            names = plural(len(self.members), "loss", "losses")
        return f"{names} bs={self.batch_size} seed={self.seed} x{self.head.num_heads}"

    def progress_bar(self, progress: bool, position: int) -> tqdm:
        return progress_bar(
            total=self.epochs * self.steps, unit="step", disable=not progress, leave=False,
            mininterval=1.0, position=position, desc=self.describe())

    def train_and_finish(self, epoch: int) -> EpochState:
        """One epoch's training and the losses' end-of-epoch updates: what its evaluation needs."""
        for member in self.members:
            member.loss.begin_epoch(epoch, self.epochs, member.state)
        self.train_epoch(epoch)
        return self.finish_epoch(epoch, self.loss_sum.clone(), self.running)

    def train_epoch(self, epoch: int) -> None:
        """One pass in a seeded order, adding each step's per-head loss to :attr:`loss_sum` and
        its predictions to :attr:`running`: step by step, or replayed as CUDA graphs whose
        steps read their batch on the device (:mod:`featcache.linear.engine.graphs`)."""
        self.loss_sum.zero_()
        rows = self.train_rows
        if self.graphs is not None and self.batches is not None and isinstance(rows, MemoryRows):
            order = rows.order(self.order, self.batch_size)
            self.batches.begin(order)
            self.labels.fill(order)
            self.graphs.run_epoch(self.steps, functools.partial(self.device_step, epoch))
            return
        running, in_order = self.running, False
        if isinstance(rows, MemoryRows):  # the epoch's rows known up front
            order = rows.order(self.order, self.batch_size)
            self.labels.fill(order)
            in_order = True
            if running is not None:
                running.index.copy_(order)
            batches = ((index, rows.gather(index), self.labels.batch(number, index))
                       for number, index in enumerate(order.view(-1, self.batch_size)))
        else:
            batches = ((index, x, self.labels.gather(index))
                       for index, x in rows.epoch(self.order, self.batch_size))
        for number, (index, x, targets) in enumerate(batches):
            check_stop()
            keep = None if running is None else functools.partial(running.put_batch, number)
            per_head, _ = self.train_step(x, targets, epoch, keep)
            self.loss_sum.add_(per_head)
            if running is not None and not in_order:
                running.index[number * self.batch_size:(number + 1) * self.batch_size].copy_(index)

    def device_step(self, epoch: int) -> None:
        """One training step that finds its batch on the device (the rows the device step
        counter points at, their features and labels) and moves the counter on: what a CUDA
        graph records, the plain step's operations on the same values."""
        assert self.batches is not None and isinstance(self.train_rows, MemoryRows)
        index = self.batches.take()
        running, keep = self.running, None
        if running is not None:
            slots = self.batches.slots()
            running.index.index_copy_(0, slots, index)
            keep = functools.partial(running.put, slots)
        per_head, _ = self.train_step(self.train_rows.gather(index),
                                      self.labels.take(self.batches.counter, index), epoch, keep)
        self.loss_sum.add_(per_head)
        self.batches.advance()

    def train_step(self, x: Tensor, targets: Targets, epoch: int,
                   keep: Callable[[slice, Tensor], None] | None = None) -> tuple[Tensor, Tensor]:
        """One Adam step of every head on the batch ``x`` (its labels ``targets``): one batched
        matmul for the logits of all heads, each loss's share of the step on its block
        (:meth:`LossMember.step`; on CUDA with graphs, the losses' shares as parallel branches,
        :class:`~featcache.linear.engine.graphs.Branches`), the heads' gradients as two batched
        matmuls (:meth:`~featcache.heads.LinearHeads.grads`), one optimizer update.
        ``keep(block, logits)`` sees each loss's block of the logits in its share (the training
        predictions). Returns the per-head loss and the batch's logits."""
        logits = self.head.forward(x)

        def share(member: LossMember) -> Callable[[], tuple[Tensor, Tensor, Sequence[Tensor]]]:
            def run() -> tuple[Tensor, Tensor, Sequence[Tensor]]:
                if keep is not None:
                    keep(member.block, logits)
                return member.step(self.head, x, logits, targets, epoch)
            return run

        steps = self.branches.run([share(m) for m in self.members])
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


def _release(backend: Backend | None, branches: Branches) -> None:
    """A group's leased streams back to the lease."""
    if backend is not None:
        backend.close()
    branches.close()


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
