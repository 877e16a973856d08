"""Li, Wang, Chen: OPML ("pushing one pair of labels apart"), OPML-SP, and ZLPR.

**A reconstruction.** The extracted paper lost its equations; PROTOCOL.md section 5 fixes what
the prose says and everything else here is an explicit, documented assumption
(``docs/losses.md`` lists each one).

Row-wise losses on logits: per example,
``L = log(a + sum_{j in neg} e^{g_j}) + log(b + sum_{i in pos} e^{-g_i})`` computed as
log-sum-exp over ``[log a, g_j...]`` (numerically stable), averaged over the batch (not
divided by L). pos = observed positives (all positives when the data has full labels), neg =
every other label. ZLPR is a = b = 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from featcache.losses.base import SPMLLoss
from featcache.losses.params import epoch_count, non_negative, positive, switch, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import (
    LOG_EPSILON,
    batch_labels,
    head_floats,
    per_head_labels,
    select_per_class,
)
from featcache.metrics import average_precision

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 40

LI = "Li et al. (OPML), reconstruction"
LI_PAPER = ("Pushing One Pair of Labels Apart Each Time in Multi-Label Learning: From Single "
            "Positive to Full Labels (arXiv 2302.14695)")
SU = "Su et al. 2022 (ZLPR), as compared by Li et al."
SU_PAPER = "ZLPR: A Novel Loss for Multi-label Classification (arXiv 2208.02955)"


def log_sum_exp_plus(constant: Tensor, terms: Tensor, log_weights: Tensor) -> Tensor:
    """``log(c + sum_j w_j e^{x_j})`` over the last dim, stably; c is (H, 1, 1), w_j >= 0."""
    shifted = terms + log_weights
    constant = torch.log(constant).expand(*shifted.shape[:-1], 1)
    return torch.logsumexp(torch.cat([constant, shifted], dim=-1), dim=-1)


def pair_loss(logits: Tensor, pos_weight: Tensor, neg_weight: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Per row: ``log(a + sum w_neg e^{g}) + log(b + sum w_pos e^{-g})``, shape (H, B)."""
    return (log_sum_exp_plus(a, logits, torch.log(neg_weight))
            + log_sum_exp_plus(b, -logits, torch.log(pos_weight)))


class PairLoss(SPMLLoss):
    """OPML's bounded pair loss with hard labels; ``a`` and ``b`` from the parameters."""

    def constants(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        a = head_floats(self.param_values.get("a", [1.0] * self.num_heads), logits)
        b = head_floats(self.param_values.get("b", [1.0] * self.num_heads), logits)
        return a, b

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        labels = batch_labels(targets, state).expand_as(logits)
        positive = (labels == 1).to(logits.dtype)
        a, b = self.constants(logits)
        return pair_loss(logits, positive, 1.0 - positive, a, b).mean(dim=-1)


@register_loss
class OPML(PairLoss):
    """``opml``: the bounded pair loss with constants a, b (a = b = 1 is ZLPR).

    Reconstruction: the paper's tuned a, b (set through a transformed parameter) were lost
    in extraction; the defaults (1, 1) are ZLPR.
    """

    name = "opml"
    summary = "Push one pair of labels apart: log(a+sum_neg e^g) + log(b+sum_pos e^-g) (reconstr.)."
    reference = LI
    paper = LI_PAPER
    year = 2023
    params = {"a": positive(1.0, "constant of the negatives' log-sum-exp (bounds the loss)"),
              "b": positive(1.0, "constant of the positives' log-sum-exp")}


@register_loss
class OPMLSinglePositive(PairLoss):
    """``opml-sp``: soft OPML + high-rank regularizer + AP-based label correction.

    Each part is switched by a 0/1 parameter (``smooth``, ``rank``, ``correct``). Assumptions
    (the paper's formulas were lost in extraction):

    - Soft OPML: an unobserved entry counts as a negative with weight 1 - eps and as a positive
      with weight eps in the two log-sum-exps, eps = (AP_c * sg(f))^smooth_power, AP_c the
      class's training AP against the observed labels (0 before the first epoch ends, so the
      first epoch is hard OPML).
    - High-rank: ``-lam * sum_i log(sigma_i(F_B) + 1e-5)``, F_B the (B, L) matrix of batch
      probabilities, per head; added after the batch mean.
    - Correction: after epoch e with e + 1 >= correct_warmup, each class c flips to positive
      its highest-scored still-unobserved entries, ``int(correct_ratio * N * AP_c)`` of them
      (more for a class whose AP is higher, PROTOCOL.md section 5), never more in total than
      ``int(correct_cap * m_c)`` with m_c the class's observed positives at the start.

    State: ``observed`` (H, N, L) int8 labels with the corrections, ``corrected`` (H, N, L)
    bool, ``train_ap`` (H, 1, L) the latest training AP.
    """

    name = "opml-sp"
    summary = "OPML + AP-based soft labels + high-rank regularizer + AP-based correction (reconstr.)."
    reference = LI
    paper = LI_PAPER
    year = 2023
    # torch.linalg.svdvals checks its result on the host (on CUDA: a read of the device that a
    # graph capture refuses); no other routine gives its numbers, so the step is not captured
    capturable = False
    params = {
        **OPML.params,
        "smooth": switch(1, "1: AP-based soft targets for unobserved labels, 0: hard OPML"),
        "smooth_power": positive(1.0, "power p of the soft target eps = (AP_c * f)^p"),
        "rank": switch(1, "1: add the high-rank regularizer, 0: not"),
        "lam": non_negative(1e-3, "weight of the high-rank regularizer -sum log(sigma_i + 1e-5)"),
        "correct": switch(1, "1: AP-based label correction after each epoch, 0: none"),
        "correct_ratio": unit_interval(
            1e-3, "flips per class and epoch: int(correct_ratio * N * AP_c)"),
        "correct_cap": non_negative(
            1.0, "at most int(correct_cap * observed positives of the class) flips in all"),
        "correct_warmup": epoch_count(1, "first epoch (1-based) after which labels are corrected"),
    }

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        labels = per_head_labels(observed, self.num_heads)
        return {
            "observed": labels,
            "corrected": torch.zeros_like(labels, dtype=torch.bool),
            "train_ap": torch.zeros(self.num_heads, 1, observed.shape[1], device=observed.device),
        }

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        labels = batch_labels(targets, state).expand_as(logits)
        f = torch.sigmoid(logits)
        positive = (labels == 1).to(logits.dtype)
        unobserved = (labels == 0).to(logits.dtype)
        smooth = head_floats(self.param_values["smooth"], logits)
        ap = self.state_tensor(state, "train_ap").to(logits.dtype)
        power = head_floats(self.param_values["smooth_power"], logits)
        eps = smooth * unobserved * (ap * f.detach()) ** power
        a, b = self.constants(logits)
        loss = pair_loss(logits, positive + eps, 1.0 - positive - eps, a, b).mean(dim=-1)
        if any(self.param_values["rank"]):
            singular = torch.linalg.svdvals(f)
            rank_term = -torch.log(singular + LOG_EPSILON).sum(dim=-1)
            weight = head_floats(self.param_values["lam"], logits, (-1,))
            loss = loss + head_floats(self.param_values["rank"], logits, (-1,)) * weight * rank_term
        return loss

    def end_epoch(self, epoch: int, num_epochs: int, probs: Callable[[], Tensor],
                  state: dict[str, Tensor]) -> dict[str, float | Sequence[float]]:
        labels, corrected = state["observed"], state["corrected"]
        current = probs()
        original_positive = (labels == 1) & ~corrected
        ap = average_precision(current, original_positive.to(current.dtype))
        state["train_ap"].copy_(ap.unsqueeze(1).to(state["train_ap"].dtype))
        flipped = [0] * self.num_heads
        num_rows = labels.shape[1]
        for head in range(self.num_heads):
            params = self.head_params(head)
            if not params["correct"] or epoch + 1 < params["correct_warmup"]:
                continue
            observed_pos = original_positive[head].sum(dim=0).tolist()
            done = corrected[head].sum(dim=0).tolist()
            room = [max(int(params["correct_cap"] * m) - d, 0) for m, d in zip(observed_pos, done, strict=True)]
            wanted = [int(params["correct_ratio"] * num_rows * value) for value in ap[head].tolist()]
            counts = [min(w, r) for w, r in zip(wanted, room, strict=True)]
            chosen = select_per_class(current[head], labels[head] == 0, counts, largest=True)
            labels[head][chosen] = 1
            corrected[head] |= chosen
            flipped[head] = int(chosen.sum())
        return {"train_ap_observed": (ap.mean(dim=-1) * 100.0).tolist(),
                "labels_corrected": flipped}


@register_loss
class ZLPR(PairLoss):
    """``zlpr``: log(1 + sum_neg e^{g_j}) + log(1 + sum_pos e^{-g_i}), averaged over the batch."""

    name = "zlpr"
    summary = "ZLPR: log(1+sum_neg e^g) + log(1+sum_pos e^-g), per example (OPML at a=b=1)."
    reference = SU
    paper = SU_PAPER
    year = 2022
