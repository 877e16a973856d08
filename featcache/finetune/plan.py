"""A fine-tuning run's configuration, resolved once: :class:`FinetunePlan`.

:func:`resolve_plan` turns the options as given (:class:`~featcache.finetune.options.
FinetuneOptions`), the data, the start point and the device into the one record every part of
the run reads: every loss parameter resolved (the options', the linear run's, the data's k or
its estimate, the defaults), the validation labels, the precision, the loader workers, the
grid and its schedule. What a resumed run must agree with (:meth:`FinetunePlan.identity`) and
the settings its fingerprint covers (:meth:`FinetunePlan.run_settings`) are views of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from featcache.errors import OptionError
from featcache.finetune.data import FinetuneData
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.start import StartPoint
from featcache.losses import loss_class
from featcache.protocol.grid import BATCH_SIZES, LEARNING_RATES, GridPoint, grid_points
from featcache.protocol.selection import check_early_stop
from featcache.runtime import (
    AUTOCAST_DTYPES,
    Ranks,
    default_batch_size,
    default_workers,
    describe_device,
    resolve_precision,
)


@dataclass(frozen=True)
class FinetunePlan:
    """What every configuration of a run shares: the options, resolved."""

    loss: str
    params: dict[str, float]  # every loss parameter, defaults included
    epochs: int = 10
    seed: int = 0
    head_lr_mult: float = 1.0
    val_variant: str = "clean"
    early_stop: str = "none"
    precision: str = "fp32"  # resolved: fp32, bf16 or fp16
    compile: bool = False
    workers: int = 0
    eval_batch_size: int = 32
    progress: bool = True  # progress bars and a line per epoch
    keep_checkpoints: str = "last"  # last, best or all (featcache.finetune.budget)
    bars: bool = True  # progress bars (off on all but one rank when ranks train alone)
    #: how estimated parameters were estimated (``--param k=estimate:M``), for results.json
    param_estimates: dict = field(default_factory=dict)
    learning_rates: tuple[float, ...] = LEARNING_RATES
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    schedule: str = "auto"  # under torchrun (featcache.finetune.search.plan_schedule)
    deterministic: bool = False  # deterministic GPU kernels

    def validate(self, device: torch.device) -> None:
        check_early_stop(self.early_stop)
        if self.precision not in ("fp32", *AUTOCAST_DTYPES):
            raise OptionError(f"--precision {self.precision!r}: choose auto, fp32, bf16 or fp16")
        if self.precision == "fp16" and device.type != "cuda":
            raise OptionError("--precision fp16 needs a GPU; on the CPU use fp32 or bf16")
        if self.epochs < 1 or self.head_lr_mult <= 0:
            raise OptionError("--epochs must be at least 1 and --head-lr-mult positive")

    def configs(self) -> list[GridPoint]:
        """The grid's configurations, in the reference's order."""
        return grid_points(self.learning_rates, self.batch_sizes)

    def identity(self) -> dict:
        """What a checkpoint must agree with to be resumed."""
        return {"loss": self.loss, "params": self.params, "epochs": self.epochs, "seed": self.seed,
                "head_lr_mult": self.head_lr_mult, "val_variant": self.val_variant,
                "early_stop": self.early_stop, "precision": self.precision}

    def run_settings(self, start: StartPoint, data: FinetuneData) -> dict:
        """What must not change when the run is resumed (its fingerprint is in run.json)."""
        init = {k: start.record.get(k) for k in ("mode", "run_dir", "best_pt_sha256")}
        return {
            "stage": "finetune", "dataset": data.dataset, "labels_sha256": data.labels.sha256,
            "init": init, "backbone": start.backbone,
            "weights_sha256": start.weights_identity.get("weights_sha256"),
            "image_size": start.image_size, "learning_rates": list(self.learning_rates),
            "batch_sizes": list(self.batch_sizes), **self.identity(),
            **({"preprocess": start.preprocess} if start.preprocess != "native" else {}),
            **({"pseudo_labels_sha256": data.pseudo_labels.sha256} if data.pseudo_labels else {}),
        }

    def machine(self, job: Ranks, schedule: Mapping[str, list[str]]) -> dict:
        """Where and how the run trained (``machine`` of results.json; ``schedule``: the
        configurations trained alone and together)."""
        return {"device": describe_device(job.device), "precision": self.precision,
                "compile": self.compile, "deterministic": self.deterministic,
                "world_size": job.world, "schedule": {"option": self.schedule, **schedule},
                "workers": self.workers, "eval_batch_size": self.eval_batch_size,
                "keep_checkpoints": self.keep_checkpoints}


def resolve_plan(options: FinetuneOptions, val_variant: str, start: StartPoint,
                 data: FinetuneData, job: Ranks) -> FinetunePlan:
    """The run's plan: ``options`` resolved on ``data`` from ``start`` on ``job``'s device
    (``val_variant``: resolved on the data); OptionError for what the device refuses."""
    params = loss_class(options.loss).resolve({**start.params, **options.params},
                                              facts=data.facts)
    plan = FinetunePlan(
        loss=options.loss, params=params.single(), param_estimates=params.estimates,
        epochs=options.epochs, seed=options.seed, head_lr_mult=options.head_lr_mult,
        val_variant=val_variant, early_stop=options.early_stop,
        precision=resolve_precision(options.precision, job.device), compile=options.compile,
        workers=(options.workers if options.workers is not None
                 else default_workers(job.device, job.local_world)),
        eval_batch_size=options.eval_batch_size or default_batch_size(job.device),
        progress=options.progress, keep_checkpoints=options.keep_checkpoints,
        learning_rates=tuple(options.learning_rates), batch_sizes=tuple(options.batch_sizes),
        schedule=options.schedule, deterministic=options.deterministic,
    )
    plan.validate(job.device)
    return plan
