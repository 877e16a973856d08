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
        tensor = _CONSTANTS[key] = _ready(torch.tensor(list(values), dtype=dtype,
                                                       device=key[1]))
    return tensor


def cached_constant(key: Hashable, make) -> Tensor:
    """The tensor cached under ``key``, made by ``make()`` the first time."""
    tensor = _CONSTANTS.get(key)
    if tensor is None:
        tensor = _CONSTANTS[key] = _ready(make())
    return tensor


def _ready(tensor: Tensor) -> Tensor:
    """``tensor`` once its values are computed: a constant made on one CUDA stream may be read
    next on another (stage two trains several groups at once on a GPU, each on its stream).
    Not while a CUDA graph is being captured (nothing runs then; the trainer makes its
    constants in the steps it runs before a capture)."""
    if tensor.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        torch.cuda.current_stream(tensor.device).synchronize()
    return tensor
