"""H linear heads stacked into one weight tensor (H, D, L) and one bias (H, 1, L): the head of
:attr:`HeadKind.LINEAR <featcache.heads.HeadKind.LINEAR>`, and the base every kind of head
builds on.

A whole grid of configurations runs as one batched matmul per step (the way DINOv2's linear
evaluation trains many heads in one pass over the features); stage three and the API use the
same class with H = 1. A training step differentiates only the loss: :meth:`LinearHeads.forward`
and :meth:`LinearHeads.grads` are the two batched matmuls autograd would run for the layer (the
same kernels on the same operands, so the same numbers), without its bookkeeping. Evaluation
multiplies all heads at once as one (D, H*L) matrix where that gives the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar, Self

import torch
from torch import Tensor

from featcache.constants import device_constant
from featcache.errors import plural

#: a head's loss-parameter values, one per head (``SPMLLoss.param_values``)
HeadParams = Mapping[str, Sequence[float]]


def init_linear(in_features: int, out_features: int, generator: torch.Generator,
                device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``torch.nn.Linear``'s default initialisation drawn from ``generator``.

    Returns weight (in_features, out_features) (transposed for ``x @ W``) and bias
    (out_features,), both U(-1/sqrt(in), 1/sqrt(in)) as ``nn.Linear.reset_parameters`` gives.
    """
    bound = 1.0 / math.sqrt(in_features)
    weight = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator)
    bias = torch.empty(out_features).uniform_(-bound, bound, generator=generator)
    return weight.t().contiguous().to(device), bias.to(device)


class LinearHeads:
    """H linear heads: ``logits = x @ W[h] + b[h]`` for every head at once, on rows (B, D).

    ``trainable`` makes the weight and bias leaves that require gradients (stage two's heads);
    otherwise they are used as given (a frozen copy, or views of a module's parameters).
    ``blocks`` partitions the heads into consecutive blocks (the losses of a stacked group,
    :mod:`featcache.linear.engine.trainer`): elementwise functions such as the sigmoid run on each
    block alone, so a block's numbers are bit for bit those of its heads without the others
    (a vectorised function rounds the last elements of each call on another path).
    """

    #: the loss parameters this kind of head reads (BoostLU's ``alpha``)
    loss_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, weight: Tensor, bias: Tensor, *, positions: int = 1,
                 params: HeadParams | None = None, trainable: bool = False,
                 blocks: Sequence[int] | None = None):
        if weight.dim() != 3 or bias.dim() != 3:
            raise ValueError("weight must be (H, D, L) and bias (H, 1, L)")
        self.blocks = tuple(int(b) for b in blocks) if blocks else (weight.shape[0],)
        if sum(self.blocks) != weight.shape[0]:
            raise ValueError(f"blocks {self.blocks} do not add up to "
                             f"{plural(weight.shape[0], 'head')}")
        self.weight = weight.detach().requires_grad_(True) if trainable else weight
        self.bias = bias.detach().requires_grad_(True) if trainable else bias
        self.positions = int(positions)
        given = params or {}
        missing = [key for key in self.loss_params if key not in given]
        if missing:
            raise ValueError(f"{type(self).__name__} needs the loss parameter(s) {missing}")
        self.params = {key: [float(v) for v in given[key]] for key in self.loss_params}
        for key, values in self.params.items():
            if len(values) != self.num_heads:
                raise ValueError(f"{plural(len(values), f'{key} value')} for "
                                 f"{plural(self.num_heads, 'head')}")

    @classmethod
    def create(cls, in_features: int, out_features: int, generators: Sequence[torch.Generator],
               device: torch.device | str | None = None, *, positions: int = 1,
               params: HeadParams | None = None) -> Self:
        """One trainable head per generator, each initialised like a fresh ``nn.Linear(D, L)``
        (for heads on maps: the same distribution as a ``Conv2d(D, L, 1)``, fan-in D)."""
        pairs = [init_linear(in_features, out_features, g) for g in generators]
        weight = torch.stack([w for w, _ in pairs]).to(device)
        bias = torch.stack([b for _, b in pairs]).unsqueeze(1).to(device)
        return cls(weight, bias, positions=positions, params=params, trainable=True)

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def parameters(self) -> list[Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: Tensor) -> Tensor:
        """Logits (H, B, L) for rows ``x`` shared by all heads (differentiable)."""
        return torch.matmul(x, self.weight) + self.bias

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        """Logits (H, B, L) of a training batch, outside autograd (the kernel ``__call__`` runs)."""
        return torch.bmm(x.expand(self.num_heads, -1, -1), self.weight).add_(self.bias)

    @torch.no_grad()
    def grads(self, x: Tensor, grad_logits: Tensor,
              out: Sequence[Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Gradients of the weight and bias from the gradient of the logits (H, B, L) (written
        into ``out``, two tensors shaped like the weight and bias, when given)."""
        weight, bias = out if out is not None else (None, None)
        weight = torch.bmm(x.expand(self.num_heads, -1, -1).transpose(1, 2), grad_logits,
                           out=weight)
        return weight, torch.sum(grad_logits, dim=1, keepdim=True, out=bias)

    @torch.no_grad()
    def logits(self, features: Tensor) -> Tensor:
        """Logits (H, N, L) of rows ``features`` (N, D) (the kernel training runs)."""
        return torch.matmul(features, self.weight.detach()) + self.bias.detach()

    @torch.no_grad()
    def scores(self, features: Tensor) -> Tensor:
        """Probabilities of every head on ``features`` (N, D): (H, N, L), one matmul per head
        (the kernel training runs, so these are the numbers the protocol reports)."""
        return self.sigmoid_(self.logits(features))

    def block_slices(self) -> list[slice]:
        """The heads of each block, in order."""
        ends = [sum(self.blocks[:i + 1]) for i in range(len(self.blocks))]
        return [slice(end - size, end) for size, end in zip(self.blocks, ends, strict=True)]

    def sigmoid_(self, logits: Tensor) -> Tensor:
        """``sigmoid`` of logits (H, ..., L) in place, one call per block of heads."""
        for block in self.block_slices():
            torch.sigmoid_(logits[block])
        return logits

    @torch.no_grad()
    def scores_wide(self, features: Tensor, rows: int | None = None) -> Tensor:
        """:meth:`scores` as one (N, D) x (D, H*L) matmul for all heads (per ``rows`` rows when
        given; ``features`` of another dtype are converted block by block). Often about twice
        as fast; whether its last bits equal :meth:`scores`' depends on the BLAS kernels the
        shapes select (stage two's scorer checks)."""
        heads, dim, classes = self.weight.shape
        wide = self.weight.detach().permute(1, 0, 2).reshape(dim, heads * classes)
        total = features.shape[0]
        step = max(rows or total, 1)
        out = torch.empty(heads, total, classes, device=wide.device)
        for start in range(0, total, step):
            chunk = features[start:start + step].to(device=wide.device, dtype=wide.dtype)
            logits = (chunk @ wide).view(-1, heads, classes).transpose(0, 1).contiguous()
            probs = self.sigmoid_(logits.add_(self.bias.detach()))
            if step >= total:
                return probs
            out[:, start:start + step] = probs
        return out

    def head(self, index: int) -> tuple[Tensor, Tensor]:
        """Head ``index`` in ``nn.Linear`` layout: weight (L, D), bias (L,)."""
        return self.weight[index].detach().t().contiguous(), self.bias[index, 0].detach().clone()

    def frozen(self, weight: Tensor, bias: Tensor) -> Self:
        """Heads of this kind with other (not trained) weights: what evaluation scores."""
        return type(self)(weight, bias, positions=self.positions, params=self.params,
                          blocks=self.blocks if weight.shape[0] == self.num_heads else None)

    def part(self, heads: slice) -> Self:
        """The heads ``heads`` (one loss of a stacked group) as heads of their own (views),
        with the blocks they cover."""
        start, stop, _ = heads.indices(self.num_heads)
        blocks = [min(b.stop, stop) - max(b.start, start) for b in self.block_slices()]
        params = {key: values[heads] for key, values in self.params.items()}
        return type(self)(self.weight[heads], self.bias[heads], positions=self.positions,
                          params=params, blocks=[size for size in blocks if size > 0])

    def per_head(self, key: str, like: Tensor, shape: Sequence[int]) -> float | Tensor:
        """Loss parameter ``key``: one float for every head, or a per-head tensor of ``shape``."""
        values = self.params[key]
        if all(v == values[0] for v in values):
            return float(values[0])
        return device_constant(values, like.device, like.dtype).view(*shape)
