"""The optimizer of stage two's stacked heads: Adam with one learning rate per head.

H independent heads are stored as one weight tensor (H, D, L) and one bias tensor (H, 1, L)
(:mod:`featcache.heads`), so a whole grid of configurations runs as one batched matmul per
step (the way DINOv2's linear evaluation trains many heads in one pass over the features), and
one optimizer call updates them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor


class StackedAdam:
    """Adam over stacked tensors whose first dimension is the head, one learning rate per head.

    Each head gets exactly ``torch.optim.Adam``'s update (no weight decay, no amsgrad), or with
    ``weight_decays`` (per parameter, per head; the linear-probe search's) ``torch.optim.AdamW``'s
    (decoupled weight decay). Where PyTorch's fused kernels are available they update each
    head's slices in one pass (the update ``torch.optim.Adam(fused=True)`` / ``AdamW`` makes),
    one kernel call per distinct (learning rate, weight decay) over every head that has it (the
    kernel updates each tensor of its lists on its own, so a head's numbers do not depend on
    the others); otherwise the same formula runs as vectorised tensor operations over all heads.

    The gradients go into :attr:`grads`, buffers shaped like the parameters (the trainer writes
    them in place), so that every call reads the same tensors (what a CUDA graph replays).
    ``heads`` names, for each parameter, the group head each of its first-dimension slices
    belongs to (default: slice h is head h); :meth:`set_lr` freezes a head in every parameter.
    """

    def __init__(self, params: Sequence[Tensor], lrs: Sequence[Sequence[float]] | Sequence[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused: bool | None = None,
                 weight_decays: Sequence[Sequence[float]] | None = None,
                 heads: Sequence[Sequence[int]] | None = None):
        self.params = [p.detach() for p in params]
        self.head_lrs = _per_param(lrs, len(self.params))
        self.head_decays = ([[0.0] * len(values) for values in self.head_lrs]
                            if weight_decays is None
                            else [[float(v) for v in values] for values in weight_decays])
        self.heads = ([list(range(p.shape[0])) for p in self.params] if heads is None
                      else [list(ids) for ids in heads])
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.grads = [torch.zeros_like(p) for p in self.params]
        self.fused = _fused_adam_available(self.params) if fused is None else fused
        # One step counter for every tensor (all advance together); the kernel reads it.
        self._step = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        self._calls = self._plan_fused_calls()

    @property
    def lrs(self) -> list[list[float]]:
        """Per parameter, the learning rate of each head. Change them with :meth:`set_lr`."""
        return self.head_lrs

    def set_lr(self, head: int, lr: float, param: int | None = None) -> None:
        """Set head ``head``'s learning rate (of every parameter, or of ``param`` only); 0
        freezes the head."""
        for index, (lrs, ids) in enumerate(zip(self.head_lrs, self.heads, strict=True)):
            if param is None or param == index:
                for slot, owner in enumerate(ids):
                    if owner == head:
                        lrs[slot] = float(lr)
        self._calls = self._plan_fused_calls()

    def _plan_fused_calls(self) -> list[tuple[float, float, list[Tensor], list[Tensor],
                                              list[Tensor], list[Tensor], list[Tensor]]]:
        """One kernel call per distinct (learning rate, weight decay): the (fixed) views of the
        parameters, gradients and moments of every head slice that has it, and the step count
        (one tensor on the device) once for each."""
        groups: dict[tuple[float, float], list[tuple[int, int]]] = {}
        for index, (lrs, decays) in enumerate(zip(self.head_lrs, self.head_decays, strict=True)):
            for slot, (lr, decay) in enumerate(zip(lrs, decays, strict=True)):
                if lr != 0.0:  # a frozen head: Adam with lr 0 leaves the parameter as it is
                    groups.setdefault((lr, decay), []).append((index, slot))
        return [(lr, decay, [self.params[i][h] for i, h in slots],
                 [self.grads[i][h] for i, h in slots], [self.exp_avg[i][h] for i, h in slots],
                 [self.exp_avg_sq[i][h] for i, h in slots], [self._step] * len(slots))
                for (lr, decay), slots in groups.items()]

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor] | None = None) -> None:
        """Apply one update from :attr:`grads`, after copying ``grads`` into them when given
        (same order and shapes as the params)."""
        if grads is not None:
            for buffer, grad in zip(self.grads, grads, strict=True):
                if grad is not buffer:
                    buffer.copy_(grad)
        self.step_count += 1
        if self.fused:
            self._step.add_(1.0)  # on the device: the same count a replayed graph reaches
            for lr, decay, params, grads_, exp_avg, exp_avg_sq, steps in self._calls:
                kernel = torch._fused_adamw_ if decay else torch._fused_adam_
                kernel(params, grads_, exp_avg, exp_avg_sq, [], steps, lr=lr, beta1=self.beta1,
                       beta2=self.beta2, weight_decay=decay, eps=self.eps, amsgrad=False,
                       maximize=False)
        else:
            self._vectorised_step(self.grads)

    def _vectorised_step(self, grads: Sequence[Tensor]) -> None:
        bias_correction1 = 1 - self.beta1**self.step_count
        bias_correction2_sqrt = (1 - self.beta2**self.step_count) ** 0.5
        for param, grad, lrs, decays, m, v in zip(self.params, grads, self.head_lrs,
                                                  self.head_decays, self.exp_avg,
                                                  self.exp_avg_sq, strict=True):
            lr = torch.tensor(lrs, dtype=param.dtype, device=param.device)
            lr = lr.view(-1, *([1] * (param.dim() - 1)))
            if any(decays):  # AdamW: the decoupled decay comes first
                decay = torch.tensor(decays, dtype=param.dtype, device=param.device)
                param.mul_(1 - lr * decay.view_as(lr))
            m.lerp_(grad, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(m * (lr / bias_correction1), denom, value=-1.0)

    def state_dict(self) -> dict:
        return {"step": self.step_count, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}


def _per_param(lrs: Sequence[Sequence[float]] | Sequence[float], count: int) -> list[list[float]]:
    """Each parameter's per-head learning rates: ``lrs`` as given per parameter, or one list of
    per-head rates for every parameter."""
    rows: list[list[float]] = []
    for item in lrs:
        if isinstance(item, (int, float)):
            return [[float(v) for v in cast(Sequence[float], lrs)] for _ in range(count)]
        rows.append([float(v) for v in item])
    return rows


def _fused_adam_available(params: Sequence[Tensor]) -> bool:
    """Whether PyTorch's fused Adam kernel can update these tensors."""
    if not hasattr(torch, "_fused_adam_"):
        return False
    return all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda")
               for p in params)
