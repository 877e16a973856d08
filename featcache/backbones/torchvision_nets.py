"""torchvision backbones (the ResNets: the papers' ResNet-50): build, load a weights file, cut to
pooled features.

A torchvision ResNet without its ``fc`` layer is the trunk (:class:`ResNetTrunk`); a weights
file is a torchvision state dict (or one under ``state_dict``/``model``, with or without a
``module.`` prefix), loaded by :func:`featcache.backbones.weights.load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torchvision
from torch import Tensor, nn

if TYPE_CHECKING:  # the registry builds its specs with this module's trunk
    from featcache.backbones.registry import BackboneSpec


class ResNetTrunk(nn.Module):
    """A torchvision ResNet without its ``fc`` layer: pooled, flattened features.

    The submodules keep torchvision's names (``conv1`` ... ``layer4``, ``avgpool``), so a
    torchvision state dict without ``fc.*`` loads as is. Pooling runs in float32 even under
    autocast: averaging 196 (448 px) activations in bf16 would throw away precision for nothing.

    Every trunk offers :meth:`feature_map`, the spatial map (B, D, h, w) its pooled output
    averages (the last convolutional block: 14 x 14 at 448 px), so that ``forward(x)`` is
    exactly ``feature_map(x)`` averaged over positions. A linear head over the pooled features
    applied at every position of the map gives its class activation map.
    """

    def __init__(self, net: torchvision.models.ResNet):
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = net.layer1, net.layer2, net.layer3, net.layer4
        self.avgpool = net.avgpool

    def feature_map(self, x: Tensor) -> Tensor:
        """The last convolutional block's output, (B, D, h, w), before pooling."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def pool_map(self, fmap: Tensor) -> Tensor:
        """The pooled features of a map from :meth:`feature_map` (what ``forward`` returns)."""
        return torch.flatten(self.avgpool(fmap.float()), 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool_map(self.feature_map(x))



def tags(spec: BackboneSpec) -> list[str]:
    """The names ``--weights`` accepts for ``spec`` besides ``random`` and a path: the short
    aliases (``v1``) and torchvision's enum members they stand for."""
    return list(spec.weights_aliases) + [m for m in spec.weights_aliases.values()]


def build(spec: BackboneSpec, image_size: int, path: Path | None = None,
          tag: str | None = None) -> nn.Module:
    """The trunk of ``spec``'s network: random weights, or those of the checkpoint ``path``
    (``image_size`` and ``tag`` do not matter to a ResNet)."""
    from featcache.backbones.weights import load_state_dict

    net = cast(Callable[[], nn.Module], spec.build)()  # every torchvision entry has one
    if path is not None:
        load_state_dict(net, path)
    return spec.trunk(net)
