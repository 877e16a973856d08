"""Heads on spatial feature maps: the linear head applied at every position of a map (a 1x1
convolution) gives the class activation maps (CAM), which a pooling turns into logits.

A row holds one image's feature map laid out (positions, D) (``P = h * w`` positions, the
spatial features file's layout; stage three lays its trunk's (D, h, w) map out the same way).
:class:`BoostLUHeads` (Kim et al. 2023) boost the positive CAM entries by ``alpha`` before the
mean over positions; :class:`CamHeads` take the plain mean (the linear head on the pooled
feature, whose weights are an ordinary linear head's; IGNORE's masked pass reads their maps).
Training steps differentiate only the loss, as for linear heads: :meth:`MapHeads.grads` is the
backward pass of the map and the pooling (d logit / d CAM = slope / P).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from featcache.heads.linear import HeadParams, LinearHeads

#: elements of one scoring block of heads on maps (64 MB as float32): its class activation
#: maps (rows x positions x heads x classes) and its rows' float32 features (rows x positions
#: x channels) each stay within it
CAM_BLOCK = 1 << 24
#: float32 tensors of :data:`CAM_BLOCK` elements alive at once while scoring: the rows' features,
#: the class activation maps, and BoostLU's transform of them
CAM_BLOCK_TENSORS = 3


# ------------------------------------------------------------------------------- BoostLU's math
def boost(cam: Tensor, alpha: float | Tensor) -> Tensor:
    """B(x) = alpha x where x > 0 (strictly), else x."""
    return torch.where(cam > 0, cam * alpha, cam)


def boost_slope(cam: Tensor, alpha: float | Tensor) -> Tensor:
    """dB/dx: alpha where x > 0, else 1 (what autograd gives for :func:`boost`)."""
    one = torch.ones((), dtype=cam.dtype, device=cam.device)
    return torch.where(cam > 0, alpha * one, one)


def boostlu_pool(cam: Tensor, alpha: float | Tensor, dims: int | tuple[int, ...]) -> Tensor:
    """BoostLU's logits: the mean over the position dimension(s) ``dims`` of B(cam)."""
    return boost(cam, alpha).mean(dim=dims)


# ---------------------------------------------------------------------------------- the heads
class MapHeads(LinearHeads):
    """H heads on rows of ``positions`` positions (B, P * D); subclasses choose the pooling.

    Beside the linear heads' interface they give their class activation maps (:meth:`cam`,
    :meth:`last_cam`) and the logits of a masked pass (:meth:`masked_logits`).
    """

    def __init__(self, weight: Tensor, bias: Tensor, *, positions: int = 1,
                 params: HeadParams | None = None, trainable: bool = False,
                 blocks: Sequence[int] | None = None):
        super().__init__(weight, bias, positions=positions, params=params, trainable=trainable,
                         blocks=blocks)
        self._cam: tuple[Tensor, Tensor] | None = None  # (batch, its CAM) of the last forward

    def pool(self, cam: Tensor) -> Tensor:
        """Logits (H, B, L) from class activation maps (H, B, P, L)."""
        raise NotImplementedError

    def slope(self, cam: Tensor) -> Tensor | None:
        """d pool / d CAM times P (None: 1 everywhere, the plain mean)."""
        raise NotImplementedError

    def cam(self, x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """The class activation maps (H, B, P, L) of rows ``x`` (B, P * D)."""
        weight = self.weight if weight is None else weight
        bias = self.bias if bias is None else bias
        rows, positions = x.shape[0], self.positions
        flat = x.reshape(rows * positions, -1)
        return (torch.matmul(flat, weight) + bias).view(-1, rows, positions, weight.shape[-1])

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
    def grads(self, x: Tensor, grad_logits: Tensor,
              out: Sequence[Tensor] | None = None) -> tuple[Tensor, Tensor]:
        cam = self.last_cam(x)
        self._cam = None
        slope = self.slope(cam)
        grad_cam = grad_logits.unsqueeze(2)
        grad_cam = (grad_cam.expand_as(cam) if slope is None else grad_cam * slope) / self.positions
        heads, rows, positions, classes = grad_cam.shape
        grad_cam = grad_cam.reshape(heads, rows * positions, classes)
        flat = x.reshape(rows * positions, -1)
        weight, bias = out if out is not None else (None, None)
        weight = torch.matmul(flat.t(), grad_cam, out=weight)
        return weight, torch.sum(grad_cam, dim=1, keepdim=True, out=bias)

    @torch.no_grad()
    def masked_logits(self, x: Tensor, keep: Tensor) -> Tensor:
        """Logits (H, B, L) of rows ``x`` (B, P * D) whose positions are multiplied by ``keep``
        (H, B, P): each head's masked map through that head (a masked second pass)."""
        heads, rows, positions = keep.shape
        maps = x.reshape(rows, positions, -1)
        masked = (keep.unsqueeze(-1).to(maps.dtype) * maps).reshape(heads, rows * positions, -1)
        cam = torch.bmm(masked.to(self.weight.dtype), self.weight.detach()).add_(self.bias)
        return self.pool(cam.view(heads, rows, positions, -1))

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
        return self.sigmoid_(self.logits(features))

    def scores_wide(self, features: Tensor, rows: int | None = None) -> Tensor:
        """:meth:`scores` (heads on maps have no faster all-heads form)."""
        return self.scores(features)


class BoostLUHeads(MapHeads):
    """H BoostLU heads (Kim et al. 2023): the logits are the mean over the positions of
    B(CAM), B(x) = alpha x for x > 0, else x (``alpha`` a loss parameter, one per head; 1 gives
    the linear head on the pooled feature)."""

    loss_params = ("alpha",)

    def alpha(self, like: Tensor) -> float | Tensor:
        return self.per_head("alpha", like, (-1, 1, 1, 1))

    def pool(self, cam: Tensor) -> Tensor:
        return boostlu_pool(cam, self.alpha(cam), dims=2)

    def slope(self, cam: Tensor) -> Tensor:
        return boost_slope(cam, self.alpha(cam))


class CamHeads(MapHeads):
    """H linear heads on maps: the logits are the mean over the positions of the class
    activation map, i.e. the linear head on the pooled feature, so their weights are an
    ordinary linear head's. IGNORE trains them (its masked pass zeroes positions of each row's
    map, or of the image in stage three)."""

    def pool(self, cam: Tensor) -> Tensor:
        return cam.mean(dim=2)

    def slope(self, cam: Tensor) -> None:
        return None

    @torch.no_grad()
    def masked_logits(self, x: Tensor, keep: Tensor) -> Tensor:
        # the mean is linear: pool the masked map first, then one matmul per head
        rows = x.reshape(x.shape[0], self.positions, -1)
        pooled = torch.einsum("hbp,bpd->hbd", keep.to(rows.dtype), rows) / self.positions
        return torch.bmm(pooled.to(self.weight.dtype), self.weight.detach()).add_(self.bias)
