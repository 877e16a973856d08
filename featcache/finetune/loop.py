"""Train one configuration (learning rate, batch size) end to end, epoch by epoch.

Per epoch: one pass over the training split in the seeded order with the seeded flips (the
last partial batch dropped), Adam steps on the network, the head (``--head-lr-mult`` times the
learning rate) and the loss's trainable state (ROLE's phi, ``lr_mult`` times); then the loss's
``end_epoch`` (APL, OPML-SP: predictions on the whole training split, eval mode, no flip);
then validation and test mAP on every example. The loss is computed in float32 from float32
logits whatever the autocast precision. After every epoch a checkpoint is written atomically;
a run resumed from it continues exactly as if it had never stopped (on the CPU bit for bit;
on a GPU up to cuDNN's non-deterministic kernels). Every step and evaluation batch checks for
a stop request (Ctrl-C, :mod:`featcache.interrupt`): the epoch in progress is abandoned and
``--resume`` continues after the last saved one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn
from tqdm import tqdm

from featcache.backbones import Uint8Normalize, backbone_spec, resolve_preprocess
from featcache.errors import FeatcacheError, Interrupted, OptionError, plural
from featcache.fileio import write_json_atomic
from featcache.finetune.checkpoint import (
    CHECKPOINT,
    HISTORY,
    keep_epoch_copy,
    load_checkpoint,
    read_history,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from featcache.finetune.data import (
    EpochBatches,
    FinetuneData,
    ImageSplit,
    bad_image_error,
    eval_batches,
    make_loader,
)
from featcache.finetune.distributed import (
    all_reduce_sum,
    check_same,
    gather_shards,
    sync_row_grad,
    sync_state_rows,
)
from featcache.finetune.masked_pass import masked_pass_views
from featcache.finetune.model import FinetuneNet, build_net
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.readout import LossReadout
from featcache.finetune.records import ConfigResult, EpochRecord
from featcache.finetune.start import StartPoint
from featcache.heads import HeadModule
from featcache.interrupt import check_stop
from featcache.losses import MaskedPassLoss, SPMLLoss, Targets, create_loss
from featcache.metrics import average_precision, mean_average_precision
from featcache.progress import progress, say
from featcache.protocol.grid import GridPoint
from featcache.protocol.seeds import derive_seed
from featcache.runtime import Ranks, autocast

#: torch.compile's backend (tests use "eager": the same graph capture and reuse, no codegen)
COMPILE_BACKEND = "inductor"


def compiled(module: nn.Module) -> nn.Module:
    """``torch.compile(module)``: a module again (an ``OptimizedModule``, which torch's type
    hints call a callable)."""
    return cast(nn.Module, torch.compile(module, backend=COMPILE_BACKEND))


class ConfigTrainer:
    """The network, loss state, optimizer and loaders of one configuration on one rank."""

    def __init__(self, config: GridPoint, settings: FinetunePlan, start: StartPoint,
                 data: FinetuneData, job: Ranks):
        self.config, self.settings, self.data, self.job = config, settings, data, job
        self.test_scores: Tensor | None = None  # the last evaluated epoch's test probabilities
        self.val_scores: Tensor | None = None  # and validation ones (label sets calibrate on them)
        self.device = device = job.device
        self.image_size = start.image_size
        self.preprocess = resolve_preprocess(start.backbone, start.preprocess)
        num_classes = data.num_classes
        spec = backbone_spec(start.backbone)
        dim = spec.dim
        self.loss: SPMLLoss = create_loss(settings.loss, num_classes, 1, params=settings.params,
                                          dataset=data.dataset, facts=data.facts)
        # a masked-pass loss (IGNORE) trains one configuration in one process and gets strong
        # views from the loader
        self.masked_pass = self.loss if isinstance(self.loss, MaskedPassLoss) else None
        if self.masked_pass is not None and job.world > 1:
            raise OptionError(f"loss {settings.loss!r} trains each configuration in one process "
                              "(its moving thresholds and the masks' normalisation are over the "
                              "whole batch): under torchrun pass --schedule per-gpu, or run "
                              "without torchrun")
        generator = None if start.head_weight is not None else torch.Generator().manual_seed(
            derive_seed(settings.seed, "finetune-head", config.name()))
        head = HeadModule.create(self.loss.head, dim, num_classes, self.loss.head_params(0),
                                 weight=start.head_weight, bias=start.head_bias,
                                 generator=generator)
        # channels_last: faster convolutions on GPUs (tensor cores) and on the CPU (oneDNN, ~10 %);
        # transformers gain nothing from it
        self.layout = torch.channels_last if spec.channels_last else torch.contiguous_format
        self.net: FinetuneNet = build_net(start.trunk, head).to(device).to(
            memory_format=self.layout)
        if device.type == "cuda" and job.world > 1:
            # batch statistics of the whole global batch, as in one process (GPU only in torch)
            self.net = nn.SyncBatchNorm.convert_sync_batchnorm(self.net)

        train = data.train
        self._init_state(start)

        self.model: nn.Module = self.net
        if job.world > 1:
            self.model = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[device.index] if device.type == "cuda" else None)
        self.eval_net: nn.Module = self.net
        if settings.compile:
            # Dynamo keys its graphs on FinetuneNet.forward's code and guards on the module's
            # structure, not its identity: the next configuration's network (same backbone,
            # same batch size) reuses these graphs instead of compiling again.
            self.model = compiled(self.model)
            self.eval_net = compiled(self.net)
        self.optimizer = self._optimizer()
        self.scaler = torch.amp.GradScaler(device.type, enabled=settings.precision == "fp16")
        self.sampler = EpochBatches(len(train), config.batch_size, settings.seed, flip=True,
                                    rank=job.rank, world=job.world,
                                    strong=self.masked_pass is not None)
        self.normalize = Uint8Normalize(start.backbone, self.preprocess).to(device)
        self.train_loader = make_loader(data, train, self.image_size, self.sampler,
                                        settings.workers, device, config.batch_size // job.world,
                                        persistent=True, ranks_here=job.local_world,
                                        preprocess=self.preprocess)

    def _init_state(self, start: StartPoint) -> None:
        """The training rows' labels on the device and the loss's per-example state (the
        state the optimizer trains, :attr:`learned`, with gradients)."""
        train, device, settings = self.data.train, self.device, self.settings
        self.observed = train.observed.to(device)
        self.clean = None if train.clean is None else train.clean.to(device)
        self.pseudo = None if train.pseudo is None else train.pseudo.to(device)
        generator = torch.Generator().manual_seed(
            derive_seed(settings.seed, "state", self.config.batch_size))
        state = self.loss.init_state(self.observed, self.clean, generator=generator,
                                     initial=start.initial_state())
        self.learned = self.loss.learned_state_lr_mults()
        self.state = {name: (t.detach().to(device).requires_grad_(True) if name in self.learned
                             else t.to(device)) for name, t in state.items()}

    def _optimizer(self) -> torch.optim.Adam:
        """Adam over the trunk, the head (``head_lr_mult`` times the rate) and learned state."""
        config, settings = self.config, self.settings
        head_params = list(self.net.head.parameters())
        groups = [
            {"params": list(self.net.trunk.parameters()), "lr": config.lr, "name": "backbone"},
            {"params": head_params, "lr": config.lr * settings.head_lr_mult, "name": "head"},
        ] + [{"params": [self.state[name]], "lr": config.lr * mults[0], "name": name}
             for name, mults in self.learned.items()]
        return torch.optim.Adam(groups, lr=config.lr, fused=fused_adam(self.device))

    # ------------------------------------------------------------------ steps
    def autocast(self) -> AbstractContextManager:
        return autocast(self.device, self.settings.precision)

    def to_input(self, images: Tensor) -> Tensor:
        x = self.normalize(images.to(self.device, non_blocking=True))
        return x.contiguous(memory_format=self.layout)

    def step(self, images: Tensor, index: Tensor, epoch: int,
             strong: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One optimisation step on a batch of uint8 ``images`` (host) whose training positions
        are ``index`` (already on the device); returns (loss, probabilities), detached.
        ``strong``: the batch's strong views (IGNORE).

        Nothing here waits for the device: the only host-to-device copy is the images' (pinned,
        asynchronous), and no Python branch depends on a value computed on the device
        (``tests/test_finetune_sync.py`` checks this with a counter of such calls).
        """
        targets = Targets(self.observed[index], index,
                          None if self.clean is None else self.clean[index],
                          None if self.pseudo is None else self.pseudo[index])
        if self.masked_pass is not None:
            logits = masked_pass_views(self.model, self.masked_pass, self.autocast,
                                       self.to_input(images),
                                       None if strong is None else self.to_input(strong), targets)
        else:
            with self.autocast():
                logits = self.model(self.to_input(images))
        loss = self.loss.forward(logits.float().unsqueeze(0), targets, self.state, epoch)[0]
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        for name in self.learned:
            sync_row_grad(self.state[name], index, self.job)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        sync_state_rows(self.state, set(self.learned), index, len(self.data.train), self.job)
        return loss.detach(), torch.sigmoid(logits.detach().float())

    def train_epoch(self, epoch: int) -> tuple[float, Tensor | None, float, int]:
        """(mean loss, running training predictions or None, seconds, images) of one epoch."""
        self.net.train()
        self.sampler.set_epoch(epoch)
        split, batch_size = self.data.train, self.config.batch_size
        running = (torch.full((len(split), self.data.num_classes), math.nan, device=self.device)
                   if self.clean is not None else None)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        steps = len(self.sampler)
        bar = self._bar(steps * batch_size, f"lr={self.config.lr:g} bs={batch_size} epoch "
                                            f"{epoch + 1}/{self.settings.epochs}")
        readout = LossReadout(self.device)
        # The epoch's positions go to the device once; each step takes its row from there.
        order = self.sampler.positions()
        order_on_device = order.to(self.device)
        started = time.perf_counter()
        for step, batch in enumerate(self.train_loader):
            images, positions, ok = batch[0], batch[-2], batch[-1]
            strong = batch[1] if len(batch) == 4 else None  # IGNORE's strong views
            check_stop()
            self._check_images(split, positions, ok)
            if not torch.equal(positions, order[step]):  # host tensors: no device wait
                raise FeatcacheError(f"the loader's batch {step} is not the sampler's (please "
                                     "report this)")
            index = order_on_device[step]
            loss, probs = self.step(images, index, epoch, strong)
            loss_sum += loss
            if running is not None:
                running[index] = probs
            bar.update(batch_size)
            if step % 25 == 0:
                shown = readout.update(loss)
                if shown is not None:
                    bar.set_postfix(loss=f"{shown:.4f}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        bar.close()
        loss_mean = float(all_reduce_sum(loss_sum, self.job)) / (steps * self.job.world)
        if running is not None and self.job.world > 1:
            seen = all_reduce_sum((~torch.isnan(running[:, 0])).float(), self.job) > 0
            running = all_reduce_sum(torch.nan_to_num(running), self.job)
            running[~seen] = math.nan
        return loss_mean, running, seconds, steps * batch_size

    @torch.no_grad()
    def predict(self, split: ImageSplit) -> Tensor:
        """Probabilities (n, L) on every example of ``split`` (eval mode, no flip), all ranks."""
        self.net.eval()
        batches = eval_batches(len(split), self.settings.eval_batch_size, self.job.rank,
                               self.job.world)
        loader = make_loader(self.data, split, self.image_size, batches, self.settings.workers,
                             self.device, self.settings.eval_batch_size,
                             ranks_here=self.job.local_world, preprocess=self.preprocess)
        bar = self._bar(len(split), f"predict {split.name}")
        parts = [torch.zeros(0, self.data.num_classes, device=self.device)]
        for images, positions, ok in loader:
            check_stop()
            self._check_images(split, positions, ok)
            with self.autocast():
                logits = self.eval_net(self.to_input(images))
            parts.append(torch.sigmoid(logits.float()))
            bar.update(len(positions) * self.job.world)
        bar.close()
        self.net.train()
        return gather_shards(torch.cat(parts), len(split), self.job)

    def run_epoch(self, epoch: int) -> tuple[EpochRecord, Tensor]:
        """Train one epoch, update the loss state, evaluate: the record and per-class test AP."""
        self.loss.begin_epoch(epoch, self.settings.epochs, self.state)
        loss, running, train_seconds, images = self.train_epoch(epoch)
        started = time.perf_counter()
        extra = self.loss.end_epoch(epoch, self.settings.epochs,
                                    lambda: self.predict(self.data.train).unsqueeze(0),
                                    self.state) or {}
        val, test = self.data.val, self.data.test
        val_probs = self.val_scores = self.predict(val)
        val_map = None if val.clean is None else _map(val_probs, val.clean)
        val_observed = _map(val_probs, (val.observed == 1).float())
        test_targets = test.clean if test.clean is not None else (test.observed == 1).float()
        self.test_scores = self.predict(test)  # best.pt keeps the best epoch's (write_best)
        test_ap = average_precision(self.test_scores, test_targets.to(self.device)).cpu()
        train_map = None
        if running is not None and self.clean is not None:
            seen = ~torch.isnan(running[:, 0])
            train_map = _map(running[seen], self.clean[seen])
        check_same({**self.state, "head": self.net.head.weight}, self.job)
        record = EpochRecord(
            epoch=epoch, train_loss=loss, val_map=val_map, val_map_observed=val_observed,
            test_map=float(test_ap.mean()) * 100.0, train_map=train_map,
            train_seconds=train_seconds, eval_seconds=time.perf_counter() - started,
            images_per_second=images / max(train_seconds, 1e-9),
            extra={k: (v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v)
                   for k, v in extra.items()},
        )
        return record, test_ap

    # ------------------------------------------------------------------ state
    def checkpoint(self, result: ConfigResult, identity: dict) -> dict:
        """Everything needed to continue after the last finished epoch."""
        return {
            "identity": identity, "epoch": len(result.epochs),
            "model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "state": {k: v.detach().cpu() for k, v in self.state.items()},
            "rng": rng_states(), "result": result.to_json(),
        }

    def restore(self, payload: dict) -> ConfigResult:
        """Load a checkpoint written by :meth:`checkpoint`; returns the history so far."""
        self.net.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scaler.load_state_dict(payload["scaler"])
        with torch.no_grad():
            for name, value in payload["state"].items():
                self.state[name].copy_(value)
        restore_rng_states(payload["rng"])
        return ConfigResult.from_json(payload["result"])

    def weights(self) -> dict:
        """The network's weights and the loss state, on the CPU (what best.pt keeps)."""
        return {"model": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                "state": {k: v.detach().cpu().clone() for k, v in self.state.items()}}

    # ------------------------------------------------------------------ helpers
    def _check_images(self, split: ImageSplit, positions: Tensor, ok: Tensor) -> None:
        if not bool(ok.all()):
            raise bad_image_error(self.data, split, int(positions[~ok][0]))

    def _bar(self, total: int, desc: str) -> tqdm:
        return progress(total=total, unit="img", desc=desc, leave=False, mininterval=1.0,
                        disable=not (self.settings.progress and self.settings.bars
                                     and self.job.is_main))


def fused_adam(device: torch.device) -> bool:
    """Adam's fused kernel on GPUs: one launch for all parameters and no host-side step count
    (the CPU keeps PyTorch's default implementation)."""
    return device.type == "cuda"


def _map(probs: Tensor, targets: Tensor) -> float:
    """mAP in percent (the reference's AP; a class without positives counts 0)."""
    return float(mean_average_precision(probs, targets.to(probs.device)))


def train_config(config: GridPoint, settings: FinetunePlan, start: StartPoint, data: FinetuneData,
                 job: Ranks, config_dir: Path, identity: dict,
                 on_best: Callable[[ConfigTrainer, ConfigResult], None]) -> ConfigResult:
    """Train (or resume, or reload) one configuration; ``on_best`` runs at each new best epoch."""
    finished = read_history(config_dir / HISTORY)
    if finished is not None:
        return ConfigResult.from_json(finished)
    trainer = ConfigTrainer(config, settings, start, data, job)
    result = ConfigResult(config)
    checkpoint_path = config_dir / CHECKPOINT
    if checkpoint_path.is_file():
        result = trainer.restore(load_checkpoint(checkpoint_path, identity))
    started = time.perf_counter() - result.seconds
    keep = settings.keep_checkpoints
    try:
        for epoch in range(len(result.epochs), settings.epochs):
            if result.stopped_at is not None:
                break
            record, test_ap = trainer.run_epoch(epoch)
            improved = result.add(record, test_ap, settings.val_variant)
            if improved:
                on_best(trainer, result)
            if settings.early_stop != "none" and result.should_stop(settings.early_stop, improved,
                                                                    settings.val_variant):
                result.stopped_at = epoch + 1
            result.seconds = time.perf_counter() - started
            _report(job, config, settings, record)
            if job.is_main and keep != "best":
                save_checkpoint(checkpoint_path, trainer.checkpoint(result, identity))
                if keep == "all":
                    keep_epoch_copy(checkpoint_path, epoch + 1)
    except Interrupted as exc:
        done = len(result.epochs)
        kept = (f"configuration {config.name()}: {done} of {plural(settings.epochs, 'epoch')} are saved"
                if keep != "best" else f"configuration {config.name()} starts over on --resume "
                "(--keep-checkpoints best keeps no checkpoint; finished configurations are kept)")
        raise exc.adding(kept) from None
    if job.is_main:
        write_json_atomic(config_dir / HISTORY, result.to_json())
        checkpoint_path.unlink(missing_ok=True)
    return result


def _report(job: Ranks, config: GridPoint, settings: FinetunePlan, record: EpochRecord) -> None:
    if not (job.is_main and settings.progress):
        return
    val = record.selection(settings.val_variant)
    say(f"{settings.loss} lr={config.lr:g} bs={config.batch_size} epoch {record.epoch + 1}/"
        f"{settings.epochs}: loss {record.train_loss:.4f}  val {val:.2f}  test "
        f"{record.test_map:.2f}  ({record.images_per_second:.1f} img/s)")
