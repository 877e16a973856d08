"""Model selection as the reference code does it, and the optional early-stopping rules.

Per configuration the best epoch is the **first** one with the highest validation mAP (a
strict ``>``); the selected configuration is the first with the highest best-epoch validation
mAP, in grid order. Early stopping is off by default (the protocol); ``kim`` stops when
validation mAP falls more than 3 points below its best (Kim et al.'s code), ``zhou`` at the
first epoch that does not improve (Zhou et al.'s code).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from featcache.errors import OptionError

EARLY_STOP_RULES = ("none", "kim", "zhou")
VAL_VARIANTS = ("clean", "observed")
#: no validation data (the Python API's ``fit`` without ``eval_set``): keep the last epoch
LAST_EPOCH = "last"
#: Kim et al.'s rule: stop when validation mAP falls this many points below its best
KIM_DROP = 3.0

T = TypeVar("T")


def check_early_stop(rule: str) -> str:
    if rule not in EARLY_STOP_RULES:
        raise OptionError(f"--early-stop {rule!r}: choose one of {', '.join(EARLY_STOP_RULES)}")
    return rule


#: ``--val auto``: clean validation labels when the data has them, else the observed ones
AUTO = "auto"


def resolve_val_variant(variant: str, has_clean_val: bool, labels_path) -> tuple[str, str | None]:
    """(the validation labels to select by, a note saying why when it was chosen for the user).

    ``auto`` is ``clean`` when the validation split has clean labels and ``observed`` when it
    has only single positives (a single-positive CSV, ``--labels-only`` imports); an explicit
    ``clean`` on such data is refused (:func:`check_val_variant`).
    """
    if variant != AUTO:
        return check_val_variant(variant, has_clean_val, labels_path), None
    if has_clean_val:
        return "clean", None
    return "observed", (f"{labels_path} has no clean validation labels (single positives only): "
                        "selecting by validation mAP on the observed labels (--val observed)")


def check_val_variant(variant: str, has_clean_val: bool, labels_path) -> str:
    """Refuse clean validation on data that has no clean validation labels (say what to do).

    :data:`LAST_EPOCH` (no selection) is accepted too: the Python API uses it, the command
    line does not offer it.
    """
    if variant == LAST_EPOCH:
        return variant
    if variant not in VAL_VARIANTS:
        raise OptionError(f"--val {variant!r}: choose one of {AUTO}, {', '.join(VAL_VARIANTS)}")
    if variant == "clean" and not has_clean_val:
        raise OptionError(f"--val clean: {labels_path} has no clean validation labels (its "
                          "training labels are single positives), so validation mAP can only be "
                          "measured on the observed labels; use --val observed (or --val auto, "
                          "the default)")
    return variant


def selection_score(variant: str, clean: Tensor | None, observed: Tensor, epoch: int) -> Tensor:
    """The per-head score whose first maximum is the best epoch: validation mAP on the clean
    or the observed labels; with :data:`LAST_EPOCH`, the epoch number (the last epoch wins)."""
    if variant == LAST_EPOCH:
        return torch.full_like(observed, float(epoch))
    if variant != "clean":
        return observed
    assert clean is not None, "--val clean is refused without clean validation labels"
    return clean


def should_stop(rule: str, best: float | Tensor, current: float | Tensor,
                improved: bool | Tensor) -> bool | Tensor:
    """Whether a configuration stops after this epoch (elementwise for per-head tensors).

    ``best`` already includes this epoch; ``improved`` says whether this epoch set it.
    """
    if rule == "kim":
        return best - current > KIM_DROP
    if rule == "zhou":
        return torch.logical_not(improved) if isinstance(improved, Tensor) else not improved
    return torch.zeros_like(improved) if isinstance(improved, Tensor) else False


def select_first_best(items: Sequence[T], score: Callable[[T], float]) -> T:
    """The first item with the highest score (ties go to the earlier grid point)."""
    if not items:
        raise ValueError("nothing to select from")
    best = items[0]
    for item in items[1:]:
        if score(item) > score(best):
            best = item
    return best
