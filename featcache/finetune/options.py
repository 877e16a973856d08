"""Every option of ``featcache finetune``, as given (``None``: decided by the start point or the
device); :meth:`FinetuneOptions.validate` checks them before anything is loaded, as the other
stages' options do; :class:`featcache.finetune.loop.Settings` holds what they resolve to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from featcache.protocol.grid import BATCH_SIZES, FINETUNE_EPOCHS, LEARNING_RATES


@dataclass
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
        are known (``Settings.validate``, the start point)."""
        from featcache.errors import OptionError
        from featcache.finetune.budget import check_keep
        from featcache.finetune.search import SCHEDULES
        from featcache.losses import loss_class
        from featcache.protocol.grid import check_grid

        loss_class(self.loss)
        check_grid(self.learning_rates, self.batch_sizes)
        if self.schedule not in SCHEDULES:
            raise OptionError(f"--schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        check_keep(self.keep_checkpoints)
