"""Stacked linear heads and the Adam optimizer that trains them, one learning rate per head.

H independent linear classifiers are stored as one weight tensor (H, D, L) and one bias tensor
(H, 1, L), so a whole grid of configurations runs as one batched matmul per step (the way
DINOv2's linear evaluation trains many heads in one pass over the features).

A training step differentiates only the loss: :meth:`StackedLinear.forward` and
:meth:`StackedLinear.grads` are the two batched matmuls autograd would run for the layer (the
same kernels on the same operands, so the same numbers), without its bookkeeping.
Evaluation multiplies all heads at once as one (D, H*L) matrix where that gives the same
numbers (:class:`SplitScorer`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from featcache.errors import InputError, plural
from featcache.losses import SPATIAL_FEATURES, HeadKind, SPMLLoss
from featcache.losses.boostlu import alpha_value, boost_slope, boostlu_pool
from featcache.protocol.seeds import init_linear


class StackedLinear:
    """H linear heads: ``logits = x @ W[h] + b[h]`` for every head at once."""

    def __init__(self, weight: Tensor, bias: Tensor, trainable: bool = True):
        if weight.dim() != 3 or bias.dim() != 3:
            raise ValueError("weight must be (H, D, L) and bias (H, 1, L)")
        self.weight = weight.requires_grad_(True) if trainable else weight.detach()
        self.bias = bias.requires_grad_(True) if trainable else bias.detach()

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
        """Logits (H, B, L) for features ``x`` (B, D), shared by all heads (differentiable)."""
        return torch.matmul(x, self.weight) + self.bias

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        """Logits (H, B, L) of a training batch, outside autograd (the kernel ``__call__`` runs)."""
        return torch.bmm(x.expand(self.num_heads, -1, -1), self.weight).add_(self.bias)

    @torch.no_grad()
    def grads(self, x: Tensor, grad_logits: Tensor) -> tuple[Tensor, Tensor]:
        """Gradients of the weight and bias from the gradient of the logits (H, B, L)."""
        weight = torch.bmm(x.expand(self.num_heads, -1, -1).transpose(1, 2), grad_logits)
        return weight, grad_logits.sum(dim=1, keepdim=True)

    @torch.no_grad()
    def scores(self, features: Tensor) -> Tensor:
        """Probabilities of every head on ``features`` (N, D): (H, N, L), one matmul per head
        (the kernel training runs, so these are the numbers the protocol reports)."""
        return torch.sigmoid(torch.matmul(features, self.weight.detach()) + self.bias.detach())

    @torch.no_grad()
    def scores_wide(self, features: Tensor, rows: int | None = None) -> Tensor:
        """:meth:`scores` as one (N, D) x (D, H*L) matmul for all heads (per ``rows`` rows when
        given; ``features`` of another dtype are converted block by block). Often about twice
        as fast; whether its last bits equal :meth:`scores`' depends on the BLAS kernels the
        shapes select (:class:`SplitScorer` checks)."""
        heads, dim, classes = self.weight.shape
        wide = self.weight.detach().permute(1, 0, 2).reshape(dim, heads * classes)
        total = features.shape[0]
        step = max(rows or total, 1)
        out = None
        for start in range(0, total, step):
            chunk = features[start:start + step].to(device=wide.device, dtype=wide.dtype)
            logits = (chunk @ wide).view(-1, heads, classes).transpose(0, 1).contiguous()
            probs = torch.sigmoid_(logits.add_(self.bias.detach()))
            if step >= total:
                return probs
            if out is None:
                out = torch.empty(heads, total, classes, device=wide.device)
            out[:, start:start + step] = probs
        return out if out is not None else torch.empty(heads, 0, classes, device=wide.device)

    def head(self, index: int) -> tuple[Tensor, Tensor]:
        """Head ``index`` in ``nn.Linear`` layout: weight (L, D), bias (L,)."""
        return self.weight[index].detach().t().contiguous(), self.bias[index, 0].detach().clone()

    def frozen(self, weight: Tensor, bias: Tensor) -> StackedLinear:
        """Heads of this kind with other (not trained) weights: what evaluation scores."""
        return StackedLinear(weight, bias, trainable=False)

    def without_weights(self) -> StackedLinear:
        """These heads without their weights (empty tensors): all :meth:`frozen` needs,
        and nothing to copy when it is sent to another process."""
        empty = self.weight.detach().new_empty((self.num_heads, 0, 0))
        return self.frozen(empty, empty)


#: elements of one scoring block of BoostLU heads (64 MB as float32): its class activation
#: maps (rows x positions x heads x classes) and its rows' float32 features (rows x positions
#: x channels) each stay within it
CAM_BLOCK = 1 << 24
#: float32 tensors of :data:`CAM_BLOCK` elements alive at once while scoring: the rows' features,
#: the class activation maps, and BoostLU's transform of them
CAM_BLOCK_TENSORS = 3


class StackedBoostLU(StackedLinear):
    """H BoostLU heads (Kim et al. 2023) over spatial features.

    A row holds one image's feature map laid out (positions, D) (``P = h * w`` positions, the
    spatial features file's layout); the heads' weight (H, D, L) and bias (H, 1, L) are a 1x1
    convolution, i.e. the linear head applied at every position, and the logits are
    :func:`~featcache.losses.boostlu.boostlu_pool` of that class activation map. Training steps
    differentiate only the loss, as for linear heads: :meth:`grads` is the backward pass of the
    map and the pooling (d logit / d CAM = slope / P, slope alpha where CAM > 0 else 1).
    """

    def __init__(self, weight: Tensor, bias: Tensor, positions: int, alpha: Sequence[float],
                 trainable: bool = True):
        super().__init__(weight, bias, trainable)
        self.positions = int(positions)
        self.alpha = [float(a) for a in alpha]
        if len(self.alpha) != self.num_heads:
            raise ValueError(f"{len(self.alpha)} alpha values for {plural(self.num_heads, 'head')}")
        self._cam: tuple[Tensor, Tensor] | None = None  # (batch, its CAM) of the last forward

    @classmethod
    def create(cls, in_features: int, out_features: int, generators: Sequence[torch.Generator],
               device=None, positions: int = 1, alpha: Sequence[float] = ()) -> StackedBoostLU:
        """One head per generator, drawn like a fresh ``nn.Linear(D, L)`` (the same
        distribution as the authors' ``Conv2d(D, L, 1)``: fan-in D)."""
        linear = StackedLinear.create(in_features, out_features, generators, device)
        return cls(linear.weight.detach(), linear.bias.detach(), positions, alpha)

    def frozen(self, weight: Tensor, bias: Tensor) -> StackedBoostLU:
        return StackedBoostLU(weight, bias, self.positions, self.alpha, trainable=False)

    def cam(self, x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """The class activation maps (H, B, P, L) of rows ``x`` (B, P * D)."""
        weight = self.weight if weight is None else weight
        bias = self.bias if bias is None else bias
        rows, positions = x.shape[0], self.positions
        flat = x.reshape(rows * positions, -1)
        return (torch.matmul(flat, weight) + bias).view(-1, rows, positions, weight.shape[-1])

    def pool(self, cam: Tensor) -> Tensor:
        return boostlu_pool(cam, alpha_value(self.alpha, cam, (-1, 1, 1, 1)), dims=2)

    def __call__(self, x: Tensor) -> Tensor:
        """Logits (H, B, L) of rows ``x`` (B, P * D) (differentiable)."""
        return self.pool(self.cam(x))

    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:
        cam = self.cam(x)
        self._cam = (x, cam)
        return self.pool(cam)

    @torch.no_grad()
    def last_cam(self, x: Tensor) -> Tensor:
        """The class activation maps (H, B, P, L) of rows ``x``: those :meth:`forward` just
        computed for them, else computed now."""
        return self._cam[1] if self._cam is not None and self._cam[0] is x else self.cam(x)

    @torch.no_grad()
    def grads(self, x: Tensor, grad_logits: Tensor) -> tuple[Tensor, Tensor]:
        cam = self.last_cam(x)
        self._cam = None
        slope = boost_slope(cam, alpha_value(self.alpha, cam, (-1, 1, 1, 1)))
        grad_cam = (grad_logits.unsqueeze(2) * slope / self.positions)
        heads, rows, positions, classes = grad_cam.shape
        grad_cam = grad_cam.reshape(heads, rows * positions, classes)
        flat = x.reshape(rows * positions, -1)
        weight = torch.matmul(flat.t(), grad_cam)
        return weight, grad_cam.sum(dim=1, keepdim=True)

    @torch.no_grad()
    def logits(self, features: Tensor) -> Tensor:
        """Logits (H, N, L) of rows ``features`` (N, P * D), a block of rows at a time (the
        class activation maps of a whole split would not fit)."""
        weight, bias = self.weight.detach(), self.bias.detach()
        heads, channels, classes = weight.shape
        step = max(1, CAM_BLOCK // max(1, self.positions * max(heads * classes, channels)))
        out = torch.empty(heads, features.shape[0], classes, device=weight.device,
                          dtype=weight.dtype)
        for start in range(0, features.shape[0], step):
            chunk = features[start:start + step].to(device=weight.device, dtype=weight.dtype)
            out[:, start:start + step] = self.pool(self.cam(chunk, weight, bias))
        return out

    @torch.no_grad()
    def scores(self, features: Tensor) -> Tensor:
        """Probabilities (H, N, L) of rows ``features`` (N, P * D)."""
        return torch.sigmoid_(self.logits(features))

    def scores_wide(self, features: Tensor, rows: int | None = None) -> Tensor:
        """:meth:`scores` (BoostLU heads have no faster all-heads form)."""
        return self.scores(features)


class StackedSpatialLinear(StackedBoostLU):
    """H linear heads on spatial rows (B, P * D): the logits are the mean over the positions of
    the class activation map, i.e. the linear head on the pooled feature (BoostLU's heads with
    alpha = 1, whose weights are an ordinary linear head's). IGNORE trains them in stage two,
    its masked pass zeroing positions of each row's map (:meth:`masked_logits`)."""

    def __init__(self, weight: Tensor, bias: Tensor, positions: int, trainable: bool = True):
        super().__init__(weight, bias, positions, [1.0] * weight.shape[0], trainable)

    @classmethod
    def create(cls, in_features: int, out_features: int, generators: Sequence[torch.Generator],
               device=None, positions: int = 1) -> StackedSpatialLinear:
        linear = StackedLinear.create(in_features, out_features, generators, device)
        return cls(linear.weight.detach(), linear.bias.detach(), positions)

    def frozen(self, weight: Tensor, bias: Tensor) -> StackedSpatialLinear:
        return StackedSpatialLinear(weight, bias, self.positions, trainable=False)

    @torch.no_grad()
    def masked_logits(self, x: Tensor, keep: Tensor) -> Tensor:
        """Logits (H, B, L) of rows ``x`` (B, P * D) whose positions are multiplied by ``keep``
        (H, B, P): each head's masked map, pooled over all P positions, through that head."""
        rows = x.reshape(x.shape[0], self.positions, -1)
        pooled = torch.einsum("hbp,bpd->hbd", keep.to(rows.dtype), rows) / self.positions
        return torch.bmm(pooled.to(self.weight.dtype), self.weight.detach()).add_(self.bias)


def create_heads(loss: SPMLLoss, feature_dim: int, shape: tuple[int, int, int] | None,
                 classes: int, generators: Sequence[torch.Generator], device=None,
                 source: str = "the features file") -> StackedLinear:
    """The stacked heads ``loss`` trains: linear heads on pooled rows, BoostLU heads on spatial
    rows, linear heads on spatial rows for the other losses that need feature maps (IGNORE); a
    loss given the other kind of features is refused, naming the fix."""
    if loss.head is HeadKind.LINEAR and SPATIAL_FEATURES in loss.needs:
        if shape is None:
            raise InputError(f"loss {loss.name!r} trains on spatial feature maps, but {source} "
                             "holds pooled features: run `featcache features --spatial` and "
                             "train on the spatial file it writes")
        height, width, channels = shape
        return StackedSpatialLinear.create(channels, classes, generators, device,
                                           positions=height * width)
    if loss.head is HeadKind.BOOSTLU:
        if shape is None:
            raise InputError(f"loss {loss.name!r} trains BoostLU heads on spatial feature maps, "
                             f"but {source} holds pooled features: run `featcache features "
                             "--spatial` and train on the spatial file it writes")
        height, width, channels = shape
        return StackedBoostLU.create(channels, classes, generators, device,
                                     positions=height * width, alpha=loss.params["alpha"])
    if shape is not None:
        raise InputError(f"loss {loss.name!r} trains linear heads on pooled features, but "
                         f"{source} holds spatial feature maps; train it on the pooled features "
                         f"file, or use a BoostLU loss ({loss.name}+boostlu where it exists)")
    return StackedLinear.create(feature_dim, classes, generators, device)


class StackedAdam:
    """Adam over stacked tensors whose first dimension is the head, one learning rate per head.

    Each head gets exactly ``torch.optim.Adam``'s update (no weight decay, no amsgrad), or with
    ``weight_decays`` (per parameter, per head; the linear-probe search's) ``torch.optim.AdamW``'s
    (decoupled weight decay). Where PyTorch's fused kernels are available they update each
    head's slices in one pass (the update ``torch.optim.Adam(fused=True)`` / ``AdamW`` makes);
    otherwise the same formula runs as vectorised tensor operations over all heads at once.
    """

    def __init__(self, params: Sequence[Tensor], lrs: Sequence[Sequence[float]] | Sequence[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 fused: bool | None = None,
                 weight_decays: Sequence[Sequence[float]] | None = None):
        self.params = [p.detach() for p in params]
        per_param = lrs if isinstance(lrs[0], (list, tuple)) else [lrs] * len(self.params)
        self.head_lrs = [[float(v) for v in values] for values in per_param]
        self.head_decays = ([[0.0] * len(values) for values in self.head_lrs]
                            if weight_decays is None
                            else [[float(v) for v in values] for values in weight_decays])
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
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
        for index, lrs in enumerate(self.head_lrs):
            if param is None or param == index:
                lrs[head] = float(lr)
        self._calls = self._plan_fused_calls()

    def _plan_fused_calls(self) -> list[tuple[tuple[float, float], list[int], list[Tensor],
                                              list[Tensor], list[Tensor]]]:
        """Per head, one kernel call per distinct (learning rate, weight decay) (the head's
        weight and bias share one): the parameter indices and the (fixed) views of params and
        moments."""
        calls = []
        for head in range(self.params[0].shape[0]):
            groups: dict[tuple[float, float], list[int]] = {}
            for index, (lrs, decays) in enumerate(zip(self.head_lrs, self.head_decays,
                                                      strict=True)):
                groups.setdefault((lrs[head], decays[head]), []).append(index)
            for (lr, decay), members in groups.items():
                if lr == 0.0:
                    continue  # a frozen head: Adam with lr 0 leaves the parameter as it is
                calls.append(((lr, decay), [(i, head) for i in members],
                              [self.params[i][head] for i in members],
                              [self.exp_avg[i][head] for i in members],
                              [self.exp_avg_sq[i][head] for i in members]))
        return calls

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor]) -> None:
        """Apply one update from ``grads`` (same order and shapes as the params)."""
        self.step_count += 1
        if self.fused:
            self._fused_step(grads)
        else:
            self._vectorised_step(grads)

    def _fused_step(self, grads: Sequence[Tensor]) -> None:
        self._step.fill_(float(self.step_count))
        per_head = [grad.unbind(0) for grad in grads]
        for (lr, decay), slots, params, exp_avg, exp_avg_sq in self._calls:
            kernel = torch._fused_adamw_ if decay else torch._fused_adam_
            kernel(params, [per_head[i][head] for i, head in slots], exp_avg, exp_avg_sq, [],
                   [self._step] * len(params), lr=lr, beta1=self.beta1, beta2=self.beta2,
                   weight_decay=decay, eps=self.eps, amsgrad=False, maximize=False)

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


class SplitScorer:
    """Scores one split's features for every head, by the faster all-heads matmul wherever it
    gives exactly the per-head matmul's numbers.

    The first call computes both and compares them bit for bit: a BLAS kernel's summation
    order depends on the shapes (and threads), not on the values, so equal results on real
    data mean the same order. Where they differ (some shapes do), every call stays on the
    per-head kernel. Either way the numbers are :meth:`StackedLinear.scores`'.
    """

    def __init__(self, features: Tensor):
        self.features = features
        self.wide: bool | None = None
        #: per number of stacked heads, whether one matmul gives each epoch's numbers
        self.stacked: dict[int, bool] = {}

    def __call__(self, head: StackedLinear) -> Tensor:
        if self.wide:
            return head.scores_wide(self.features)
        exact = head.scores(self.features)
        if self.wide is None:
            self.wide = torch.equal(exact, head.scores_wide(self.features))
        return exact

    def of_epochs(self, heads: StackedLinear, epochs: int) -> Tensor:
        """Scores of ``heads``, ``epochs`` epochs' heads stacked (E x H heads): one (N, D) x
        (D, E H L) matmul where its first result equals scoring each epoch alone (checked per
        stack size, as :meth:`__call__` checks its own), else one epoch at a time."""
        size = heads.num_heads
        if self.stacked.get(size):
            return heads.scores_wide(self.features)
        per_epoch = torch.cat([self(heads.frozen(weight, bias)) for weight, bias in zip(
            heads.weight.chunk(epochs), heads.bias.chunk(epochs), strict=True)])
        if size not in self.stacked:
            self.stacked[size] = torch.equal(per_epoch, heads.scores_wide(self.features))
        return per_epoch


def _fused_adam_available(params: Sequence[Tensor]) -> bool:
    """Whether PyTorch's fused Adam kernel can update these tensors."""
    if not hasattr(torch, "_fused_adam_"):
        return False
    return all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda")
               for p in params)
