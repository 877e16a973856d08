"""A group's training steps on fixed buffers, replayed as a CUDA graph on the GPU.

A stage-two step is a few dozen small kernels (gather, batched matmul, each loss's terms, the
heads' gradients, the optimizer); launched one by one, the GPU waits on the host. On CUDA
each epoch's step is captured once as a CUDA graph and replayed for the epoch's other steps:
the batch's rows (and, for streamed features, the batch itself) and the places its
predictions go are copied into fixed buffers, and nothing in a step waits for the device
(progress and the epoch's sums are read once an epoch). The first steps of an epoch run as
they are on a side stream (what a capture needs before it); a capture only records, so every
step runs once, in order. A group whose step cannot be captured (a loss that reads a value on
the host) trains the epoch without a graph, and says so once.

:class:`StepBuffers` is the step on fixed buffers, the same on every device: on the CPU it
runs as it is (the tests check that it gives the plain loop's numbers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from featcache.environment import CUDA_GRAPHS

log = logging.getLogger(__name__)

#: steps run as they are before an epoch's capture (the side-stream warm-up a capture needs)
WARMUP_STEPS = 2
#: ``FEATCACHE_CUDA_GRAPHS=0`` trains every step without a graph (for comparison or debugging)
GRAPHS_ENV = "FEATCACHE_CUDA_GRAPHS"

Body = Callable[[Tensor, Tensor, Tensor], None]


def graphs_enabled(device: torch.device) -> bool:
    """Whether a group's steps are captured as CUDA graphs on ``device``."""
    return device.type == "cuda" and bool(CUDA_GRAPHS.value(True))


class StepBuffers:
    """One epoch's steps through fixed buffers: the batch's rows ``index`` (B,), their
    features ``x`` (B, ...) unless ``gather`` takes them from device-resident rows, and
    ``slot`` (B,), where the batch's predictions go. ``body(x, index, slot)`` is the step."""

    def __init__(self, body: Body, batch_size: int, device: torch.device,
                 row_shape: tuple[int, ...], gather: Callable[[Tensor], Tensor] | None):
        self.body, self.gather = body, gather
        self.index = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.slot = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.x = None if gather is not None else torch.zeros(batch_size, *row_shape,
                                                             device=device)

    def load(self, index: Tensor, x: Tensor | None, slot: Tensor) -> None:
        """Copy a batch into the buffers (``x``: None where the step gathers the rows)."""
        self.index.copy_(index, non_blocking=True)
        self.slot.copy_(slot, non_blocking=True)
        if self.x is not None:
            if x is None:
                raise ValueError("these buffers hold the batch's features: pass them")
            self.x.copy_(x, non_blocking=True)

    def run(self) -> None:
        """The step on what the buffers hold."""
        x = self.gather(self.index) if self.gather is not None else self.x
        assert x is not None
        self.body(x, self.index, self.slot)


class GraphedEpoch:
    """One epoch's steps on the GPU: :data:`WARMUP_STEPS` steps on a side stream, then the
    step captured as a CUDA graph and replayed (eagerly after a capture that failed)."""

    def __init__(self, buffers: StepBuffers, describe: str, after_replay: Callable[[], None]):
        self.buffers, self.describe, self.after_replay = buffers, describe, after_replay
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager = False
        self.done = 0
        self.side = torch.cuda.Stream()

    def __call__(self, index: Tensor, x: Tensor | None, slot: Tensor) -> None:
        self.buffers.load(index, x, slot)
        if self.graph is not None:
            self.graph.replay()
            self.after_replay()  # what the step did on the host when it was recorded
        elif self.eager:
            self.buffers.run()
        elif self.done < WARMUP_STEPS:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                self.buffers.run()
            torch.cuda.current_stream().wait_stream(self.side)
        else:
            self.capture()
        self.done += 1

    def capture(self) -> None:
        """Record the step (nothing runs), then replay it for this step; on a failure, run the
        step eagerly from now on."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.buffers.run()
        except RuntimeError as error:
            log.warning("%s: its training step could not be captured as a CUDA graph (%s); "
                        "this epoch trains without one", self.describe, str(error).split("\n")[0])
            torch.cuda.synchronize()
            self.eager = True
            self.buffers.run()
            return
        self.graph = graph
        graph.replay()
