"""The protocol's grid: learning rates x batch sizes (x loss-parameter axes), and its defaults.

PROTOCOL.md section 2: Adam, learning rate in {1e-2, 1e-3, 1e-4, 1e-5} x batch size in {8, 16};
25 epochs for linear heads, 10 for fine-tuning. Grid points are ordered as the reference code
loops: batch sizes outer, learning rates inner (then loss-parameter values); ties in the
selection go to the earlier point.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from featcache.errors import OptionError
from featcache.losses import ResolvedParams

LEARNING_RATES = (1e-2, 1e-3, 1e-4, 1e-5)
BATCH_SIZES = (8, 16)
LINEAR_EPOCHS = 25
FINETUNE_EPOCHS = 10

#: LinearInit's fixed linear-phase hyperparameters (Cole et al.):
#: loss -> (learning rate, batch size, per-dataset batch size)
LINEARINIT: dict[str, tuple[float, int, dict[str, int]]] = {
    "an-ls": (1e-4, 8, {"nuswide": 16}),
    "role": (1e-3, 16, {"cub": 8}),
}


@dataclass(frozen=True)
class GridPoint:
    """One configuration: learning rate, batch size, seed and every loss parameter's value.

    ``chosen`` names the parameters the user or the data set (not defaults); with the learning
    rate and batch size they seed the head's initialisation (:meth:`key`).
    """

    lr: float
    batch_size: int
    seed: int = 0
    params: tuple[tuple[str, float], ...] = ()
    chosen: tuple[str, ...] = ()
    weight_decay: float = 0.0  # decoupled (AdamW's); the protocol has none

    @property
    def param_dict(self) -> dict[str, float]:
        return dict(self.params)

    def key(self) -> str:
        """A canonical text for this configuration (it seeds the head's initialisation).

        The text is the one featcache has always used ("bsize", chosen parameters only), so
        that a seed keeps giving the same numbers.
        """
        params = ",".join(f"{k}={v!r}" for k, v in self.params if k in self.chosen)
        decay = f"|wd={self.weight_decay!r}" if self.weight_decay else ""
        return f"lr={self.lr!r}|bsize={self.batch_size}|{params}{decay}"

    def name(self) -> str:
        """A directory-safe name, e.g. ``lr0.0001-bs16`` (``-wd0.01`` with weight decay)."""
        decay = f"-wd{self.weight_decay:g}" if self.weight_decay else ""
        return f"lr{self.lr:g}-bs{self.batch_size}{decay}"


def grid_points(learning_rates: Sequence[float], batch_sizes: Sequence[int], seed: int = 0,
                params: ResolvedParams | None = None, weight_decays: Sequence[float] = (0.0,),
                lr_reference_batch: int | None = None) -> list[GridPoint]:
    """Every configuration of one seed, in the reference's order (batch sizes outer, learning
    rates inner, then weight decays, then the loss-parameter axes in name order).

    With ``lr_reference_batch`` (the linear-probe search's scaling rule), the learning rates
    are given for that batch size and each point trains at ``lr x batch size / reference``.
    """
    params = params or ResolvedParams()
    names = sorted(params.values)
    combos = list(itertools.product(*(params.values[n] for n in names))) or [()]
    chosen = tuple(params.chosen())
    return [
        GridPoint(lr=scaled_lr(lr, batch_size, lr_reference_batch), batch_size=int(batch_size),
                  seed=int(seed),
                  params=tuple(zip(names, (float(v) for v in combo), strict=True)), chosen=chosen,
                  weight_decay=float(decay))
        for batch_size in batch_sizes for lr in learning_rates for decay in weight_decays
        for combo in combos
    ]


def scaled_lr(lr: float, batch_size: int, reference_batch: int | None) -> float:
    """``lr`` itself, or with a reference batch size ``lr x batch_size / reference_batch``
    (DINOv2's linear evaluation: learning rates are given for batch 256)."""
    if reference_batch is None:
        return float(lr)
    return float(lr) * int(batch_size) / int(reference_batch)


def check_grid(learning_rates: Sequence[float], batch_sizes: Sequence[int]) -> None:
    """Refuse an empty grid, a non-positive learning rate or batch size (naming the option)."""
    if not learning_rates or any(not lr > 0 for lr in learning_rates):
        raise OptionError(f"--lr needs positive learning rates, got {list(learning_rates)}")
    if not batch_sizes or any(int(b) < 1 for b in batch_sizes):
        raise OptionError(f"--batch-size needs positive batch sizes, got {list(batch_sizes)}")


def linearinit_hparams(loss: str, dataset: str, lr: float | None,
                       batch_size: int | None) -> tuple[float, int]:
    """LinearInit's linear phase (lr, batch size): the given values, else the published ones."""
    if loss in LINEARINIT:
        default_lr, default_batch, by_dataset = LINEARINIT[loss]
        return (default_lr if lr is None else lr,
                by_dataset.get(dataset, default_batch) if batch_size is None else batch_size)
    if lr is None or batch_size is None:
        raise OptionError(
            f"there is no finished linear {loss!r} run to start from, and LinearInit's fixed "
            f"linear hyperparameters are published only for {', '.join(LINEARINIT)}: "
            "pass --linear-lr and --linear-batch-size to train the linear phase first, train a "
            f"run with `featcache train-linear --loss {loss}`, or use --init none"
        )
    return lr, batch_size
