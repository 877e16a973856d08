"""The network stage three trains: stage one's backbone trunk with a linear head on top, a
BoostLU head (Kim et al. 2023) on the trunk's feature map, or (IGNORE, Song et al. 2024) a
linear head on the feature map that also gives its class activation maps."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from featcache.errors import plural
from featcache.losses.boostlu import boostlu_pool
from featcache.protocol.seeds import init_linear


class FinetuneNet(nn.Module):
    """Normalised images (B, 3, H, W) -> logits (B, L): ``head(trunk(x))``.

    The trunk is :func:`featcache.backbones.create_backbone`'s module, the one whose
    pooled output stage one cached, so a LinearInit head sees exactly the features it was
    trained on. The head runs in float32 even under autocast (the logits feed the loss, which
    is computed in float32; the head is a tiny part of the work).
    """

    def __init__(self, trunk: nn.Module, head: nn.Linear):
        super().__init__()
        self.trunk = trunk
        self.head = head
        self.spatial = isinstance(head, (BoostLUHead, CamHead))

    def forward(self, x: Tensor, cam: bool = False) -> Tensor:
        """Logits (B, L); with ``cam`` (a :class:`CamHead`), the class activation maps
        (B, L, h, w) instead, whose mean over the positions is the logits."""
        features = self.trunk.feature_map(x) if self.spatial else self.trunk(x)
        with torch.autocast(x.device.type, enabled=False):
            return self.head.cam(features.float()) if cam else self.head(features.float())


class BoostLUHead(nn.Linear):
    """BoostLU's head on a feature map (B, D, h, w): the 1x1 convolution with this layer's
    weight (L, D) and bias (L,) gives the class activation map, whose positive entries are
    multiplied by ``alpha`` before the mean over positions
    (:func:`featcache.losses.boostlu.boostlu_pool`, stage two's code). Its parameters are an
    ``nn.Linear``'s, so a stage-two BoostLU head (or any linear head) loads as it is."""

    def __init__(self, in_features: int, out_features: int, alpha: float):
        super().__init__(in_features, out_features)
        self.alpha = float(alpha)

    def forward(self, feature_map: Tensor) -> Tensor:
        weight = self.weight.view(*self.weight.shape, 1, 1)
        return boostlu_pool(F.conv2d(feature_map, weight, self.bias), self.alpha, dims=(2, 3))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha:g}"


class CamHead(nn.Linear):
    """A linear head on a feature map (B, D, h, w), as the IGNORE authors' ``ResNet_1x1``: the
    1x1 convolution with this layer's weight and bias gives the class activation maps
    (:meth:`cam`), and the logits are their mean over the positions (for a trunk whose pooled
    output is the mean of its map, the linear head on the pooled features, so any stage-two
    linear head loads as it is)."""

    def cam(self, feature_map: Tensor) -> Tensor:
        """Class activation maps (B, L, h, w), bias included."""
        return F.conv2d(feature_map, self.weight.view(*self.weight.shape, 1, 1), self.bias)

    def forward(self, feature_map: Tensor) -> Tensor:
        return self.cam(feature_map).mean(dim=(2, 3))


def linear_head(in_features: int, num_classes: int, weight: Tensor | None = None,
                bias: Tensor | None = None, generator: torch.Generator | None = None,
                boostlu_alpha: float | None = None, on_map: bool = False) -> nn.Linear:
    """An ``nn.Linear`` (a :class:`BoostLUHead` with ``boostlu_alpha``, a :class:`CamHead`
    with ``on_map``): the given weight (L, D) and bias (L,), or PyTorch's default
    initialisation drawn from ``generator`` (the same draw as stage two's fresh heads)."""
    head = (BoostLUHead(in_features, num_classes, boostlu_alpha) if boostlu_alpha is not None
            else CamHead(in_features, num_classes) if on_map
            else nn.Linear(in_features, num_classes))
    with torch.no_grad():
        if weight is None:
            weight_t, bias = init_linear(in_features, num_classes, generator or torch.Generator())
            weight = weight_t.t()
        if tuple(weight.shape) != (num_classes, in_features) or tuple(bias.shape) != (num_classes,):
            raise ValueError(f"head weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not "
                             f"fit {in_features} features and {plural(num_classes, 'class', 'classes')}")
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    return head


def build_net(trunk: nn.Module, head: nn.Linear) -> FinetuneNet:
    """A trainable copy of ``trunk`` (left untouched, so every configuration starts alike)."""
    trunk = copy.deepcopy(trunk)
    for parameter in trunk.parameters():
        parameter.requires_grad_(True)
    return FinetuneNet(trunk, head)

