"""A stand-in for CUDA graphs on any device, faithful to what a replay does: the tests run the
trainer's graph path on the CPU with it, so that what a captured graph would get wrong shows up
there as numbers that differ from the plain loop's.

A CUDA graph does not run the Python code of the steps it recorded: a replay launches the
recorded kernels again, with the scalar arguments they had when they were recorded, on the
memory they used then. So a Python number that changes after the capture (an epoch's rate, a
step count) stays what it was, a tensor the step replaced by a new one is still read at the old
address, and memory allocated during the capture holds whatever the last replay left there.

:class:`RecordedGraphs` does the same with ATen operators. Its capture runs the steps under a
``TorchDispatchMode`` that records every operator with its arguments (the tensors themselves,
the scalars as they were), then undoes what the steps wrote to memory that existed before the
capture (a CUDA capture runs nothing) and fills the memory the capture allocated with a
poison (NaN bytes: a CUDA graph's pool holds nothing meaningful until a replay). Its replay
calls the recorded operators again, in order, on the recorded tensors, and writes each result
where the recorded one was. An operator that reads a value on the host fails the capture, as
CUDA's would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from featcache.linear.engine.graphs import CaptureFailed, Replay
from featcache.linear.engine.steptrace import HOST_READS, MASK_INDEXING, _has_mask, _op_name

#: the byte the memory a capture allocated is filled with (0xFF: NaN in every float type)
POISON = 0xFF


class RecordedGraphs:
    """A graph backend for any device (:class:`~featcache.linear.engine.graphs.Backend`):
    captures record operators, replays launch them again (see the module). ``refuse`` makes
    every capture fail, as CUDA's does for a step it cannot record."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.captured = 0
        self.replayed = 0

    @contextmanager
    def steps(self) -> Iterator[None]:
        yield

    def capture(self, record: Callable[[], None]) -> Replay:
        if self.refuse:
            raise CaptureFailed("RuntimeError: operation not permitted when stream is capturing")
        recorder = self.recorder()
        try:
            with recorder:
                record()
        except Exception as error:
            recorder.undo()
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise CaptureFailed(f"{type(error).__name__}: {first}") from error
        recorder.undo()
        self.captured += 1
        return RecordedGraph(recorder.ops, self)

    def recorder(self) -> Recorder:
        """What records a capture."""
        return Recorder()

    def close(self) -> None:
        pass


class RecordedGraph:
    """The operators of one capture, replayed as recorded."""

    def __init__(self, ops: list[tuple], owner: RecordedGraphs):
        self.ops, self.owner = ops, owner

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, recorded in self.ops:
                result = func(*args, **kwargs)
                for mine, fresh in zip(_leaves(recorded), _leaves(result), strict=True):
                    if isinstance(mine, Tensor) and not _same_memory(mine, fresh):
                        mine.copy_(fresh)
        self.owner.replayed += 1

    def reset(self) -> None:
        self.ops = []


class Recorder(TorchDispatchMode):
    """Every ATen operator run under it, with its arguments and results (kept alive: the
    capture's "pool"); what it wrote to memory older than it is saved first so that
    :meth:`undo` can put it back."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []
        self._held: set[tuple] = set()  # storages that existed before the capture
        self._made: dict[tuple, Any] = {}  # storages allocated during it
        self._saved: dict[tuple, tuple[Any, Any]] = {}  # written held storage -> (it, copy)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = _op_name(func)
        if name in HOST_READS or (name in MASK_INDEXING and len(args) > 1
                                  and _has_mask(args[1])):
            raise RuntimeError(f"operation not permitted when stream is capturing: {func} "
                               "reads a value on the host")
        if any(isinstance(v, torch.Generator) for v in _leaves((args, kwargs))):
            raise RuntimeError(f"{func} draws random numbers: the stand-in does not replay them")
        for value in _leaves((args, kwargs)):
            if isinstance(value, Tensor):
                key = _storage(value)
                if key is not None and key not in self._made:
                    self._held.add(key)
        for value in _written(func, args, kwargs):
            key = _storage(value)
            if key in self._held and key not in self._saved:
                storage = value.untyped_storage()
                self._saved[key] = (storage, storage.clone())
        out = func(*args, **kwargs)
        if out is not None and not isinstance(out, (Tensor, tuple, list)):
            raise RuntimeError(f"operation not permitted when stream is capturing: {func} "
                               "hands a value to the host")
        for value in _leaves(out):
            if isinstance(value, Tensor):
                key = _storage(value)
                if key is not None and key not in self._held and key not in self._made:
                    self._made[key] = value.untyped_storage()
        self.ops.append((func, args, kwargs, out))
        return out

    def undo(self) -> None:
        """Memory older than the capture as it was before it; the capture's own poisoned."""
        for storage, saved in self._saved.values():
            storage.copy_(saved)
        for storage in self._made.values():
            storage.fill_(POISON)


def _storage(tensor: Tensor) -> tuple | None:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (str(tensor.device), storage.data_ptr())


def _same_memory(a: Tensor, b: Any) -> bool:
    """Whether the replayed result ``b`` is the recorded ``a`` or a view of its memory (an
    in-place operator, an ``out=`` argument, a view: nothing to copy)."""
    return b is a or bool(isinstance(b, Tensor) and _storage(a) == _storage(b)
                          and a.storage_offset() == b.storage_offset()
                          and a.shape == b.shape and a.stride() == b.stride())


def _written(func: Any, args: tuple, kwargs: dict) -> Iterator[Tensor]:
    """The tensors an operator writes to (its schema's mutable arguments)."""
    positional = 0
    for argument in func._schema.arguments:
        if argument.kwarg_only:
            value = kwargs.get(argument.name)
        else:
            value = (args[positional] if positional < len(args)
                     else kwargs.get(argument.name))
            positional += 1
        info = argument.alias_info
        if info is not None and info.is_write:
            for leaf in _leaves(value):
                if isinstance(leaf, Tensor):
                    yield leaf


def _leaves(value: Any) -> Iterator[Any]:
    """The items of nested tuples, lists and dicts, in order (None included)."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value
