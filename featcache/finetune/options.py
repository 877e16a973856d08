"""Every option of ``featcache finetune``, as given (``None``: decided by the start point or the
device); :meth:`FinetuneOptions.validate` checks them before anything is loaded, as the other
stages' options do, and :func:`featcache.finetune.plan.resolve_plan` resolves them once into
the :class:`~featcache.finetune.plan.FinetunePlan` the run reads. The choices of ``--schedule``
and ``--keep-checkpoints`` are declared here, the lowest module of the stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from featcache.errors import OptionError
from featcache.losses import loss_class
from featcache.protocol.grid import BATCH_SIZES, FINETUNE_EPOCHS, LEARNING_RATES, check_grid

#: ``--schedule`` (:func:`featcache.finetune.search.plan_schedule`)
SCHEDULES = ("auto", "ddp", "per-gpu")
#: ``--keep-checkpoints`` (:mod:`featcache.finetune.budget`)
KEEP_CHECKPOINTS = ("last", "best", "all")


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise OptionError(f"--schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    return schedule


def check_keep(keep: str) -> str:
    if keep not in KEEP_CHECKPOINTS:
        raise OptionError(f"--keep-checkpoints {keep!r}: choose one of {', '.join(KEEP_CHECKPOINTS)}")
    return keep


@dataclass(frozen=True)
class FinetuneOptions:
    """What the user asked for."""

    dataset: str
    loss: str
    init: str = "best"
    learning_rates: Sequence[float] = LEARNING_RATES
    batch_sizes: Sequence[int] = BATCH_SIZES
    epochs: int = FINETUNE_EPOCHS
    head_lr_mult: float = 1.0
    params: Mapping[str, float] = field(default_factory=dict)
    linear_lr: float | None = None
    linear_batch_size: int | None = None
    backbone: str | None = None
    weights: str | None = None
    image_size: int | None = None
    preprocess: str = "native"  # --init none only; LinearInit takes its features' transform
    pseudo_labels: str | None = None  # the pseudo-label set for the losses that need one
    precision: str = "auto"
    compile: bool = False
    schedule: str = "auto"
    deterministic: bool = False
    workers: int | None = None
    eval_batch_size: int | None = None
    val_variant: str = "auto"
    early_stop: str = "none"
    seed: int = 0
    device: str = "auto"
    images_root: str | None = None
    run_id: str | None = None
    resume: bool = False
    overwrite: bool = False
    keep_checkpoints: str = "last"
    plots: bool = True
    progress: bool = True
    cache: str | None = None
    tensorboard: str | None = None  # log the run's curves there (protocol.tensorboard_log)

    def validate(self) -> None:
        """OptionError naming the first option that cannot be used (an unknown loss first,
        before anything is loaded); what needs the device or the data is checked once they
        are known (:func:`~featcache.finetune.plan.resolve_plan`, the start point)."""
        loss_class(self.loss)
        check_grid(self.learning_rates, self.batch_sizes)
        check_schedule(self.schedule)
        check_keep(self.keep_checkpoints)
