"""Stacked linear heads and the Adam optimizer that trains them, one learning rate per head.

H independent linear classifiers are stored as one weight tensor (H, D, L) and one bias tensor
(H, 1, L), so a whole grid of configurations runs as one batched matmul per step (the way
DINOv2's linear evaluation trains many heads in one pass over the features).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from featcache.protocol.seeds import init_linear


class StackedLinear:
    """H linear heads: ``logits = x @ W[h] + b[h]`` for every head at once."""

    def __init__(self, weight: Tensor, bias: Tensor):
        if weight.dim() != 3 or bias.dim() != 3:
            raise ValueError("weight must be (H, D, L) and bias (H, 1, L)")
        self.weight = weight.requires_grad_(True)
        self.bias = bias.requires_grad_(True)

    @classmethod
    def create(cls, in_features: int, out_features: int, generators: Sequence[torch.Generator],
               device=None) -> StackedLinear:
        """One head per generator, each initialised like a fresh ``nn.Linear``."""
        pairs = [init_linear(in_features, out_features, g) for g in generators]
        weight = torch.stack([w for w, _ in pairs]).to(device)
        bias = torch.stack([b for _, b in pairs]).unsqueeze(1).to(device)
        return cls(weight, bias)

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def parameters(self) -> list[Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: Tensor) -> Tensor:
        """Logits (H, B, L) for features ``x`` (B, D), shared by all heads."""
        return torch.matmul(x, self.weight) + self.bias

    def head(self, index: int) -> tuple[Tensor, Tensor]:
        """Head ``index`` in ``nn.Linear`` layout: weight (L, D), bias (L,)."""
        return self.weight[index].detach().t().contiguous(), self.bias[index, 0].detach().clone()


class StackedAdam:
    """Adam over stacked tensors whose first dimension is the head, one learning rate per head.

    Each head gets exactly ``torch.optim.Adam``'s update (no weight decay, no amsgrad). Where
    PyTorch's fused Adam kernel is available it updates each head's slices in one pass (the
    update ``torch.optim.Adam(fused=True)`` makes); otherwise the same formula runs as
    vectorised tensor operations over all heads at once.
    """

    def __init__(self, params: Sequence[Tensor], lrs: Sequence[Sequence[float]] | Sequence[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused: bool | None = None):
        self.params = list(params)
        per_param = lrs if isinstance(lrs[0], (list, tuple)) else [lrs] * len(self.params)
        self.head_lrs = [[float(v) for v in values] for values in per_param]
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.fused = _fused_adam_available(self.params) if fused is None else fused
        self._steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    @property
    def lrs(self) -> list[list[float]]:
        """Per parameter, the learning rate of each head (set an entry to 0 to freeze a head)."""
        return self.head_lrs

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor]) -> None:
        """Apply one update from ``grads`` (same order and shapes as the params)."""
        self.step_count += 1
        if self.fused:
            self._fused_step(grads)
        else:
            self._vectorised_step(grads)

    def _fused_step(self, grads: Sequence[Tensor]) -> None:
        for step in self._steps:
            step.fill_(float(self.step_count))
        heads = self.params[0].shape[0]
        for head in range(heads):
            # One kernel call per head and learning rate (the head and its bias share one).
            groups: dict[float, list[int]] = {}
            for index, lrs in enumerate(self.head_lrs):
                groups.setdefault(lrs[head], []).append(index)
            for lr, members in groups.items():
                torch._fused_adam_(
                    [self.params[i][head] for i in members], [grads[i][head] for i in members],
                    [self.exp_avg[i][head] for i in members],
                    [self.exp_avg_sq[i][head] for i in members], [],
                    [self._steps[i] for i in members],
                    lr=lr, beta1=self.beta1, beta2=self.beta2, weight_decay=0.0, eps=self.eps,
                    amsgrad=False, maximize=False)

    def _vectorised_step(self, grads: Sequence[Tensor]) -> None:
        bias_correction1 = 1 - self.beta1**self.step_count
        bias_correction2_sqrt = math.sqrt(1 - self.beta2**self.step_count)
        for param, grad, lrs, m, v in zip(self.params, grads, self.head_lrs, self.exp_avg,
                                          self.exp_avg_sq, strict=True):
            lr = torch.tensor(lrs, dtype=param.dtype, device=param.device)
            lr = lr.view(-1, *([1] * (param.dim() - 1)))
            m.lerp_(grad, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(m * (lr / bias_correction1), denom, value=-1.0)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}


def _fused_adam_available(params: Sequence[Tensor]) -> bool:
    """Whether PyTorch's fused Adam kernel can update these tensors."""
    if not hasattr(torch, "_fused_adam_"):
        return False
    return all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda")
               for p in params)
