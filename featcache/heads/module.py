"""One head of any kind as a ``torch.nn.Module`` (stage three's network, the API's predictions):
the kind's stacked implementation with H = 1 over the module's parameters.

The parameters keep ``nn.Linear``'s layout and names, weight (L, D) and bias (L,), so a
stage-two head of any kind loads as it is and checkpoints are what they were.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from featcache.errors import plural
from featcache.heads.kinds import HeadKind
from featcache.heads.linear import LinearHeads, init_linear
from featcache.heads.maps import MapHeads


def map_rows(feature_map: Tensor) -> tuple[Tensor, int]:
    """A feature map (B, D, h, w) as rows (B, h w D) in (h, w, D) order (the spatial features
    file's layout), and its number of positions h w."""
    batch, _, height, width = feature_map.shape
    return feature_map.permute(0, 2, 3, 1).reshape(batch, -1), height * width


class HeadModule(nn.Module):
    """One head of kind ``kind`` on pooled features (B, D) or on a feature map (B, D, h, w)
    (the kinds that read maps), its logits (B, L) computed by the kind's implementation."""

    def __init__(self, kind: HeadKind, in_features: int, out_features: int,
                 loss_params: Mapping[str, float] | None = None):
        super().__init__()
        self.kind = HeadKind(kind)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        given = loss_params or {}
        self.loss_params = {key: float(given[key]) for key in self.kind.implementation.loss_params}

    @classmethod
    def create(cls, kind: HeadKind, in_features: int, num_classes: int,
               loss_params: Mapping[str, float] | None = None, weight: Tensor | None = None,
               bias: Tensor | None = None, generator: torch.Generator | None = None) -> HeadModule:
        """The head with the given weight (L, D) and bias (L,), or PyTorch's default
        ``nn.Linear`` initialisation drawn from ``generator`` (the same draw as stage two's
        fresh heads)."""
        head = cls(kind, in_features, num_classes, loss_params)
        with torch.no_grad():
            if weight is None or bias is None:
                weight_t, bias = init_linear(in_features, num_classes,
                                             generator or torch.Generator())
                weight = weight_t.t()
            if (tuple(weight.shape) != (num_classes, in_features)
                    or tuple(bias.shape) != (num_classes,)):
                raise ValueError(f"head weight {tuple(weight.shape)} / bias {tuple(bias.shape)} "
                                 f"do not fit {in_features} features and "
                                 f"{plural(num_classes, 'class', 'classes')}")
            head.weight.copy_(weight)
            head.bias.copy_(bias)
        return head

    def stacked(self, positions: int = 1) -> LinearHeads:
        """This head as the kind's stacked heads (H = 1) over views of its parameters."""
        return self.kind.implementation(
            self.weight.t().unsqueeze(0), self.bias.view(1, 1, -1), positions=positions,
            params={key: [value] for key, value in self.loss_params.items()})

    def forward(self, features: Tensor) -> Tensor:
        """Logits (B, L) of pooled features (B, D), or of a feature map (B, D, h, w)."""
        if features.dim() == 4:
            rows, positions = map_rows(features)
            return self.stacked(positions)(rows)[0]
        return self.stacked()(features)[0]

    def map_heads(self, positions: int) -> MapHeads:
        """This head applied at each of ``positions`` positions of a map: the kind's own heads
        on maps, or for a linear head the same weights as a CAM head."""
        return self.kind.map_implementation(
            self.weight.t().unsqueeze(0), self.bias.view(1, 1, -1), positions=positions,
            params={key: [value] for key, value in self.loss_params.items()})

    def cam_and_logits(self, feature_map: Tensor) -> tuple[Tensor, Tensor]:
        """The class activation maps (B, L, h, w) of a feature map (B, D, h, w), bias
        included, and the logits (B, L) the head's pooling makes of them."""
        batch, _, height, width = feature_map.shape
        rows, positions = map_rows(feature_map)
        heads = self.map_heads(positions)
        cam = heads.cam(rows)
        maps = cam[0].permute(0, 2, 1).reshape(batch, self.out_features, height, width)
        return maps, heads.pool(cam)[0]

    def extra_repr(self) -> str:
        params = "".join(f", {key}={value:g}" for key, value in self.loss_params.items())
        return (f"kind={self.kind.value}, in_features={self.in_features}, "
                f"out_features={self.out_features}{params}")

