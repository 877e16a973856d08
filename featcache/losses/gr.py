"""Chen et al. (IJCAI 2024, arXiv 2405.03501): the GR loss ("generalized robust loss").

Conventions of the authors' code (``yan4xi1/GRLoss`` @ 5e13f7f, ``losses.py`` ``GR_loss``,
``models.py`` ``KFunction``/``VFunction``, the schedules in ``train.py``), which produced the
published numbers:

- on probabilities p = sigmoid(g); an observed positive costs ``-log(p + 1e-7)`` (their
  ``LOG_EPSILON`` is 1e-7, not the 1e-5 of Cole et al.'s code);
- an unobserved entry costs ``V(p') [K(p') L2(p) + (1 - K(p')) L3(p)]`` with p' = p detached
  (no gradient flows through K or V), the soft pseudo-label ``K(p') = sigmoid(w p' + b)``, the
  weight ``V(p') = exp(-(p' - mu)^2 / (2 sigma^2))``, and the generalized cross-entropies
  ``L2(p) = (1 - p^q2) / q2`` (towards positive) and ``L3(p) = (1 - (1 - p)^q3) / q3``
  (towards negative); no epsilon or clamp in these terms;
- an observed negative (z = -1) costs 0 but counts in the mean, which is over the whole B x L
  matrix (:func:`matrix_mean`); no regularizer;
- w, b, mu and sigma move linearly over the run, recomputed once per epoch, with the code's
  offset: in 0-based epoch e of T, w and b are at fraction e / T of the way (they start at
  their start values and never reach their end values), mu and sigma at (e + 1) / T (moved
  one step already in the first epoch, at their end values in the last).

The unobserved term and the schedule are plain functions (:func:`gr_unobserved_term`,
:func:`gr_schedule`, :func:`soft_pseudo_label`, :func:`gaussian_weight`) so that losses built
on GR (AEVLP's GPR) reuse them; ``GR_PARAMS`` holds the parameters they share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from featcache.errors import LossStateError
from featcache.losses.base import SPMLLoss
from featcache.losses.params import Param, epoch_count, positive
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import head_floats, matrix_mean

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 60

CHEN = "Chen et al. IJCAI 2024 (GR loss)"
CHEN_PAPER = ("Boosting Single Positive Multi-label Classification with Generalized Robust Loss "
              "(arXiv 2405.03501)")

#: the GR code's guard inside the log of observed positives
GR_LOG_EPSILON = 1e-7


def gr_neglog(probs: Tensor) -> Tensor:
    """``-log(p + 1e-7)``: the GR code's guarded log of an observed positive."""
    return -torch.log(probs + GR_LOG_EPSILON)


def soft_pseudo_label(detached: Tensor, w: Tensor | float, b: Tensor | float) -> Tensor:
    """K(p) = sigmoid(w p + b) of detached predictions: how likely a missing label is positive."""
    return torch.sigmoid(w * detached + b)


def gaussian_weight(detached: Tensor, mu: Tensor | float, sigma: Tensor | float) -> Tensor:
    """V(p) = exp(-((p - mu) / sigma)^2 / 2) of detached predictions (peak 1 at p = mu)."""
    return torch.exp(-0.5 * ((detached - mu) / sigma) ** 2)


def gce_positive(logits: Tensor, q: Tensor | float) -> Tensor:
    """``(1 - p^q) / q``, the generalized cross-entropy towards a positive target.

    p^q is computed as ``exp(q logsigmoid(g))``: the same value, and a finite gradient where
    sigmoid(g) underflows to 0 (the code's ``pow(p, q)`` gives inf * 0 there).
    """
    return (1.0 - torch.exp(q * F.logsigmoid(logits))) / q


def gce_negative(logits: Tensor, q: Tensor | float) -> Tensor:
    """``(1 - (1 - p)^q) / q``, the generalized cross-entropy towards a negative target."""
    return (1.0 - torch.exp(q * F.logsigmoid(-logits))) / q


def gr_unobserved_term(logits: Tensor, k: Tensor, v: Tensor, q2: Tensor | float,
                       q3: Tensor | float) -> Tensor:
    """GR's loss on unobserved entries: ``V [K L2(p) + (1 - K) L3(p)]`` elementwise.

    ``k`` and ``v`` come from the detached predictions (:func:`soft_pseudo_label`,
    :func:`gaussian_weight`); only L2 and L3 carry gradients.
    """
    return v * (k * gce_positive(logits, q2) + (1.0 - k) * gce_negative(logits, q3))


@dataclass
class GRSchedule:
    """w, b, mu, sigma of one epoch: floats, or (H, 1, 1) tensors when heads differ."""

    w: Tensor | float
    b: Tensor | float
    mu: Tensor | float
    sigma: Tensor | float


def schedule_steps(epoch: int, num_epochs: int, lead: int) -> int:
    """How many of its T steps a GR parameter has moved in 0-based ``epoch``: e + ``lead``.

    ``lead`` is 0 for w and b and 1 for mu and sigma (the code's one-epoch offset). Past the
    schedule's end (a ``schedule_epochs`` shorter than the run) the end value is held.
    """
    return min(max(epoch + lead, 0), num_epochs)


def gr_schedule(values: Mapping[str, Sequence[float]], epoch: int,
                num_epochs: int | Sequence[int], like: Tensor) -> GRSchedule:
    """The epoch's w, b, mu, sigma from per-head ``values`` of the ``GR_PARAMS`` start/end
    pairs; ``num_epochs`` is T, one for all heads or one per head."""
    heads = len(values["w_start"])
    lengths = [num_epochs] * heads if isinstance(num_epochs, int) else list(num_epochs)

    def moved(name: str, lead: int) -> Tensor | float:
        start, end = values[f"{name}_start"], values[f"{name}_end"]
        # (end - start) * steps / T, in the code's order of operations
        per_head = [start[h] + (end[h] - start[h]) * schedule_steps(epoch, lengths[h], lead)
                    / lengths[h] for h in range(heads)]
        return per_head[0] if len(set(per_head)) == 1 else head_floats(per_head, like)

    return GRSchedule(w=moved("w", 0), b=moved("b", 0), mu=moved("mu", 1),
                      sigma=moved("sigma", 1))


#: GR's parameters; the code's lists are beta = [w_start, w_end, b_start, b_end] and
#: alpha = [mu_start, sigma_start, mu_end, sigma_end] (note the different order)
GR_PARAMS = {
    "w_start": Param(0.0, "slope w of K(p) = sigmoid(w p + b) in the first epoch (code: beta[0])"),
    "w_end": Param(2.0, "value w moves towards over the run (code: beta[1])"),
    "b_start": Param(-2.0, "offset b of K(p) in the first epoch (code: beta[2])"),
    "b_end": Param(-2.0, "value b moves towards over the run (code: beta[3])"),
    "mu_start": Param(0.5, "centre mu of V(p) at the schedule's start (code: alpha[0])",
                      low=0.0, high=1.0),
    "mu_end": Param(0.8, "centre mu of V(p) in the last epoch (code: alpha[2])", low=0.0,
                    high=1.0),
    "sigma_start": positive(2.0, "width sigma of V(p) at the schedule's start (code: alpha[1])"),
    "sigma_end": positive(0.5, "width sigma of V(p) in the last epoch (code: alpha[3])"),
    "q2": positive(0.01, "exponent of the positive-target GCE (1 - p^q2) / q2 (-> -log p as q2 -> 0)"),
    "q3": positive(1.0, "exponent of the negative-target GCE (1 - (1-p)^q3) / q3 (q3 = 1: p)"),
    "schedule_epochs": epoch_count(
        0, "epochs T over which w, b, mu, sigma move; 0: the run's number of epochs"),
}


@register_loss
class GeneralizedRobust(SPMLLoss):
    """``gr``: observed positives -log(p + 1e-7); unobserved V(p)[K(p) L2(p) + (1-K(p)) L3(p)].

    K and V are computed on detached predictions with w, b, mu, sigma moving linearly over the
    run (module docstring: the code's one-epoch offset between the pairs). Observed negatives
    cost 0. Mean over B * L.
    """

    name = "gr"
    summary = "GR loss: unobserved labels get a soft pseudo-label K(p) and weight V(p) on a schedule."
    reference = CHEN
    paper = CHEN_PAPER
    year = 2024
    params = GR_PARAMS
    scheduled = True  # w, b, mu, sigma move every epoch
    #: the run's number of epochs, set by :meth:`begin_epoch`
    run_epochs: int | None = None

    def begin_epoch(self, epoch: int, num_epochs: int, state: dict[str, Tensor]) -> None:
        self.run_epochs = int(num_epochs)

    def schedule_length(self) -> list[int]:
        """T of each head: ``schedule_epochs``, or the run's epochs when it is 0."""
        run = self.run_epochs
        lengths = []
        for value in self.param_values["schedule_epochs"]:
            if value > 0:
                lengths.append(int(value))
            elif run is None:
                raise LossStateError(f"loss {self.name!r} moves its parameters over the run: call "
                                     "begin_epoch(epoch, num_epochs, state) before each epoch (both "
                                     "trainers do), or set schedule_epochs")
            else:
                lengths.append(run)
        return lengths

    def schedule(self, epoch: int, like: Tensor) -> GRSchedule:
        """w, b, mu, sigma of ``epoch`` for every head."""
        return gr_schedule(self.param_values, epoch, self.schedule_length(), like)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        probs = torch.sigmoid(logits)
        detached = probs.detach()
        s = self.schedule(epoch, logits)
        unobserved = gr_unobserved_term(
            logits, soft_pseudo_label(detached, s.w, s.b), gaussian_weight(detached, s.mu, s.sigma),
            self.value("q2", logits), self.value("q3", logits))
        observed = targets.observed
        matrix = torch.where(observed == 1, gr_neglog(probs),
                             torch.where(observed == 0, unobserved, torch.zeros_like(logits)))
        return matrix_mean(matrix)
