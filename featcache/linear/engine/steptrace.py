"""What a training step asks of the device, operator by operator: whether it can be captured as
a CUDA graph and replayed.

A CUDA graph replays the operators a step launched while it was recorded, with the scalar
arguments and the memory they had then. A step can therefore be captured only when none of its
operators reads a value on the host (a host read waits for the device, which a capture refuses)
and every step of an epoch launches the same operators with the same scalars on the same
persistent tensors (what changes from step to step must be in device memory: the batch chosen
by a step counter on the device, the weights, the state). :class:`StepTrace` records a step
under a ``TorchDispatchMode`` (every ATen operator, after autograd: the forward and the backward
of a loss) and a ``TorchFunctionMode`` (the tensor methods that copy values to the host without
an operator of their own), and gives its :meth:`~StepTrace.signature`: two steps with equal
signatures launch the same graph. The trainer compares the signature of each epoch's first
step with the one its graph was captured from (:mod:`featcache.linear.engine.graphs`); the
tests check every shipped loss on the CPU (``tests/test_step_capture.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: ATen operators that read a tensor's value on the host, or whose output's shape depends on
#: values (so the host must read them): what a CUDA graph cannot capture. The linear-algebra
#: decompositions check their result on the host (``_linalg_check_errors``) inside the kernel.
HOST_READS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "equal", "allclose",
    "nonzero", "nonzero_numpy", "argwhere", "masked_select",
    "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "bincount", "histc", "repeat_interleave",
    "_linalg_check_errors", "_linalg_svd", "linalg_svd", "svd", "_linalg_eigh", "linalg_eigh",
    "linalg_eig", "_linalg_eigvals", "linalg_eigvals", "cholesky", "linalg_lstsq",
    "lift_fresh", "lift_fresh_copy",  # a tensor made from host data during the step
})
#: operators whose tensor arguments select by mask when they are boolean (a host read)
MASK_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
#: tensor methods that copy values to the host without an ATen operator of their own on the CPU
HOST_METHODS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__",
                          "__index__", "__array__"})


def _op_name(func: Any) -> str:
    """``aten.mul.Tensor`` -> ``mul``."""
    return func.__name__.split(".")[0]


class StepTrace(TorchDispatchMode):
    """The ATen operators of the code run under it, each with its scalar arguments and where its
    tensors come from: made by an earlier operator of the trace (by order) or persistent (by
    address, shape, strides and dtype). Use with :class:`HostCopies` to catch host copies made
    by tensor methods."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self.host_reads: list[str] = []
        self._made: dict[int, int] = {}  # id of a tensor made by a traced operator -> its number
        self._keep: list[torch.Tensor] = []  # holds them, so that no id is reused meanwhile

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = _op_name(func)
        if name in HOST_READS or (name in MASK_INDEXING and len(args) > 1 and _has_mask(args[1])):
            self.host_reads.append(str(func))
        described = (str(func), self._describe(args), self._describe(tuple(sorted(kwargs.items()))))
        out = func(*args, **kwargs)
        if not isinstance(out, (torch.Tensor, tuple, list)) and out is not None:
            self.host_reads.append(str(func))  # a value handed to Python
        for tensor in _tensors(out):
            if id(tensor) not in self._made:
                self._made[id(tensor)] = len(self._keep)
                self._keep.append(tensor)
        self.ops.append(described)
        return out

    def _describe(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            made = self._made.get(id(value))
            if made is not None:
                return ("made", made)
            return ("held", value.data_ptr(), tuple(value.shape), tuple(value.stride()),
                    value.dtype, str(value.device))
        if isinstance(value, (list, tuple)):
            return tuple(self._describe(v) for v in value)
        if isinstance(value, float):
            return ("float", "nan" if math.isnan(value) else value.hex())
        if isinstance(value, torch.Generator):
            return ("generator", id(value))
        return value

    def signature(self) -> tuple:
        """The operators, their scalars and the persistent tensors they read: equal for two
        steps that one captured graph replays."""
        return tuple(self.ops)


class HostCopies(TorchFunctionMode):
    """The tensor methods called under it that copy values to the host (``.item()``,
    ``.tolist()``, ``.cpu()``, ``bool(tensor)``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_METHODS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _has_mask(args: Iterable[Any]) -> bool:
    for value in args:
        if isinstance(value, (list, tuple)):
            if _has_mask(value):
                return True
        elif isinstance(value, torch.Tensor) and value.dtype in (torch.bool, torch.uint8):
            return True
    return False


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
