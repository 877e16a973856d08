"""The fine-tuning grid (learning rates x batch sizes) and the selection by validation mAP.

Configurations run one after another in the reference's order (batch sizes outer, learning
rates inner), each from the same start point. Selection follows stage two: per configuration
the first epoch with the highest validation mAP, then the configuration with the highest
(ties go to the earlier one). The weights of the best epoch seen so far are kept in the run's
``best.pt``, rewritten atomically whenever an epoch beats it, so they are never lost and
never held in memory for every configuration.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from featcache.backbones import transform_description
from featcache.errors import FeatcacheError
from featcache.fileio import atomic_output
from featcache.finetune.data import FinetuneData
from featcache.finetune.loop import ConfigResult, ConfigTrainer, Settings, train_config
from featcache.finetune.start import StartPoint
from featcache.losses import loss_class
from featcache.protocol.grid import GridPoint
from featcache.protocol.selection import select_first_best
from featcache.runtime import Ranks

BEST = "best.pt"
MODEL_FORMAT = "featcache-finetune-model"
#: 2: ``params`` holds every loss parameter; ``handoff`` the loss's hand-off state
MODEL_FORMAT_VERSION = 2


@dataclass
class GridResult:
    configs: list[ConfigResult]
    selected: ConfigResult
    seconds: float


def run_grid(configs: Sequence[GridPoint], settings: Settings, start: StartPoint,
             data: FinetuneData, job: Ranks, run_dir: Path) -> GridResult:
    """Train (or resume) every configuration and select one; best.pt holds its best epoch."""
    started = time.perf_counter()
    best_val = -math.inf
    about = model_description(settings, start, data)

    def on_best(trainer: ConfigTrainer, result: ConfigResult) -> None:
        nonlocal best_val
        if result.best_val > best_val:
            best_val = result.best_val
            if job.is_main:
                write_best(run_dir / BEST, trainer, result, about)

    results = []
    for config in configs:
        identity = {"config": config.name(), **settings.identity()}
        result = train_config(config, settings, start, data, job,
                              run_dir / "configs" / config.name(), identity, on_best)
        best_val = max(best_val, result.best_val)
        results.append(result)
    selected = select_first_best(results, lambda r: r.best_val)
    if job.is_main and not (run_dir / BEST).is_file():
        raise FeatcacheError(f"{run_dir / BEST} is missing (deleted while the run was paused?); "
                             "start the run again without --resume")
    return GridResult(results, selected, time.perf_counter() - started)


def model_description(settings: Settings, start: StartPoint, data: FinetuneData) -> dict:
    """What best.pt says about itself besides the weights."""
    return {
        "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION, "dataset": data.dataset,
        "loss": settings.loss,
        "params": settings.params, "classes": list(data.classes), "backbone": start.backbone,
        "weights": start.weights_identity, "image_size": start.image_size,
        "transform": transform_description(start.image_size, start.backbone),
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
    }
    with atomic_output(path, overwrite=True) as tmp:
        torch.save(payload, tmp)
