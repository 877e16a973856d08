"""Seeds derived from a run seed, and the seeded initialisation both stages give a fresh head."""

from __future__ import annotations

import math
import zlib

import torch
from torch import Tensor


def derive_seed(*parts) -> int:
    """A 63-bit seed from a run seed and text parts (stable across processes and machines)."""
    text = "|".join(str(p) for p in parts).encode()
    return (zlib.crc32(text) << 31 ^ zlib.crc32(text[::-1])) & ((1 << 63) - 1)


def init_linear(in_features: int, out_features: int, generator: torch.Generator,
                device=None) -> tuple[Tensor, Tensor]:
    """``torch.nn.Linear``'s default initialisation drawn from ``generator``.

    Returns weight (in_features, out_features) (transposed for ``x @ W``) and bias
    (out_features,), both U(-1/sqrt(in), 1/sqrt(in)) as ``nn.Linear.reset_parameters`` gives.
    """
    bound = 1.0 / math.sqrt(in_features)
    weight = torch.empty(out_features, in_features).uniform_(-bound, bound, generator=generator)
    bias = torch.empty(out_features).uniform_(-bound, bound, generator=generator)
    return weight.t().contiguous().to(device), bias.to(device)
