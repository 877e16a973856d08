"""Every option of ``featcache train-linear``, as given (``None``: decided by the data or the
device); :meth:`LinearOptions.validate` checks them before anything is loaded, as
``ExtractOptions.validate`` and ``FinetuneOptions.validate`` do for the other stages, and
:func:`featcache.linear.plan.plan_linear` resolves them once into the plan the command reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from featcache.errors import OptionError
from featcache.paths import check_name
from featcache.protocol.grid import BATCH_SIZES, LEARNING_RATES, LINEAR_EPOCHS, check_grid
from featcache.protocol.search_modes import check_search
from featcache.protocol.selection import check_early_stop


@dataclass(frozen=True)
class LinearOptions:
    """Every option of ``featcache train-linear``, as given."""

    dataset: str
    losses: str | Sequence[str] = "an-ls"
    learning_rates: Sequence[float] = LEARNING_RATES
    batch_sizes: Sequence[int] = BATCH_SIZES
    epochs: int = LINEAR_EPOCHS
    params: Mapping[str, Sequence[float]] = field(default_factory=dict)
    seeds: Sequence[int] = (0,)
    val_variant: str = "auto"
    early_stop: str = "none"
    backbone: str | None = None
    run_id: str | None = None
    jobs: int | None = None
    max_memory: str | int | None = None  # budget for the features and training state
    stream: bool = False  # stream the training features even when they fit the budget
    plots: bool = True
    progress: bool = True
    device: str = "auto"
    cache: str | None = None
    overwrite: bool = False
    pseudo_labels: str | None = None  # the pseudo-label set for the losses that need one
    search: str | None = None  # a search mode's name (None: the default one; protocol.search_modes)
    weight_decays: Sequence[float] | None = None  # a mode's that searches them (default: its grid)
    tensorboard: str | None = None  # log every run's curves there (protocol.tensorboard_log)

    def validate(self) -> None:
        """OptionError naming the first option that cannot be used (--run-id and --backbone as
        names, the grid, --early-stop, --search and --weight-decay); what needs the data
        (losses, parameters) is checked once the labels are read."""
        if self.run_id is not None:
            check_name(self.run_id, "--run-id")
        if self.backbone is not None:
            check_name(self.backbone, "--backbone")
        if len(set(self.seeds)) != len(self.seeds):
            raise OptionError(f"--seeds {','.join(map(str, self.seeds))} repeats a seed; give "
                              "each seed once")
        check_grid(self.learning_rates, self.batch_sizes)
        check_early_stop(self.early_stop)
        check_search(self.search, self.weight_decays)
