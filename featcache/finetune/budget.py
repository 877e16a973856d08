"""What a fine-tuning run will cost, said before it starts: disk for its checkpoints, and time.

Sizes come from the network and the loss state themselves: a checkpoint holds the network
(parameters and buffers), Adam's two moments per trained tensor, and the loss's state (ROLE's
phi, with its own Adam moments); ``best.pt`` holds the network and the state. What stays on disk
depends on ``--keep-checkpoints``:

- ``last`` (default): the latest epoch's checkpoint of the configuration in training (what
  ``--resume`` continues from; dropped once the configuration is done) and the best weights;
- ``best``: only the best weights: no training checkpoint (an interrupted configuration starts
  over on ``--resume``; finished ones are kept);
- ``all``: every epoch's checkpoint of every configuration, and the best weights.

The time is measured, not guessed: training steps (forward, backward and Adam's step) of a copy
of the network at each batch size of the grid, and evaluation batches, on the run's own images
through the run's own DataLoader path (:func:`~featcache.finetune.data.make_loader`: decoding
and resizing in the same number of workers, one batch queued per worker so that a step waits
for decoding as a long run's steps do once the queue has drained); after :data:`WARMUP`
untimed steps (the CPU's first steps build kernels and are several times slower), the median
of up to :data:`TIMED` timed steps (each from asking the loader for its batch to the end of
the update), scaled to the grid. A probe at a smaller batch than the run's would overstate the
time: per image, small batches are slower. It ignores ``--compile``'s speed-up. When it is long
on a CPU the line says how to shorten it. Measured against the runs it announced (README,
``python -m benchmarks.finetune_estimate``).
"""

from __future__ import annotations

import copy
import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from featcache.backbones import Uint8Normalize, backbone_spec, resolve_preprocess
from featcache.errors import plural
from featcache.fileio import free_bytes, human_bytes, require_space
from featcache.finetune.data import EpochBatches, FinetuneData, eval_batches, make_loader
from featcache.finetune.model import build_net
from featcache.finetune.options import check_keep
from featcache.finetune.start import StartPoint
from featcache.heads import HeadKind, HeadModule
from featcache.losses import SPMLLoss, create_loss, loss_class
from featcache.runtime import autocast

#: untimed steps before the timed ones, and the most timed steps of a probe
WARMUP, TIMED = 2, 3
#: a probe stops timing once it has spent this many seconds (it keeps at least one step)
PROBE_SECONDS = 20.0
#: the most images of an evaluation probe's batch (per image, evaluation cost flattens out)
EVAL_PROBE_BATCH = 16
#: a CPU estimate above this many seconds says how to shorten the run
LONG_ON_CPU = 20 * 60
#: a run of at most this many training steps is not timed in advance: the probes (a copy of
#: the network, WARMUP + TIMED training and evaluation steps per batch size) would cost a
#: large share of the run itself (the demo's one configuration x one epoch is 15 steps)
SHORT_RUN_STEPS = 4 * (WARMUP + TIMED)


@dataclass
class Budget:
    """A run's disk and time, before it starts."""

    configs: int
    epochs: int
    keep: str
    checkpoint_bytes: int
    best_bytes: int
    seconds: float | None = None
    #: the run's training steps when it is too short to be timed in advance (else None)
    short_steps: int | None = None
    #: for the advice of a long CPU run
    device: str = "cpu"
    image_size: int | None = None
    dataset: str = "DATASET"

    @property
    def peak_bytes(self) -> int:
        """The most the run keeps on disk at once (a file being replaced exists twice)."""
        best = 2 * self.best_bytes
        if self.keep == "best":
            return best
        if self.keep == "all":
            return best + (self.configs * self.epochs + 1) * self.checkpoint_bytes
        return best + 2 * self.checkpoint_bytes

    def line(self, free: int) -> str:
        kept = {"last": "the latest epoch's checkpoint and the best weights",
                "best": "only the best weights (no checkpoint: an interrupted configuration "
                        "restarts on --resume)",
                "all": "every epoch's checkpoint and the best weights"}[self.keep]
        time_part = "" if self.seconds is None else (
            f"; about {human_seconds(self.seconds)} (measured on a few steps with their image "
            "decoding)" + self.shorten_advice())
        if self.short_steps is not None:
            time_part = (f"; a short run ({plural(self.short_steps, 'training step')}), not "
                         "timed in advance (timing it would cost a good part of it)")
        return (f"fine-tuning {plural(self.configs, 'configuration')} x {plural(self.epochs, 'epoch')}: "
                f"checkpoints {human_bytes(self.checkpoint_bytes)} each, best.pt "
                f"{human_bytes(self.best_bytes)}; --keep-checkpoints {self.keep} keeps {kept}: at "
                f"most {human_bytes(self.peak_bytes)} on disk, {human_bytes(free)} free"
                f"{time_part}")


    def shorten_advice(self) -> str:
        """How to shorten a long CPU run: fewer configurations, smaller images."""
        if self.seconds is None or self.device != "cpu" or self.seconds < LONG_ON_CPU:
            return ""
        parts = []
        if self.configs > 1:
            parts.append(f"one configuration (e.g. --lr 1e-4 --batch-size 16): about "
                         f"{human_seconds(self.seconds / self.configs)}")
        if self.image_size and self.image_size > 224:
            ratio = (224 / self.image_size) ** 2
            share = "a quarter" if abs(ratio - 0.25) < 0.02 else f"{ratio:.0%}"
            parts.append(f"smaller images: about {share} of the time at --image-size 224 (with "
                         f"LinearInit the linear run must use such features: `featcache features "
                         f"--dataset {self.dataset} --image-size 224`, then train-linear)")
        parts.append("or a GPU")
        return ". This is long on a CPU; to shorten it: " + "; ".join(parts)


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def plan_budget(start: StartPoint, data: FinetuneData, loss_name: str, params: dict,
                configs: int, epochs: int, keep: str) -> Budget:
    """Checkpoint and best.pt sizes of this network and loss (no time yet)."""
    check_keep(keep)
    dim = backbone_spec(start.backbone).dim
    classes = data.num_classes
    trunk_params = tensor_bytes(start.trunk.parameters())
    trunk_buffers = tensor_bytes(start.trunk.buffers())
    head = (dim + 1) * classes * 4
    network = trunk_params + trunk_buffers + head
    loss = create_loss(loss_name, classes, 1, params=params, dataset=data.dataset,
                       facts=data.facts)
    state = _loss_state(loss, data, start)
    learned = tensor_bytes(t for name, t in state.items() if name in loss.learned_state_lr_mults())
    state_bytes = tensor_bytes(state.values())
    checkpoint = network + 2 * (trunk_params + head) + state_bytes + 2 * learned + (64 << 10)
    best = network + state_bytes + (64 << 10)
    return Budget(configs, epochs, keep, checkpoint, best)


def check_disk(budget: Budget, run_dir: Path, say: Callable[[str], None]) -> None:
    """Say the budget, and refuse now when the disk cannot hold the run's checkpoints."""
    free = free_bytes(run_dir)
    say(budget.line(free))
    largest = budget.best_bytes if budget.keep == "best" else budget.checkpoint_bytes
    require_space(run_dir, budget.peak_bytes,
                  f"for the checkpoints of this run (--keep-checkpoints {budget.keep}; "
                  "--keep-checkpoints best needs the least)", largest)


def training_steps(train_rows: int, batch_sizes: Sequence[int], epochs: int) -> int:
    """Steps of a run's configurations (one batch size each), the last partial batch dropped."""
    return sum(train_rows // batch for batch in batch_sizes) * epochs


def measure_seconds(start: StartPoint, data: FinetuneData, loss: str,
                    batch_sizes: Sequence[int], eval_batch_size: int, precision: str,
                    device: torch.device, workers: int = 0) -> float:
    """Seconds of compute for one epoch of each configuration (one batch size each), summed
    (see the module docstring). Each probe runs once, however many configurations share it."""
    probes: dict[tuple[int, bool], float] = {}

    def seconds_per_image(batch: int, train: bool) -> float:
        key = (batch if train else min(batch, EVAL_PROBE_BATCH), train)
        if key not in probes:
            probes[key] = _probe(start, data, device, precision, key[0], train=train,
                                 workers=workers)
        return probes[key]

    evaluated = len(data.val) + len(data.test)
    if loss_class(loss).end_epoch is not SPMLLoss.end_epoch:
        evaluated += len(data.train)  # the loss predicts on the training split after each epoch
    eval_each = seconds_per_image(eval_batch_size, train=False)
    return sum((len(data.train) // batch) * batch * seconds_per_image(batch, train=True)
               + evaluated * eval_each for batch in batch_sizes)


def human_seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, math.ceil(seconds))} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _loss_state(loss: SPMLLoss, data: FinetuneData, start: StartPoint) -> dict:
    generator = torch.Generator().manual_seed(0)
    clean = data.train.clean
    return loss.init_state(data.train.observed, clean, generator=generator,
                           initial=start.initial_state())


def _probe_loader(start: StartPoint, data: FinetuneData, device: torch.device, batch: int,
                  train: bool, workers: int) -> DataLoader:
    """The first :data:`WARMUP` + :data:`TIMED` batches of a training epoch (or of the
    validation split) through the run's own loader, one batch queued per worker."""
    steps = WARMUP + TIMED
    if train:
        split = data.train
        batches: list = list(itertools.islice(EpochBatches(len(split), batch, seed=0), steps))
    else:
        split = data.val if len(data.val) else data.test
        batches = eval_batches(len(split), batch)[:steps]
    preprocess = resolve_preprocess(start.backbone, start.preprocess)
    return make_loader(data, split, start.image_size, batches, workers, device, batch,
                       preprocess=preprocess, prefetch=1)


def _probe(start: StartPoint, data: FinetuneData, device: torch.device, precision: str,
           batch: int, train: bool, workers: int = 0) -> float:
    """Seconds per image of a training step (forward, backward, Adam's step) or an evaluation
    forward at ``batch`` images, each timed from asking the loader for its batch: the median
    of the timed steps after the warm-up ones."""
    dim = backbone_spec(start.backbone).dim
    generator = torch.Generator().manual_seed(0)  # never the global generators: numbers unchanged
    net = build_net(copy.deepcopy(start.trunk),
                    HeadModule.create(HeadKind.LINEAR, dim, data.num_classes, generator=generator))
    layout = torch.channels_last if backbone_spec(start.backbone).channels_last else None
    # torch's stubs lack the (device, memory_format) form that Module.to takes
    net = net.to(device, memory_format=layout or torch.contiguous_format).train(  # type: ignore[call-overload]
        train)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-12) if train else None
    normalize = Uint8Normalize(start.backbone,
                               resolve_preprocess(start.backbone, start.preprocess)).to(device)
    timings: list[float] = []
    spent, last = 0.0, math.nan
    batches = iter(_probe_loader(start, data, device, batch, train, workers))
    for step in range(WARMUP + TIMED):
        tick = time.perf_counter()
        images = next(batches, None)
        if images is None:  # a split smaller than the probe: what was timed is enough
            break
        x = normalize(images[0].to(device))
        if layout is not None:
            x = x.contiguous(memory_format=layout)
        with torch.set_grad_enabled(train), autocast(device, precision):
            logits = net(x)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
            torch.sigmoid(logits.float()).mean().backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - tick
        spent += seconds
        last = seconds / len(images[0])
        if step >= WARMUP:
            timings.append(last)
        if spent > PROBE_SECONDS and (timings or step >= 1):
            break
    return statistics.median(timings or [last])  # a probe cut short keeps its last step
