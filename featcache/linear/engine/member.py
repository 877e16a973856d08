"""One loss in a stacked group: its loss object, its block of the group's heads, its
per-example state, its share of a training step and its bookkeeping.

A stacked group (:class:`~featcache.linear.engine.trainer.GroupTrainer`) trains the heads of several
losses that share a features file, a seed and a batch size as one set of heads: one gather of
the batch, one batched matmul for all heads, one optimizer update over all parameters. Each
loss computes its own terms on its own block of the logits (a contiguous slice, the shape it
would have alone), so every number of a loss is bit for bit what it would be trained alone on
the CPU: the batched matmuls compute each head on its own, and elementwise functions run on
each block alone (:attr:`featcache.heads.LinearHeads.blocks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.autograd.variable import Variable

from featcache.constants import cached_constant
from featcache.errors import InputError
from featcache.heads import LinearHeads, MapHeads
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.evaluation import GroupRecord
from featcache.losses import MaskedPassLoss, SPMLLoss, Targets, create_loss
from featcache.protocol.grid import GridPoint
from featcache.protocol.seeds import derive_seed

#: autograd's engine, called as ``torch.autograd.grad`` calls it
run_backward = Variable._execution_engine.run_backward


@dataclass(frozen=True)
class Member:
    """One loss's share of a stacked group: its configurations (one seed, one batch size)."""

    loss: str
    configs: tuple[GridPoint, ...]

    @property
    def heads(self) -> int:
        return len(self.configs)


def float_labels(loss: SPMLLoss, observed: Tensor, clean: Tensor | None
                 ) -> tuple[Tensor, Tensor | None]:
    """The training split's labels as float32 for the loss's ``init_state``: copies of the
    compact labels only for a loss that keeps per-example state (the others would build and
    drop two (N, L) float matrices, the largest allocation of a one-configuration run)."""
    if type(loss).init_state is SPMLLoss.init_state:
        return observed, clean
    return observed.float(), None if clean is None else clean.float()


class LossMember:
    """One loss of a group: heads ``block`` of the group's heads."""

    def __init__(self, member: Member, data: TrainingSplits, block: slice, seed: int,
                 batch_size: int, device: torch.device):
        self.member, self.block = member, block
        configs = member.configs
        params = {k: [c.param_dict[k] for c in configs] for k in configs[0].param_dict}
        self.loss = create_loss(member.loss, data.num_classes, member.heads, params=params,
                                facts=data.facts)
        state = self.loss.init_state(
            *float_labels(self.loss, data.train.observed, data.train.clean),
            generator=torch.Generator().manual_seed(derive_seed(seed, "state", batch_size)))
        self.state = {k: v.detach().to(device) for k, v in state.items()}
        self.learned = self.loss.learned_state_lr_mults()
        for name in self.learned:
            self.state[name].requires_grad_(True)
        self.learned_tensors = [self.state[name] for name in self.learned]
        # a hand-written loss gradient, until the loss says it has none (state it trains keeps
        # autograd)
        self.by_hand = not self.learned
        self.book: GroupRecord | None = None

    def generators(self) -> list[torch.Generator]:
        """One seeded generator per configuration: its fresh head's draw (the same alone and
        stacked)."""
        return [torch.Generator().manual_seed(derive_seed(c.seed, "head", c.key()))
                for c in self.member.configs]

    def start_book(self, heads: LinearHeads, steps: int, val_variant: str,
                   early_stop: str) -> None:
        """The per-head record of this loss's heads, from their first weights."""
        self.book = GroupRecord(list(self.member.configs), steps, val_variant, early_stop,
                                heads.weight.detach()[self.block].clone(),
                                heads.bias.detach()[self.block].clone(),
                                {name: self.state[name].detach().clone() for name in self.learned})

    def record(self) -> GroupRecord:
        if self.book is None:
            raise ValueError(f"the group of loss {self.member.loss!r} has not started")
        return self.book

    def adam_lrs(self) -> list[list[float]]:
        """The learning rates of each learned state tensor, per head."""
        lrs = [c.lr for c in self.member.configs]
        return [[lr * m for lr, m in zip(lrs, self.learned[name], strict=True)]
                for name in self.learned]

    def step(self, heads: LinearHeads, x: Tensor, logits: Tensor, targets: Targets,
             epoch: int) -> tuple[Tensor, Tensor, Sequence[Tensor]]:
        """This loss's share of a training step on its block of the group's ``logits``: (its
        per-head loss, the gradient of their sum with respect to its logits, the gradients of
        its learned state). The gradient is the loss's hand-written one where it has one
        (:meth:`~featcache.losses.SPMLLoss.loss_and_grad`), else autograd through the loss."""
        mine = logits[self.block]
        if isinstance(self.loss, MaskedPassLoss):  # IGNORE: a second pass on masked maps
            # its own copy: the other losses of the group share the batch's targets
            targets = replace(targets, masked=masked_logits(self.loss, heads, self.block, x,
                                                            targets.observed))
        if self.by_hand:
            by_hand = self.loss.loss_and_grad(mine, targets, self.state, epoch)
            if by_hand is not None:
                return by_hand[0], by_hand[1], ()
            self.by_hand = False
        mine = mine.detach().requires_grad_(True)
        per_head = self.loss.forward(mine, targets, self.state, epoch)
        # backward from each head's loss with gradient 1 (what the sum of the losses sends
        # back to each, so the same numbers), straight to the engine: no sum, and none of
        # torch.autograd.grad's checks of its arguments, every step
        ones = cached_constant(("ones", per_head.shape, per_head.device, per_head.dtype),
                               lambda: torch.ones_like(per_head, requires_grad=False))
        grads = run_backward((per_head,), (ones,), False, False, (mine, *self.learned_tensors),
                             False)
        return per_head.detach(), grads[0], grads[1:]


def masked_logits(loss: MaskedPassLoss, heads: LinearHeads, block: slice, x: Tensor,
                  observed: Tensor) -> Tensor:
    """The logits of the masked second pass of ``loss``'s heads ``block``: the positions of
    each row's map kept by the loss's mask of the class activation maps just computed."""
    if not isinstance(heads, MapHeads):
        raise TypeError(f"loss {loss.name!r} needs heads with class activation maps")
    keep = loss.position_mask(heads.last_cam(x)[block], observed)
    return heads.part(block).masked_logits(x, keep)


def create_heads(loss: SPMLLoss, feature_dim: int, shape: tuple[int, int, int] | None,
                 classes: int, generators: Sequence[torch.Generator],
                 device: torch.device | str | None = None,
                 source: str = "the features file") -> LinearHeads:
    """The stacked heads ``loss`` trains, of its kind (``loss.head``): heads on pooled rows, or
    heads on the spatial rows of maps of ``shape`` (h, w, D); a loss given the other kind of
    features is refused, naming the fix."""
    kind = loss.head
    if kind.spatial:
        if shape is None:
            raise InputError(f"loss {loss.name!r} {kind.trains_on}, but {source} holds pooled "
                             "features: run `featcache features --spatial` and train on the "
                             "spatial file it writes")
        height, width, channels = shape
        return kind.create(channels, classes, generators, device, positions=height * width,
                           params=loss.param_values)
    if shape is not None:
        raise InputError(f"loss {loss.name!r} {kind.trains_on}, but {source} holds spatial "
                         "feature maps; train it on the pooled features file, or use a BoostLU "
                         f"loss ({loss.name}+boostlu where it exists)")
    return kind.create(feature_dim, classes, generators, device, params=loss.param_values)
