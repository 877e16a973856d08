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

Several groups train at once on one GPU, each in a thread (:mod:`~featcache.linear.engine.
workers`): every stream a group uses is leased to it alone (:mod:`~featcache.linear.engine.
streams`; PyTorch's streams come from a shared pool of 32), captures are made one at a time
and in ``thread_local`` mode, and a step's branches are joined even when it fails, so that one
group's capture can neither take in nor be broken by another group's work.

On the CPU the same step runs as it is; :class:`~featcache.linear.engine.replay.RecordedGraphs`
stands in for the CUDA backend in the tests: a capture records the operators the steps launch
(undoing what they wrote), and a replay launches those operators again with the recorded
scalars on the recorded tensors, as a CUDA graph does, without running the Python step.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from featcache.environment import CUDA_GRAPHS, GRAPH_STEPS
from featcache.interrupt import check_stop
from featcache.linear.engine.steptrace import HostCopies, StepTrace
from featcache.linear.engine.streams import LEASE, give_back, is_capturing

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
#: the most streams a step forks its losses' terms onto (each runs its losses in turn): four
#: groups at once, each with its own stream, its capture stream and four branches, hold 24 of
#: the 32 streams of a device's pool
MAX_BRANCHES = 4
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
    """Where a group's graphs live: :class:`CudaGraphs`, or
    :class:`~featcache.linear.engine.replay.RecordedGraphs` in tests."""

    @contextmanager
    def steps(self) -> Iterator[None]:
        """The context every step and replay of an epoch runs in."""
        yield

    def capture(self, record: Callable[[], None]) -> Replay:
        """``record()`` captured (nothing runs), or :class:`CaptureFailed`."""
        ...

    def close(self) -> None:
        """The group is done: give back what the backend holds (its stream)."""
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
                    elif later and self.failed is None and later[-1] != self.signature:
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
    """Where the independent parts of a step run: on CUDA with graphs, on up to
    :data:`MAX_BRANCHES` streams of their own (part i on stream i modulo their number, each
    stream's parts one after the other), forked after the work queued before them and joined
    before the work after them, also when a part fails (a captured graph keeps them as parallel
    branches, so a step of many losses waits for its slowest branch, not for every loss in
    turn); elsewhere, or when no stream is free, one after the other, in order (the same
    operations on the same values). The streams are leased (:mod:`~featcache.linear.engine.
    streams`): :meth:`close` gives them back."""

    def __init__(self, device: torch.device, parts: int, forked: bool):
        self.device = device
        self.streams: list = []
        if forked and parts > 1:
            self.streams = LEASE.take(device, min(parts, MAX_BRANCHES))
            if len(self.streams) < 2:  # one branch is no branch: the capture stream serves
                LEASE.give_back(self.streams)
                self.streams = []

    def lanes(self, parts: int) -> list[list[int]]:
        """Which parts each stream runs, in order."""
        count = max(1, len(self.streams))
        return [list(range(lane, parts, count)) for lane in range(count)]

    def run(self, parts: Sequence[Callable[[], T]]) -> list[T]:
        if not self.streams:
            return [part() for part in parts]
        main = torch.cuda.current_stream(self.device)
        out: list = [None] * len(parts)
        forked, failed = [], False
        try:
            for stream, lane in zip(self.streams, self.lanes(len(parts)), strict=False):
                stream.wait_stream(main)
                forked.append(stream)
                with torch.cuda.stream(stream):
                    for index in lane:
                        out[index] = parts[index]()
        except BaseException:
            failed = True
            raise
        finally:
            for stream in forked:  # joined even after a failure: a capture can then end
                try:
                    main.wait_stream(stream)
                except Exception:
                    if not failed:
                        raise
        return out

    def close(self) -> None:
        """Give the streams back (or retire those a failed capture left capturing)."""
        give_back(self.streams)
        self.streams = []


def graph_backend(device: torch.device, joined: Sequence = ()) -> Backend:
    """Where a group's graphs live on ``device`` (``joined``: the streams its steps fork onto;
    the tests put :class:`~featcache.linear.engine.replay.RecordedGraphs` here to run the graph
    path on the CPU); :class:`NoStream` when no stream of the device is free."""
    return CudaGraphs(device, joined)


class NoStream(RuntimeError):
    """Every stream of the device's pool is held by another group."""


class CudaGraphs:
    """The graphs of one group on CUDA device ``device``: a leased side stream of its own (a
    capture needs one that is not the default stream, and that no other group uses), the
    warm-up and every replay on it, ordered after the work queued on the device's current
    stream before the epoch, and before the work queued there after it."""

    def __init__(self, device: torch.device, joined: Sequence = ()):
        self.device = device
        taken = LEASE.take(device, 1)
        if not taken:
            raise NoStream(f"no free stream on {device} for a group's graphs")
        self.stream = taken[0]
        self.joined = list(joined)

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
        return capture_graph(self.device, self.stream, record, self.joined)

    def close(self) -> None:
        give_back([self.stream])


#: one capture at a time in this process: a capture of one group never overlaps another's
#: (each is "thread_local": what other threads do does not invalidate it)
_CAPTURING = threading.Lock()


def capture_graph(device: torch.device, stream: torch.cuda.Stream,
                  record: Callable[[], None], joined: Sequence = ()) -> torch.cuda.CUDAGraph:
    """``record()`` captured on ``stream`` of ``device`` as a CUDA graph with a memory pool of
    its own, one capture of the process at a time, in ``thread_local`` mode (another thread's
    allocation or synchronisation neither fails nor invalidates it). On a failure the thread is
    back on the stream it was on, the capture's memory pool is given back, the stream has
    finished its work, and :class:`CaptureFailed` names the first error (the one inside the
    capture, not the "capture invalidated" that ending it raises then). ``joined``: the streams
    a step forks onto; a failure that leaves one of them (or ``stream``) capturing raises
    :class:`StreamsLeftCapturing` instead, which the search answers by training the group
    again without graphs (:func:`is_capture_error`)."""
    graph = torch.cuda.CUDAGraph()
    with _CAPTURING, torch.cuda.device(device):
        pool = torch.cuda.graph_pool_handle()
        cause: BaseException | None = None
        ended = False
        with torch.cuda.stream(stream):
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
        left = [s for s in (stream, *joined) if is_capturing(s)]
        if left:
            raise StreamsLeftCapturing(f"a failed capture left {len(left)} stream(s) capturing "
                                       f"({_first_line(cause)})") from cause
        stream.synchronize()
    if not isinstance(cause, Exception):  # Ctrl-C and the like: cleaned up, passed on
        raise cause
    raise CaptureFailed(_first_line(cause)) from cause


class StreamsLeftCapturing(RuntimeError):
    """A failed capture that could not be ended cleanly: the group's streams are unusable."""


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


#: what a CUDA error of a stream capture says (cudaErrorStreamCapture*: "operation not
#: permitted when stream is capturing", "dependency created on uncaptured work in another
#: stream", "operation failed due to a previous error during capture", ...)
_CAPTURE_WORDS = re.compile(r"captur", re.IGNORECASE)


def is_capture_error(error: BaseException) -> bool:
    """Whether ``error`` comes from a CUDA graph capture (its own or, on a GPU shared by
    several groups, another's): what a group trained with graphs answers by training again
    without them."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (CaptureFailed, StreamsLeftCapturing)) or (
                _CAPTURE_WORDS.search(str(current))
                and ("CUDA" in str(current) or "stream" in str(current))):
            return True
        current = current.__cause__ or current.__context__
    return False


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
