"""Building blocks shared by the losses: the numeric conventions (the guarded log, the matrix
mean, constants on the device, hand-written gradients' seed), label masks, guarded
cross-entropy terms, label state.

Everything works on stacked heads: probabilities and logits are (H, B, L); label matrices are
(B, L) (shared by all heads) or (H, B, L) (per-head label state, e.g. LL-Cp's corrections).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from featcache.constants import cached_constant, device_constant  # noqa: F401
from featcache.errors import InputError, LossStateError
from featcache.losses.targets import Targets

LOG_EPSILON = 1e-5


def unit_gradient(like: Tensor, count: int, sign: float = 1.0) -> Tensor:
    """``sign / count`` as autograd's backward of ``total / count`` computes it (``1 / count``
    on ``like``'s dtype and device; negation is exact), as a 0-d tensor built once per count,
    sign, device and dtype: the seed of a hand-written gradient. Treat it as read-only."""
    return cached_constant(("unit", count, sign, like.device, like.dtype),
                           lambda: sign * (torch.ones((), dtype=like.dtype, device=like.device)
                                           / count))


def neglog(x: Tensor) -> Tensor:
    """``-log(x + 1e-5)``, the reference code's guarded log on probabilities."""
    return -torch.log(x + LOG_EPSILON)


def matrix_mean(loss_matrix: Tensor) -> Tensor:
    """Sum an (H, B, L) loss matrix over B and L and divide by B * L: shape (H,)."""
    batch, classes = loss_matrix.shape[-2:]
    return loss_matrix.sum(dim=(-2, -1)) / (batch * classes)


def expected_positive_regularizer(probs: Tensor, k: float | Tensor) -> Tensor:
    """``(mean over the batch of sum_i f_ni - k)^2 / L^2`` per head: shape (H,)."""
    classes = probs.shape[-1]
    k = k.reshape(-1) if isinstance(k, Tensor) else k
    return (probs.sum(dim=-1).mean(dim=-1) - k) ** 2 / classes**2


def inverse_sigmoid(p: float) -> float:
    """The reference code's logit: ``log(p / (1 - p))`` with p clipped to [1e-5, 1 - 1e-5]."""
    p = min(max(p, LOG_EPSILON), 1.0 - LOG_EPSILON)
    return math.log(p / (1.0 - p))


def inverse_sigmoid_tensor(p: Tensor) -> Tensor:
    """:func:`inverse_sigmoid` elementwise on a tensor of probabilities."""
    p = p.clamp(LOG_EPSILON, 1.0 - LOG_EPSILON)
    return torch.log(p / (1.0 - p))


def soft_bce(probs: Tensor, target: Tensor | float) -> Tensor:
    """``t neglog(p) + (1 - t) neglog(1 - p)`` elementwise (a soft target t in [0, 1])."""
    return target * neglog(probs) + (1.0 - target) * neglog(1.0 - probs)


def binary_entropy(probs: Tensor) -> Tensor:
    """``H(f) = f neglog(f) + (1 - f) neglog(1 - f)``, the 1e-5 inside both logs (Zhou et al.)."""
    return soft_bce(probs, probs)


def where_mask(mask: Tensor, values: Tensor) -> Tensor:
    """``values`` where ``mask`` holds, 0 elsewhere (no NaN leaks from the unused side)."""
    return torch.where(mask, values, 0.0)


def weighted(weight: Tensor | float, values: Tensor) -> Tensor:
    """``weight * values``, skipping the multiplication when the weight is exactly 1."""
    return values if isinstance(weight, float) and weight == 1.0 else weight * values


def assume_negative(probs: Tensor, observed: Tensor, neg_weight: Tensor | float = 1.0) -> Tensor:
    """The AN loss matrix: z=1 neglog(f); every other entry ``neg_weight * neglog(1 - f)``.

    Observed negatives (z=-1) count as negatives, like the unobserved entries (the AN targets
    are the observed labels clipped to >= 0).
    """
    return torch.where(observed == 1, neglog(probs), weighted(neg_weight, neglog(1.0 - probs)))


# --------------------------------------------------------------- hand-written gradients
# Each returns (loss per head (H,), d(sum of the losses) / d logits (H, B, L)) with the bits
# autograd gives through the named expression: the same operations its backward formulas
# run. Exact rewrites only: negation commutes with rounding, a sum of two terms rounds the
# same in either order, and an entry where() does not pick gets an exact zero.


def masked_bce_with_grad(logits: Tensor, positive: Tensor, negative: Tensor | None = None,
                         neg_weight: float = 1.0) -> tuple[Tensor, Tensor]:
    """``matrix_mean(where(positive, neglog(f), [negative] neg_weight * neglog(1 - f)))`` and
    its gradient; ``negative`` None: every entry that is not positive (AN, WAN, BCE), else
    only those (IU, IUN; the others contribute 0)."""
    probs = torch.sigmoid(logits)
    count = logits.shape[-2] * logits.shape[-1]
    if negative is None and isinstance(neg_weight, float) and neg_weight == 1.0:
        # every entry takes one guarded log: of f + eps where positive, of (1 - f) + eps
        # elsewhere, so one log of the entry's own shifted value (the same bits as picking
        # between two logs) and one division for its gradient (-u / x is -(u / x) exactly)
        shifted = torch.where(positive, probs, torch.rsub(probs, 1.0)).add_(LOG_EPSILON)
        loss = torch.log(shifted).sum(dim=(-2, -1)).div_(-count)
        unit = unit_gradient(logits, count)
        signed = torch.where(positive, unit_gradient(logits, count, -1.0), unit)
        return loss, sigmoid_backward(torch.div(signed, shifted), probs)
    shifted_pos = probs + LOG_EPSILON
    shifted_neg = torch.rsub(probs, 1.0).add_(LOG_EPSILON)
    if negative is None:
        # -(sum of the picked logs) / n is matrix_mean of the negated logs, bit for bit
        picked = torch.where(positive, torch.log(shifted_pos),
                             weighted(neg_weight, torch.log(shifted_neg)))
        loss = picked.sum(dim=(-2, -1)).div_(-count)
    else:
        neg_term = where_mask(negative, weighted(neg_weight, -torch.log(shifted_neg)))
        loss = matrix_mean(torch.where(positive, -torch.log(shifted_pos), neg_term))
    neg_grad = weighted(neg_weight, unit_gradient(logits, count)) / shifted_neg
    if negative is not None:
        neg_grad = where_mask(negative, neg_grad)
    grad_probs = torch.where(positive, unit_gradient(logits, count, -1.0) / shifted_pos, neg_grad)
    return loss, sigmoid_backward(grad_probs, probs)


def soft_bce_with_grad(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``matrix_mean(soft_bce(sigmoid(logits), target))`` and its gradient: with c = 1/(B*L),
    -(c t) / (f + eps) from t * neglog(f) plus (c (1 - t)) / ((1 - f) + eps) from the other
    term (AN-LS, N-LS, BCE-LS)."""
    probs = torch.sigmoid(logits)
    rest = torch.rsub(target, 1.0)
    shifted_pos = probs + LOG_EPSILON
    shifted_neg = torch.rsub(probs, 1.0).add_(LOG_EPSILON)
    loss = matrix_mean(target * -torch.log(shifted_pos) + rest * -torch.log(shifted_neg))
    unit = unit_gradient(logits, logits.shape[-2] * logits.shape[-1])
    grad_probs = torch.div((unit * target).neg_(), shifted_pos).add_((unit * rest) / shifted_neg)
    return loss, sigmoid_backward(grad_probs, probs)


#: autograd's backward of ``sigmoid`` (grad, its output): the overload itself, called directly
sigmoid_backward = torch.ops.aten.sigmoid_backward.default


def per_head_labels(observed: Tensor, num_heads: int) -> Tensor:
    """An (H, N, L) int8 copy of the observed labels, one per head (for labels that change)."""
    return observed.to(torch.int8).unsqueeze(0).expand(num_heads, -1, -1).clone()


def batch_labels(targets: Targets, state: dict[str, Tensor], key: str = "observed") -> Tensor:
    """The batch's labels as float: ``state[key]`` rows (H, B, L) when kept, else (B, L)."""
    if key in state:
        return state[key][:, targets.index].to(targets.observed.dtype)
    return targets.observed


def head_floats(values: list[float], like: Tensor, shape: tuple[int, ...] = (-1, 1, 1)) -> Tensor:
    """Per-head parameter values as a tensor on ``like``'s device, reshaped to ``shape``."""
    return device_constant(values, like.device, like.dtype).view(*shape)


def expand_initial(value: Tensor, num_heads: int, shape: tuple[int, int], key: str) -> Tensor:
    """Hand-over state of shape (N, L) or (H, N, L) as an (H, N, L) copy; the error names the key."""
    value = torch.as_tensor(value)
    if value.dim() == 2:
        value = value.unsqueeze(0).expand(num_heads, -1, -1)
    if tuple(value.shape) != (num_heads, *shape):
        raise InputError(
            f"initial state {key!r} has shape {tuple(value.shape)}; expected {tuple(shape)} "
            f"(training rows x classes) or ({num_heads}, {shape[0]}, {shape[1]}) (one per head)"
        )
    return value.clone()


def select_per_class(scores: Tensor, available: Tensor, counts: list[int], largest: bool) -> Tensor:
    """Mask (N, L) of the ``counts[c]`` lowest- (or highest-) scored available entries of each
    column c. Ties go to the lower row (a stable sort by score, then row).
    """
    fill = float("-inf") if largest else float("inf")
    masked = torch.where(available, scores, torch.full_like(scores, fill))
    order = torch.sort(masked, dim=0, descending=largest, stable=True).indices
    positions = torch.arange(scores.shape[0], device=scores.device).unsqueeze(1).expand_as(order)
    rank = torch.empty_like(order).scatter_(0, order, positions)
    limit = torch.tensor(counts, device=scores.device, dtype=rank.dtype).unsqueeze(0)
    return available & (rank < limit)


def require_pseudo(loss: str, targets: Targets) -> Tensor:
    """``targets.pseudo``, or a clear error when the caller did not attach pseudo-labels."""
    if targets.pseudo is None:
        raise LossStateError(f"loss {loss!r} trains on pseudo-labels: pass Targets(pseudo=...) "
                             "(the stages attach the set made by `featcache pseudo-label`)")
    return targets.pseudo
