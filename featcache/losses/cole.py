"""The losses of Cole et al. (CVPR 2021), with the reference code's conventions.

Every loss here works on probabilities f = sigmoid(g) with ``neglog(x) = -log(x + 1e-5)``; the
(H, B, L) loss matrix is divided by B * L and summed (:func:`matrix_mean`); EPR's and ROLE's
regularizer is added afterwards. ``shared/PROTOCOL.md`` section 3 is the specification;
``docs/losses.md`` writes every formula out.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from featcache.errors import InputError
from featcache.losses.base import SPMLLoss
from featcache.losses.needs import FULL_LABELS, OBSERVED_NEGATIVES
from featcache.losses.params import K_PARAM, positive, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import (
    assume_negative,
    expand_initial,
    expected_positive_regularizer,
    inverse_sigmoid,
    inverse_sigmoid_tensor,
    masked_bce_with_grad,
    matrix_mean,
    neglog,
    soft_bce,
    soft_bce_with_grad,
    where_mask,
)

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 10

COLE = "Cole et al. CVPR 2021"
COLE_PAPER = "Multi-Label Learning from Single Positive Labels"

# k, the expected number of positives per image (K_PARAM), is left to the data: the stages pass
# the labels file's mean positives per official training image (PROTOCOL.md section 1 tabulates
# it rounded: voc 1.5, coco 2.9, nuswide 1.9, cub 31.4). The reference code hard-codes
# voc 1.5, coco 2.9, nuswide 1.9, cub 31.4 (coco was 2.5 until its commit aefa578, 2021-07-20);
# pass --param k=... to use those instead.

# ROLE's label-estimator initialisation (reference models.LabelEstimator).
ROLE_INIT_UNOBSERVED = 0.6  # unobserved phi ~ U[-logit(0.6), logit(0.6)]
ROLE_INIT_POSITIVE = 0.995
ROLE_INIT_NEGATIVE = 0.005


def clean_labels(targets: Targets, loss_name: str) -> Tensor:
    """The batch's full labels, or a clear error where the data has none."""
    if targets.clean is None:
        raise InputError(f"loss {loss_name!r} needs the full (clean) training labels, which "
                         "this data does not have; use a single-positive loss such as 'an'")
    return targets.clean


@register_loss
class FullBCE(SPMLLoss):
    """``bce``: binary cross-entropy on the full labels (the oracle of Cole et al. Table 1)."""

    name = "bce"
    summary = "Full labels: y=1 neglog(f), y=0 neglog(1-f) (oracle)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    needs = (FULL_LABELS,)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        return matrix_mean(torch.where(clean_labels(targets, self.name) == 1, neglog(f), neglog(1.0 - f)))

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        return masked_bce_with_grad(logits, clean_labels(targets, self.name) == 1)


@register_loss
class FullBCESmoothed(SPMLLoss):
    """``bce-ls``: label-smoothed BCE on the full labels.

    y=1: (1-e) neglog(f) + e neglog(1-f); y=0 the mirror. The reference code uses (1-e, e)
    with e = 0.1, not the paper's e/2 (code vs paper: the code's choice is the default).
    """

    name = "bce-ls"
    summary = "Full labels, label smoothing: targets 1-eps and eps (oracle)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    needs = (FULL_LABELS,)
    params = {"eps": unit_interval(0.1, "smoothing: positives target 1-eps, negatives eps")}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return matrix_mean(soft_bce(torch.sigmoid(logits), self.target(targets, logits)))

    def target(self, targets: Targets, logits: Tensor) -> Tensor:
        """The smoothed full labels: 1 - eps on positives, eps on negatives."""
        clean = clean_labels(targets, self.name)
        eps = self.value("eps", logits)
        return clean * (1.0 - eps) + (1.0 - clean) * eps

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        return soft_bce_with_grad(logits, self.target(targets, logits))


@register_loss
class IgnoreUnobservedTrueNegatives(SPMLLoss):
    """``iun``: z=1 neglog(f); true negatives (clean y=0) neglog(1-f).

    The paper's definition (and Zhou et al.'s fixed copy): the public Cole code compares its
    0/1 true labels with -1 and so drops the negative term.
    """

    name = "iun"
    summary = "Observed positive + every true negative (needs full labels)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    needs = (FULL_LABELS,)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        clean = clean_labels(targets, self.name)
        f = torch.sigmoid(logits)
        negative = where_mask(clean == 0, neglog(1.0 - f))
        return matrix_mean(torch.where(targets.observed == 1, neglog(f), negative))

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        clean = clean_labels(targets, self.name)
        return masked_bce_with_grad(logits, targets.observed == 1, negative=clean == 0)


@register_loss
class IgnoreUnobserved(SPMLLoss):
    """``iu``: z=1 neglog(f); z=-1 neglog(1-f); unobserved entries contribute nothing."""

    name = "iu"
    summary = "Observed positive + observed negative; unobserved ignored (needs --num-neg)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    needs = (OBSERVED_NEGATIVES,)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        z = targets.observed
        return matrix_mean(torch.where(z == 1, neglog(f), where_mask(z == -1, neglog(1.0 - f))))

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        z = targets.observed
        return masked_bce_with_grad(logits, z == 1, negative=z == -1)


@register_loss
class AssumeNegative(SPMLLoss):
    """``an``: every unobserved label is taken as negative (z=0: neglog(1-f))."""

    name = "an"
    summary = "Assume negative: z=1 neglog(f), z=0 neglog(1-f)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return matrix_mean(assume_negative(torch.sigmoid(logits), targets.observed))

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        return masked_bce_with_grad(logits, targets.observed == 1)


@register_loss
class AssumeNegativeSmoothed(SPMLLoss):
    """``an-ls``: AN with label smoothing, separately for positives and assumed negatives.

    z=1: (1-eps_pos) neglog(f) + eps_pos neglog(1-f);
    z=0: (1-eps_neg) neglog(1-f) + eps_neg neglog(f). (0.1, 0.1) is Cole et al.'s ls_coef;
    (0, 0.1) is ``n-ls`` (supplement A: only the assumed negatives are smoothed).
    """

    name = "an-ls"
    summary = "AN with label smoothing (eps_pos on positives, eps_neg on assumed negatives)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    params = {"eps_pos": unit_interval(0.1, "smoothing of observed positives (target 1-eps_pos)"),
              "eps_neg": unit_interval(0.1, "smoothing of assumed negatives (target eps_neg)")}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return matrix_mean(soft_bce(torch.sigmoid(logits), self.target(targets, logits)))

    def target(self, targets: Targets, logits: Tensor) -> Tensor:
        """The smoothed target of every entry: 1 - eps_pos on positives, eps_neg elsewhere."""
        positive = targets.observed == 1
        return positive * (1.0 - self.value("eps_pos", logits)) + ~positive * self.value("eps_neg", logits)

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        return soft_bce_with_grad(logits, self.target(targets, logits))


@register_loss
class NegativeSmoothed(AssumeNegativeSmoothed):
    """``n-ls``: ``an-ls`` smoothing only the assumed negatives: (eps_pos, eps_neg) = (0, 0.1)."""

    name = "n-ls"
    summary = "AN smoothing only the assumed negatives: an-ls with eps_pos=0, eps_neg=0.1."
    params = {"eps_pos": unit_interval(0.0, AssumeNegativeSmoothed.params["eps_pos"].help),
              "eps_neg": unit_interval(0.1, AssumeNegativeSmoothed.params["eps_neg"].help)}


@register_loss
class WeightedAssumeNegative(SPMLLoss):
    """``wan``: AN with the assumed negatives weighted 1/(L-1)."""

    name = "wan"
    summary = "AN with assumed negatives weighted 1/(L-1)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        return matrix_mean(assume_negative(torch.sigmoid(logits), targets.observed,
                                           self.neg_weight(logits)))

    @staticmethod
    def neg_weight(logits: Tensor) -> float:
        """1 / (L - 1), the assumed negatives' weight (1 with a single class)."""
        classes = logits.shape[-1]
        return 1.0 / (classes - 1) if classes > 1 else 1.0

    def loss_and_grad(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                      epoch: int) -> tuple[Tensor, Tensor] | None:
        return masked_bce_with_grad(logits, targets.observed == 1,
                                    neg_weight=self.neg_weight(logits))


@register_loss
class ExpectedPositiveRegularized(SPMLLoss):
    """``epr``: z=1 neglog(f), plus R = (mean_b sum_i f_bi - k)^2 / L^2 (added, not divided)."""

    name = "epr"
    summary = "Observed positives + expected-positive regularizer (k positives per image)."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    params = {"k": K_PARAM}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        matrix = where_mask(targets.observed == 1, neglog(f))
        return matrix_mean(matrix) + expected_positive_regularizer(f, self.value("k", logits))


@register_loss
class RegularizedOnlineLabelEstimation(SPMLLoss):
    """``role``: the classifier and a look-up table of label estimates phi learn from each other.

    y~ = sigmoid(phi[index]); matrix = 0.5 (z=1: neglog(f) + z=1: neglog(y~))
    + 0.5 (bce(f, sg(y~)) + bce(y~, sg(f))) with bce(p, t) = t neglog(p) + (1-t) neglog(1-p)
    over every entry (sg = stop-gradient); regularizer 0.5 (R(f) + R(y~)) with EPR's R.
    phi is trainable state, (H, N, L) logits, learning at ``lr_mult`` times the head's rate.
    """

    name = "role"
    summary = "Online label estimation: head and per-example label estimates teach each other."
    reference = COLE
    paper = COLE_PAPER
    year = 2021
    params = {"k": K_PARAM,
              "lr_mult": positive(10.0, "learning-rate multiplier of the label estimates phi")}
    learned_state = {"phi": "lr_mult"}
    handoff_state = ("phi",)

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """phi (H, N, L): the reference initialisation, or a hand-over (``initial['phi']``).

        Fresh: unobserved ``q (2 u - 1)`` with u ~ U[0, 1) from ``generator`` and
        q = logit(0.6); observed positives logit(0.995); observed negatives logit(0.005).
        Every head starts from the same phi, as separate reference runs with one seed would.
        A hand-over is re-logited through the clipped logit, as the reference does when it
        passes probabilities from the linear phase to fine-tuning.
        """
        shape = (observed.shape[0], observed.shape[1])
        if initial is not None and "phi" in initial:
            given = expand_initial(initial["phi"], self.num_heads, shape, "phi")
            phi = inverse_sigmoid_tensor(torch.sigmoid(given.float()))
            return {"phi": phi.to(observed.device).requires_grad_(True)}
        gen_device = generator.device if generator is not None else torch.device("cpu")
        uniform = torch.rand(shape, generator=generator, device=gen_device, dtype=torch.float32)
        phi = inverse_sigmoid(ROLE_INIT_UNOBSERVED) * (2.0 * uniform - 1.0)
        phi = phi.to(observed.device)
        phi[observed == 1] = inverse_sigmoid(ROLE_INIT_POSITIVE)
        phi[observed == -1] = inverse_sigmoid(ROLE_INIT_NEGATIVE)
        phi = phi.unsqueeze(0).expand(self.num_heads, -1, -1).clone()
        return {"phi": phi.requires_grad_(True)}

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        phi = self.state_tensor(state, "phi")
        f = torch.sigmoid(logits)
        estimate = torch.sigmoid(phi[:, targets.index])
        positive = targets.observed == 1
        matrix = where_mask(positive, neglog(f) + neglog(estimate))
        matrix = 0.5 * (matrix + soft_bce(f, estimate.detach()) + soft_bce(estimate, f.detach()))
        k = self.value("k", logits)
        regularizer = 0.5 * (expected_positive_regularizer(f, k)
                             + expected_positive_regularizer(estimate, k))
        return matrix_mean(matrix) + regularizer


@register_loss
class PairwiseRanking(SPMLLoss):
    """``pr``: for each observed positive i, sum over unobserved j of max(0, 1 - f_i + f_j).

    The sum is stored at the positive's entry of the loss matrix (the reference's loss_mtx[n, i]).
    Only unobserved entries (z=0) are compared, as in the reference; observed negatives
    (z=-1, only with --num-neg) are left out like there.
    """

    name = "pr"
    summary = "Pairwise ranking hinge: each observed positive above every other label by 1."
    reference = COLE
    paper = COLE_PAPER
    year = 2021

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        f = torch.sigmoid(logits)
        positive = targets.observed == 1
        # margins[h, b, i, j] = max(0, 1 - f_i + f_j), kept for unobserved j only
        margins = (1.0 - f.unsqueeze(-1) + f.unsqueeze(-2)).clamp(min=0)
        margins = where_mask((targets.observed == 0).unsqueeze(-2), margins)
        return matrix_mean(where_mask(positive, margins.sum(dim=-1)))
