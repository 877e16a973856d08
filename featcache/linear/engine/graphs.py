"""A group's training steps replayed as CUDA graphs on the GPU, many steps per graph.

A stage-two step is a few dozen small kernels per loss (gathers, batched matmuls, each loss's
terms, the heads' gradients, the optimizer); launched one by one, the GPU waits on the host.
On CUDA the trainer's step reads everything that changes from step to step from device
memory (:class:`DeviceBatches`: the epoch's batch order uploaded once, a step counter on the
device choosing the batch) so that one graph of :func:`steps_per_graph` steps, captured once,
replays any run of that many steps, in every epoch.

What a graph replays is checked, not assumed (:class:`GraphedSteps`): the first step of each
epoch runs as it is, traced operator by operator (:mod:`featcache.linear.engine.steptrace`);
a step that reads a value on the host is never captured, and the graphs are captured again
only when the traced step differs from the one they were captured from (a loss whose scalars
follow the epoch, a head frozen by early stopping). In the first epoch two traced steps must
agree before anything is captured. A group whose capture fails trains without graphs from then
on and says so once, with the cause; the failed capture leaves the stream and the memory as
they were (:func:`capture_graph`). Everything runs on the run's device (``cuda:N``): its side
stream, its captures, its memory.

On the CPU the same step runs as it is; :class:`RerunGraphs` stands in for the CUDA backend in
the tests (a "graph" that runs its steps again, and a capture that refuses what CUDA's would).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from featcache.environment import CUDA_GRAPHS, GRAPH_STEPS
from featcache.interrupt import check_stop
from featcache.linear.engine.steptrace import HostCopies, StepTrace

log = logging.getLogger(__name__)
T = TypeVar("T")

#: ``FEATCACHE_CUDA_GRAPHS=0`` trains every step without a graph (for comparison or debugging)
GRAPHS_ENV = "FEATCACHE_CUDA_GRAPHS"
#: ``FEATCACHE_GRAPH_STEPS=N``: training steps recorded in one graph (default
#: :data:`STEPS_PER_GRAPH`)
STEPS_ENV = "FEATCACHE_GRAPH_STEPS"
#: training steps per graph: a replay launches them all; a capture records them all (about
#: the host time of as many steps run one by one, paid again when a step changes)
STEPS_PER_GRAPH = 32
#: the fewest steps per graph for a group whose graphs are captured again (every epoch for a
#: loss that follows a schedule)
MIN_STEPS_PER_GRAPH = 4
#: traced steps before the first capture: the first warms up (caches, handles), the next two
#: must launch the same operators
FIRST_TRACED = 2


def graphs_enabled(device: torch.device) -> bool:
    """Whether a group's steps are captured as CUDA graphs on ``device``."""
    return device.type == "cuda" and bool(CUDA_GRAPHS.value(True))


def steps_per_graph() -> int:
    """Steps recorded in one graph (``FEATCACHE_GRAPH_STEPS``, at least 1)."""
    return int(GRAPH_STEPS.value(STEPS_PER_GRAPH))


class CaptureFailed(RuntimeError):
    """A capture that could not be completed; ``str()`` names its first cause."""


class Replay(Protocol):
    def replay(self) -> None: ...

    def reset(self) -> None: ...


class Backend(Protocol):
    """Where a group's graphs live: :class:`CudaGraphs`, or :class:`RerunGraphs` in tests."""

    @contextmanager
    def steps(self) -> Iterator[None]:
        """The context every step and replay of an epoch runs in."""
        yield

    def capture(self, record: Callable[[], None]) -> Replay:
        """``record()`` captured (nothing runs), or :class:`CaptureFailed`."""
        ...


class DeviceBatches:
    """One epoch's batches where a captured step can read them: the rows of every batch in
    order, (steps, B) int64 on the device, uploaded once an epoch, and the step counter (1,)
    on the device; :meth:`take` is the batch the counter points at, :meth:`advance` moves it
    (both inside the step, so a replayed graph moves through the epoch)."""

    def __init__(self, steps: int, batch_size: int, device: torch.device):
        self.order = torch.zeros(steps, batch_size, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.positions = torch.arange(batch_size, dtype=torch.int64, device=device)
        self.batch_size = batch_size

    def begin(self, order: Tensor) -> None:
        """The epoch's batches (rows, (steps x B,) on any device), from its first step."""
        self.order.view(-1).copy_(order[:self.order.numel()], non_blocking=True)
        self.counter.zero_()

    def take(self) -> Tensor:
        """The rows of the batch the counter points at, (B,)."""
        return self.order.index_select(0, self.counter).view(-1)

    def slots(self) -> Tensor:
        """Where this batch's rows go among the epoch's (B,): counter x B + 0..B-1."""
        return self.counter * self.batch_size + self.positions

    def advance(self) -> None:
        self.counter.add_(1)


class StepCounter(Protocol):
    """What counts steps on the host (the optimizer): a replay advances it by its steps, a
    capture leaves it as it was (its steps are recorded, not run)."""

    step_count: int


class GraphedSteps:
    """A group's steps on a graph backend: each epoch, a traced step, then graphs of
    :func:`steps_per_graph` steps (and one for the epoch's remainder), captured once and
    replayed while the traced step stays the same."""

    def __init__(self, backend: Backend, describe: str, counter: StepCounter):
        self.backend, self.describe, self.counter = backend, describe, counter
        self.chunk = steps_per_graph()
        self.graphs: dict[int, Replay] = {}  # steps per replay -> its graph
        self.signature: tuple | None = None  # of the step the graphs were captured from
        self.failed: str | None = None  # why this group trains without graphs
        self.captures = self.replays = self.eager_steps = self.epochs = 0

    def run_epoch(self, steps: int, step: Callable[[], None]) -> None:
        """``steps`` steps of ``step`` (which reads its batch from device buffers and moves
        the device counter on), in order."""
        with self.backend.steps():
            done = 0
            if self.failed is None and steps:
                # the epoch's first step may make what the later ones reuse (constants of the
                # epoch): only the steps after it are what a graph records
                first = self._traced(step, judged=False)
                done = 1
                if first != self.signature:
                    later = [self._traced(step, judged=True)
                             for _ in range(min(steps - done, 1 if self.epochs else FIRST_TRACED))]
                    done += len(later)
                    if len(set(later)) > 1:
                        self._fail("its steps launch other operators from one step to the next")
                    elif later and self.failed is None:
                        if self.signature is not None:  # a schedule, a frozen head: smaller
                            # graphs (a capture costs about as many steps' host time)
                            self.chunk = max(min(MIN_STEPS_PER_GRAPH, self.chunk), self.chunk // 4)
                        self._drop_graphs()
                        self.signature = later[-1]
            self.epochs += 1
            while done < steps:
                check_stop()
                count = min(self.chunk, steps - done)
                graph = None if self.failed else self._graph(count, step)
                if graph is None:
                    step()
                    self.eager_steps += 1
                    done += 1
                    continue
                counted = self.counter.step_count
                graph.replay()
                self.counter.step_count = counted + count  # the steps the graph ran
                self.replays += 1
                done += count

    def _traced(self, step: Callable[[], None], judged: bool) -> tuple:
        """Run one step as it is, traced: its signature. A ``judged`` step is one a graph would
        record: if it reads values on the host, the group trains without graphs."""
        check_stop()
        trace, copies = StepTrace(), HostCopies()
        with copies, trace:
            step()
        self.eager_steps += 1
        reads = trace.host_reads + copies.calls
        if judged and reads and self.failed is None:
            self._fail(f"a step reads values on the host ({', '.join(sorted(set(reads)))})")
        return trace.signature()

    def _graph(self, count: int, step: Callable[[], None]) -> Replay | None:
        graph = self.graphs.get(count)
        if graph is not None:
            return graph

        def record() -> None:
            for _ in range(count):
                step()

        counted = self.counter.step_count
        try:
            graph = self.backend.capture(record)
        except CaptureFailed as failure:
            self._fail(f"its capture failed: {failure}")
            return None
        finally:
            self.counter.step_count = counted  # recorded, not run (replays run them)
        self.graphs[count] = graph
        self.captures += 1
        return graph

    def _fail(self, why: str) -> None:
        self.failed = why
        self._drop_graphs()
        log.warning("%s: trains without CUDA graphs from now on: %s", self.describe, why)

    def _drop_graphs(self) -> None:
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    def stats(self) -> dict:
        """What the graphs did (for benchmarks and checks)."""
        return {"captures": self.captures, "replays": self.replays,
                "eager_steps": self.eager_steps, "steps_per_graph": self.chunk,
                "failed": self.failed}


class Branches:
    """Where the independent parts of a step run: on CUDA with graphs, each part on a stream
    of its own, forked after the work queued before it and joined before the work after it
    (a captured graph keeps them as parallel branches, so a step of many losses waits for the
    slowest loss's terms, not for all of them one after the other); elsewhere one after the
    other, in order (the same operations on the same values)."""

    def __init__(self, device: torch.device, parts: int, forked: bool):
        self.device = device
        self.streams = ([torch.cuda.Stream(device=device) for _ in range(parts)]
                        if forked and parts > 1 else None)

    def run(self, parts: Sequence[Callable[[], T]]) -> list[T]:
        if self.streams is None:
            return [part() for part in parts]
        main = torch.cuda.current_stream(self.device)
        out = []
        for stream, part in zip(self.streams, parts, strict=True):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                out.append(part())
        for stream in self.streams:
            main.wait_stream(stream)
        return out


def graph_backend(device: torch.device) -> Backend:
    """Where a group's graphs live on ``device`` (the tests put :class:`RerunGraphs` here to
    run the graph path on the CPU)."""
    return CudaGraphs(device)


class CudaGraphs:
    """The graphs of one group on CUDA device ``device``: its own side stream (a capture
    needs one that is not the default stream), the warm-up and every replay on it, ordered
    after the work queued on the device's current stream before the epoch, and before the
    work queued there after it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    @contextmanager
    def steps(self) -> Iterator[None]:
        with torch.cuda.device(self.device):
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            try:
                with torch.cuda.stream(self.stream):
                    yield
            finally:
                current.wait_stream(self.stream)

    def capture(self, record: Callable[[], None]) -> Replay:
        return capture_graph(self.device, self.stream, record)


def capture_graph(device: torch.device, stream: torch.cuda.Stream,
                  record: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``record()`` captured on ``stream`` of ``device`` as a CUDA graph with a memory pool of
    its own. On a failure the thread is back on the stream it was on, the capture's memory pool
    is given back, and :class:`CaptureFailed` names the first error (the one inside the capture,
    not the "capture invalidated" that ending it raises then)."""
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    cause: BaseException | None = None
    ended = False
    with torch.cuda.device(device), torch.cuda.stream(stream):
        stream.synchronize()
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            record()
        except BaseException as error:  # noqa: BLE001 - any error inside a capture ends it
            cause = error
        try:
            graph.capture_end()
            ended = True
        except Exception as error:  # noqa: BLE001
            cause = cause or error
        if cause is None:
            return graph
        if not ended:  # capture_end raised before giving the pool back
            _abandon_pool(device, pool)
        try:
            graph.reset()
        except Exception:  # noqa: BLE001, S110 - nothing left to release
            pass
        stream.synchronize()
    if not isinstance(cause, Exception):  # Ctrl-C and the like: cleaned up, passed on
        raise cause
    first = str(cause).strip().split("\n")[0]
    raise CaptureFailed(f"{type(cause).__name__}: {first}") from cause


def _abandon_pool(device: torch.device, pool: object) -> None:
    """Stop routing the failed capture's allocations to its pool and release the pool (the
    allocator's calls are private and differ between PyTorch versions: best effort)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    end = (getattr(torch._C, "_cuda_endAllocateToPool", None)
           or getattr(torch._C, "_cuda_endAllocateCurrentStreamToPool", None))
    for call in (end, getattr(torch._C, "_cuda_releasePool", None)):
        if call is not None:
            try:
                call(index, pool)
            except Exception:  # noqa: BLE001, S110 - already ended or released
                pass


class RerunGraphs:
    """A stand-in for :class:`CudaGraphs` on any device (tests): a "graph" runs the steps it
    recorded again when replayed (the numbers are the plain steps'); ``refuse`` makes every
    capture fail, as CUDA's does for a step it cannot record."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.captured = 0

    @contextmanager
    def steps(self) -> Iterator[None]:
        yield

    def capture(self, record: Callable[[], None]) -> Replay:
        if self.refuse:
            raise CaptureFailed("RuntimeError: operation not permitted when stream is capturing")
        self.captured += 1
        return _Rerun(record)


class _Rerun:
    def __init__(self, record: Callable[[], None]):
        self.record = record

    def replay(self) -> None:
        self.record()

    def reset(self) -> None:
        pass
