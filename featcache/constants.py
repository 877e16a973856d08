"""Small constant tensors on a device, built once: what a training step reads every step
without copying from the host (a ``torch.tensor(values, device=cuda)`` per step would make the
host wait for the device)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

_CONSTANTS: dict[Hashable, Tensor] = {}


def device_constant(values: Sequence[float], device: torch.device | str | None,
                    dtype: torch.dtype) -> Tensor:
    """``values`` as a 1-D tensor on ``device``, built once per values, device and dtype.
    Treat the result as read-only."""
    key = (tuple(values), torch.device(device or "cpu"), dtype)
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = torch.tensor(list(values), dtype=dtype, device=key[1])
    return tensor


def cached_constant(key: Hashable, make) -> Tensor:
    """The tensor cached under ``key``, made by ``make()`` the first time."""
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = make()
    return tensor
