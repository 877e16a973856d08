"""Zhou et al. (ECCV 2022): entropy maximisation (EM), asymmetric pseudo-labelling (APL), and
their entropy-minimisation baseline (EntMin).

On probabilities with the 1e-5 guard, as their code: H(f) = f neglog(f) + (1-f) neglog(1-f).
Observed negatives (z=-1, only with --num-neg) are known negatives: neglog(1-f).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.params import epoch_count, non_negative, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import (
    binary_entropy,
    matrix_mean,
    neglog,
    select_per_class,
    soft_bce,
    where_mask,
)

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 20

ZHOU = "Zhou et al. ECCV 2022"
ZHOU_PAPER = "Acknowledging the Unknown for Multi-label Learning with Single Positive Labels"

#: EM's alpha per dataset (the reference train.py; generic 0.1)
EM_ALPHA = {"voc": 0.2, "coco": 0.1, "nuswide": 0.1, "cub": 0.01}

#: APL's (alpha, beta, theta, warmup) per dataset (the reference train.py)
APL_DEFAULTS = {
    "voc": {"alpha": 0.2, "beta": 0.02, "theta": 0.9, "warmup": 5},
    "coco": {"alpha": 0.1, "beta": 0.9, "theta": 0.9, "warmup": 5},
    "nuswide": {"alpha": 0.1, "beta": 0.2, "theta": 0.9, "warmup": 4},
    "cub": {"alpha": 0.01, "beta": 0.4, "theta": 0.9, "warmup": 3},
}

ALPHA = non_negative(0.1, "weight of the entropy term on unobserved labels")


def entropy_matrix(probs: Tensor, observed: Tensor, unobserved_weight: Tensor | float) -> Tensor:
    """z=1 neglog(f); z=0 ``unobserved_weight * H(f)``; z=-1 neglog(1-f)."""
    others = torch.where(observed == 0, unobserved_weight * binary_entropy(probs),
                         where_mask(observed == -1, neglog(1.0 - probs)))
    return torch.where(observed == 1, neglog(probs), others)


@register_loss
class EntropyMaximization(SPMLLoss):
    """``em``: z=1 neglog(f); z=0 -alpha H(f) (training maximises the entropy of unknowns)."""

    name = "em"
    summary = "Entropy maximisation on unobserved labels: z=0 term -alpha*H(f)."
    reference = ZHOU
    paper = ZHOU_PAPER
    year = 2022
    params = {"alpha": ALPHA}
    dataset_defaults = {name: {"alpha": alpha} for name, alpha in EM_ALPHA.items()}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        return matrix_mean(entropy_matrix(f, targets.observed, -self.value("alpha", logits)))


@register_loss
class EntropyMaximizationAPL(SPMLLoss):
    """``em-apl``: EM plus asymmetric pseudo-labelling of the most confident negatives.

    After epoch e (0-based) with e + 1 >= warmup, for each head and class c, among the entries
    still unobserved and not yet pseudo-labelled, the ``int(theta * U_c / (T - warmup))``
    lowest-scored ones (U_c: unobserved entries of class c at the start, T: total epochs) get
    their current prediction s as a soft target; from then on their term is
    beta [s neglog(f) + (1-s) neglog(1-f)] instead of -alpha H(f). Ties: stable sort by score,
    then row. With T <= warmup no pseudo-label is ever made (the reference divides by zero).

    State: ``pseudo`` (H, N, L) float, NaN where an entry has no pseudo-label, and
    ``unobserved`` (H, N, L) bool, the entries unobserved at the start.
    """

    name = "em-apl"
    summary = "EM + asymmetric pseudo-labels: each epoch after warmup, soft negatives per class."
    reference = ZHOU
    paper = ZHOU_PAPER
    year = 2022
    params = {
        "alpha": ALPHA,
        "beta": non_negative(0.2, "weight of the soft pseudo-label terms"),
        "theta": unit_interval(
            0.9, "fraction of each class's unobserved entries pseudo-labelled over training"),
        "warmup": epoch_count(
            5, "epochs of plain EM before the first pseudo-labelling (1-based epoch count)"),
    }
    dataset_defaults = APL_DEFAULTS

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        heads = self.num_heads
        unobserved = (observed == 0).unsqueeze(0).expand(heads, -1, -1).clone()
        pseudo = torch.full(unobserved.shape, float("nan"), device=observed.device)
        return {"pseudo": pseudo, "unobserved": unobserved}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        pseudo = self.state_tensor(state, "pseudo")[:, targets.index]
        f = torch.sigmoid(logits)
        labelled = ~torch.isnan(pseudo) & (targets.observed == 0)
        soft = soft_bce(f, torch.nan_to_num(pseudo))
        matrix = torch.where(labelled, self.value("beta", logits) * soft,
                             entropy_matrix(f, targets.observed, -self.value("alpha", logits)))
        return matrix_mean(matrix)

    def end_epoch(self, epoch: int, num_epochs: int, probs: Callable[[], Tensor],
                  state: dict[str, Tensor]) -> dict[str, float | Sequence[float]]:
        pseudo = self.state_tensor(state, "pseudo")
        unobserved = state["unobserved"]
        added = [0] * self.num_heads
        current = None
        for head in range(self.num_heads):
            warmup = int(self.param_values["warmup"][head])
            if epoch + 1 < warmup or num_epochs - warmup <= 0:
                continue
            if current is None:
                current = probs()
            theta = self.param_values["theta"][head]
            counts = [int(theta * u / (num_epochs - warmup))
                      for u in unobserved[head].sum(dim=0).tolist()]
            available = unobserved[head] & torch.isnan(pseudo[head])
            chosen = select_per_class(current[head], available, counts, largest=False)
            pseudo[head][chosen] = current[head][chosen].to(pseudo.dtype)
            added[head] = int(chosen.sum())
        return {"pseudo_labels_added": added,
                "pseudo_labels_total": (~torch.isnan(pseudo)).sum(dim=(1, 2)).tolist()}


@register_loss
class EntropyMinimization(SPMLLoss):
    """``entmin``: z=1 neglog(f); z=0 +alpha H(f) (entropy minimisation, Zhou et al.'s baseline).

    It drives unobserved predictions to 0 or 1 and collapses, as Zhou et al. report (VOC 53.2).
    """

    name = "entmin"
    summary = "Entropy minimisation baseline: z=0 term +alpha*H(f) (collapses, as published)."
    reference = ZHOU
    paper = ZHOU_PAPER
    year = 2022
    params = {"alpha": ALPHA}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        return matrix_mean(entropy_matrix(f, targets.observed, self.value("alpha", logits)))
