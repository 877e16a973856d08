"""The network stage three trains: stage one's backbone trunk with a linear head on top."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

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

    def forward(self, x: Tensor) -> Tensor:
        features = self.trunk(x)
        with torch.autocast(x.device.type, enabled=False):
            return self.head(features.float())


def linear_head(in_features: int, num_classes: int, weight: Tensor | None = None,
                bias: Tensor | None = None, generator: torch.Generator | None = None) -> nn.Linear:
    """An ``nn.Linear``: the given weight (L, D) and bias (L,), or PyTorch's default
    initialisation drawn from ``generator`` (the same draw as stage two's fresh heads)."""
    head = nn.Linear(in_features, num_classes)
    with torch.no_grad():
        if weight is None:
            weight_t, bias = init_linear(in_features, num_classes, generator or torch.Generator())
            weight = weight_t.t()
        if tuple(weight.shape) != (num_classes, in_features) or tuple(bias.shape) != (num_classes,):
            raise ValueError(f"head weight {tuple(weight.shape)} / bias {tuple(bias.shape)} do not "
                             f"fit {in_features} features and {num_classes} classes")
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    return head


def build_net(trunk: nn.Module, head: nn.Linear) -> FinetuneNet:
    """A trainable copy of ``trunk`` (left untouched, so every configuration starts alike)."""
    trunk = copy.deepcopy(trunk)
    for parameter in trunk.parameters():
        parameter.requires_grad_(True)
    return FinetuneNet(trunk, head)

