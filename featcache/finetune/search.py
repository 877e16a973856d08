"""The fine-tuning grid (learning rates x batch sizes) and the selection by validation mAP.

Configurations run in the reference's order (batch sizes outer, learning rates inner), each
from the same start point. Selection follows stage two: per configuration the first epoch with
the highest validation mAP, then the configuration with the highest (ties go to the earlier
one). The weights of the best epoch seen so far are kept in the run's ``best.pt``, rewritten
atomically whenever an epoch beats it, so they are never lost and never held in memory for
every configuration.

Under ``torchrun`` a configuration is trained either by every rank together (DDP: the global
batch is split among the GPUs) or by one rank alone, several configurations at once
(:func:`plan_schedule`). The protocol's batches of 8 and 16 would leave DDP 2 to 8 images per
GPU, where gradient all-reduce and SyncBatchNorm cost more than they save; a GPU per
configuration trains the grid in about 1/N of the time. A configuration trained alone keeps
its best epoch in ``configs/<name>/best.pt``; at the end the selected one becomes the run's
``best.pt`` and the others are deleted. Either way a configuration's numbers are those of a
one-process run (DDP up to its inherent differences, ``docs/finetune.md``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featcache.backbones import transform_description
from featcache.errors import FeatcacheError, OptionError
from featcache.fileio import save_torch_atomic
from featcache.finetune.data import FinetuneData
from featcache.finetune.distributed import share_results
from featcache.finetune.loop import ConfigTrainer, train_config
from featcache.finetune.options import check_schedule
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.records import ConfigResult
from featcache.finetune.start import StartPoint
from featcache.losses import loss_class
from featcache.protocol.grid import GridPoint
from featcache.protocol.selection import select_first_best
from featcache.runtime import Ranks, single_process

BEST = "best.pt"
MODEL_FORMAT = "featcache-finetune-model"
#: 2: ``params`` holds every loss parameter; ``handoff`` the loss's hand-off state
MODEL_FORMAT_VERSION = 2


@dataclass
class GridResult:
    configs: list[ConfigResult]
    selected: ConfigResult
    seconds: float
    #: configuration names trained by one rank alone, and by all ranks together
    schedule: dict[str, list[str]] = field(default_factory=dict)


#: ``--schedule auto``: DDP only when every GPU gets at least this many images of each batch
DDP_MIN_PER_GPU = 32


def plan_schedule(configs: Sequence[GridPoint], job: Ranks,
                  schedule: str = "auto") -> tuple[list[GridPoint], list[GridPoint]]:
    """(configurations each trained by one rank alone, configurations trained by all ranks).

    ``ddp``: all together. ``per-gpu``: each alone, rank r taking the r-th, (r+N)-th, ...
    ``auto``: alone when the batch would leave fewer than :data:`DDP_MIN_PER_GPU` images per
    GPU. Ranks share the run folder, so training alone needs every rank on one machine;
    ``auto`` falls back to DDP across machines.
    """
    check_schedule(schedule)
    configs = list(configs)
    if job.world == 1 or schedule == "ddp":
        return [], configs
    one_machine = job.local_world == job.world
    if schedule == "per-gpu":
        if not one_machine:
            raise OptionError("--schedule per-gpu needs every rank on one machine (the ranks "
                              "share the run folder); use --schedule ddp across machines")
        return configs, []
    if not one_machine:
        return [], configs
    alone = [c for c in configs if c.batch_size // job.world < DDP_MIN_PER_GPU]
    return alone, [c for c in configs if c not in alone]


def run_grid(configs: Sequence[GridPoint], plan: FinetunePlan, start: StartPoint,
             data: FinetuneData, job: Ranks, run_dir: Path,
             schedule: str = "auto") -> GridResult:
    """Train (or resume) every configuration and select one; best.pt holds its best epoch."""
    started = time.perf_counter()
    about = model_description(plan, start, data)
    alone, together = plan_schedule(configs, job, schedule)
    results: dict[GridPoint, ConfigResult] = {}
    if alone:
        results.update(_train_alone(alone, plan, start, data, job, run_dir, about))
    best_val = -math.inf

    def on_best(trainer: ConfigTrainer, result: ConfigResult) -> None:
        nonlocal best_val
        if result.best_val > best_val:
            best_val = result.best_val
            if job.is_main:
                write_best(run_dir / BEST, trainer, result, about)

    for config in together:
        result = train_config(config, plan, start, data, job, _config_dir(run_dir, config),
                              _identity(config, plan), on_best)
        best_val = max(best_val, result.best_val)
        results[config] = result
    ordered = [results[config] for config in configs]
    selected = select_first_best(ordered, lambda r: r.best_val)
    if job.is_main:
        _settle_best(run_dir, selected.config, alone)
        if not (run_dir / BEST).is_file():
            raise FeatcacheError(f"{run_dir / BEST} is missing (deleted while the run was paused?); "
                                 "start the run again without --resume")
    return GridResult(ordered, selected, time.perf_counter() - started,
                      schedule={"alone": [c.name() for c in alone],
                                "together": [c.name() for c in together]})


def _config_dir(run_dir: Path, config: GridPoint) -> Path:
    return run_dir / "configs" / config.name()


def _identity(config: GridPoint, plan: FinetunePlan) -> dict:
    return {"config": config.name(), **plan.identity()}


def _train_alone(configs: list[GridPoint], plan: FinetunePlan, start: StartPoint,
                 data: FinetuneData, job: Ranks, run_dir: Path,
                 about: dict) -> dict[GridPoint, ConfigResult]:
    """Each rank trains its share of ``configs`` on its own device; every rank gets all results."""
    mine = configs[job.rank::job.world]
    # a world of one that still knows how many ranks share this machine (for /dev/shm)
    alone = dataclasses.replace(single_process(job.device), local_world=job.local_world)
    # Only rank 0 draws progress bars (the others still print a line per epoch).
    quiet = dataclasses.replace(plan, bars=plan.bars and job.is_main)

    def train_mine() -> dict[str, dict]:
        done = {}
        for config in mine:
            config_dir = _config_dir(run_dir, config)

            def on_best(trainer: ConfigTrainer, result: ConfigResult,
                        config_dir: Path = config_dir) -> None:
                write_best(config_dir / BEST, trainer, result, about)

            done[config.name()] = train_config(config, quiet, start, data, alone, config_dir,
                                               _identity(config, plan), on_best).to_json()
        return done

    records = share_results(job, train_mine)
    results = {}
    for config in configs:
        results[config] = ConfigResult.from_json(records[config.name()])
        results[config].config = config
    return results


def _settle_best(run_dir: Path, selected: GridPoint, alone: list[GridPoint]) -> None:
    """Make the selected configuration's best epoch the run's best.pt; drop the others'."""
    for config in alone:
        path = _config_dir(run_dir, config) / BEST
        if config == selected and path.is_file():
            os.replace(path, run_dir / BEST)
        else:
            path.unlink(missing_ok=True)


def model_description(plan: FinetunePlan, start: StartPoint, data: FinetuneData) -> dict:
    """What best.pt says about itself besides the weights."""
    return {
        "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "dataset": data.dataset,
        "loss": plan.loss,
        "params": plan.params, "classes": list(data.classes), "backbone": start.backbone,
        "weights": start.weights_identity, "image_size": start.image_size,
        "transform": transform_description(start.image_size, start.backbone,
                                           preprocess=start.preprocess),
        "labels_sha256": data.labels.sha256, "train_rows": data.train_rows.tolist(),
        "init": start.record.get("mode"),
    }


def write_best(path: Path, trainer: ConfigTrainer, result: ConfigResult, about: dict) -> None:
    """Save the best epoch so far: network (trunk.* and head.*), phi and the other label state."""
    weights = trainer.weights()
    state = weights["state"]
    handoff = loss_class(about["loss"]).handoff_state
    best = result.best
    payload = {
        **about, "lr": result.config.lr, "batch_size": result.config.batch_size,
        "epoch": best.epoch + 1, "val_map": best.val_map, "val_map_observed": best.val_map_observed,
        "test_map": best.test_map, "model": weights["model"],
        "handoff": {k: v[0] for k, v in state.items() if k in handoff},
        "label_state": {k: v[0] for k, v in state.items() if k not in handoff},
        # the test probabilities of this epoch: the run's test-scores.h5 (finetune.outputs)
        "test_scores": None if trainer.test_scores is None else trainer.test_scores.float().cpu(),
        # and the validation ones: the run's val-scores.h5, what label sets calibrate on
        "val_scores": None if trainer.val_scores is None else trainer.val_scores.float().cpu(),
    }
    save_torch_atomic(path, payload)
