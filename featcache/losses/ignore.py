"""IGNORE (Song et al. ECCV 2024, "Information Gap-based False Negative Loss Rejection for
Single Positive Multi-Label Learning"): assume negative, but reject the loss of the assumed
negatives whose logit changes a lot when the input is cut down to the single positive's
discriminative area.

Conventions from the authors' code (gyeong-ryeol-song/SPML-IGNORE):

- **The mask** (``functions.py``, ``generate_resnet_cam_and_mask`` / ``cam_minmax_norm``): the
  class activation map of the observed positive (the head applied at every position, bias
  included; ``models.py``'s 1x1 convolution) is min-max normalised **over the batch at each
  position** (``(cam - min over the rows) / max over the rows``: divided by the max, not by
  max - min) and the positions whose value is **> cam_threshold** (0.8) are kept, the others
  zeroed. Only rows with exactly one observed positive are masked (the others keep everything)
  and only they enter the normalisation. Stage three interpolates the normalised map bilinearly
  (``align_corners=False``) to the image size before thresholding and multiplies the normalised
  image by the mask (:func:`image_keep_mask`); stage two, on cached feature maps, thresholds at
  the map's own resolution and zeroes positions of the feature map (:func:`position_keep_mask`;
  featcache's own setting, no image is masked).
- **The gap and the thresholds** (``train_resnet.py``): gap = |g - g_masked| (no gradient). Before
  each step's loss, the logit-gap threshold moves as ``T_gap <- gap_lambda T_gap + (1 -
  gap_lambda) mean(gap over the observed positives of the batch)`` and the per-class logit
  average as ``T_avg <- avg_lambda T_avg + (1 - avg_lambda) mean over the batch of g``, both from
  0, without bias correction, in warm-up epochs too.
- **The loss** (``losses.py``, ``ignore_loss``): an unobserved entry is rejected when gap >
  T_gap and (``lat`` = 1) g > T_avg, except in the first ``warm_up`` epochs (``epoch <=
  warm_up``, 1-based). ``spbc_weight * mean over positives neglog(f) + ignore_weight * mean over
  the entries kept of AN(f_strong) + reg_weight * mean (g_strong - g)^2``, with ``neglog(x) =
  -log(x + 1e-5)``; the AN matrix is on the strongly augmented view's probabilities
  (RandAugment(3, 5), the authors' ``strong_aug`` default), the SPBC term on the plain view's. In
  stage two there is no augmentation of cached features: the strong view is the plain one, so the
  consistency term is 0 and the AN matrix is on the plain view.

Observed negatives (``--num-neg``) are kept and count as negatives (the authors' code has none);
only unobserved entries can be rejected, as in the authors' ``(pseudo - label).clip(0, 1)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from featcache.errors import LossStateError
from featcache.losses.base import MaskedPassLoss
from featcache.losses.needs import SPATIAL_FEATURES
from featcache.losses.params import Param, epoch_count, non_negative, switch, unit_interval
from featcache.losses.registry import register_loss
from featcache.losses.targets import Targets
from featcache.losses.terms import neglog

#: where these losses stand in ``featcache losses`` and ``--loss all`` (featcache.losses.registry)
CATALOG_ORDER = 110

SONG = "Song et al. ECCV 2024"
SONG_PAPER = ("IGNORE: Information Gap-based False Negative Loss Rejection for Single Positive "
              "Multi-Label Learning")


# ------------------------------------------------------------------------------------ the mask
def single_positive_rows(observed: Tensor) -> tuple[Tensor, Tensor]:
    """(rows with exactly one observed positive (B,) bool, that positive's class (B,) int64;
    0 for the other rows)."""
    positive = observed == 1
    return positive.sum(dim=-1) == 1, positive.to(torch.int64).argmax(dim=-1)


def positive_cam(cam: Tensor, classes: Tensor) -> Tensor:
    """The map of class ``classes[b]`` for every row b: ``cam`` (H, B, L, ...) -> (H, B, ...)."""
    index = classes.view(1, -1, 1, *([1] * (cam.dim() - 3)))
    index = index.expand(cam.shape[0], -1, 1, *cam.shape[3:])
    return cam.gather(2, index).squeeze(2)


def normalize_over_rows(cam: Tensor, rows: Tensor) -> Tensor:
    """The authors' ``cam_minmax_norm`` over the rows ``rows`` (B,) bool of ``cam`` (H, B, ...):
    ``(cam - min) / max``, min and max over those rows at each position (the other rows'
    values are meaningless). Masked reductions: no host sync, no special case for no rows."""
    chosen = rows.view(1, -1, *([1] * (cam.dim() - 2)))
    low = cam.masked_fill(~chosen, torch.inf).amin(dim=1, keepdim=True)
    high = cam.masked_fill(~chosen, -torch.inf).amax(dim=1, keepdim=True)
    return (cam - low) / high


def position_keep_mask(cam: Tensor, observed: Tensor, threshold: float | Tensor) -> Tensor:
    """Stage two: which positions of each row's feature map the masked pass keeps, (H, B, P)
    (1 kept, 0 zeroed), from the class activation maps ``cam`` (H, B, P, L) and the observed
    labels (B, L); rows without exactly one observed positive keep every position."""
    rows, classes = single_positive_rows(observed)
    maps = normalize_over_rows(positive_cam(cam.detach().transpose(2, 3), classes), rows)
    keep = (maps > threshold) | ~rows.view(1, -1, 1)
    return keep.to(cam.dtype)


def image_keep_mask(cam: Tensor, observed: Tensor, threshold: float,
                    size: tuple[int, int]) -> Tensor:
    """Stage three: the mask (B, 1, H, W) that multiplies the normalised images, from the class
    activation maps ``cam`` (B, L, h, w) (one head): normalised, interpolated to ``size``
    (bilinear, ``align_corners=False``), then thresholded, as the authors' code does."""
    rows, classes = single_positive_rows(observed)
    maps = normalize_over_rows(positive_cam(cam.detach().unsqueeze(0), classes), rows)[0]
    maps = F.interpolate(maps.unsqueeze(1), size=size, mode="bilinear", align_corners=False)
    keep = (maps > threshold) | ~rows.view(-1, 1, 1, 1)
    return keep.to(cam.dtype)


# ------------------------------------------------------------------------------------ the loss
def _weight(name: str, default: float, what: str) -> Param:
    return non_negative(default, f"weight of {what} (Song 2024's --{name}: {default:g})")


@register_loss
class Ignore(MaskedPassLoss):
    """``ignore``: SPBC + AN with false-negative rejection by the masked pass's logit gap
    + consistency between the strong and the plain view (Song et al. 2024; the authors' code
    gyeong-ryeol-song/SPML-IGNORE: losses.py, functions.py, train_resnet.py).
    Mask: the single positive's CAM, (cam - min) / max over the batch at each position, kept
    where > cam_threshold (stage three: interpolated to the image and multiplied into it;
    stage two, featcache's own setting: positions of the cached feature map zeroed). Gap
    |g - g_masked|; T_gap, T_avg moving averages (gap_lambda, avg_lambda) of the positives'
    mean gap and of each class's mean logit, updated before every step's loss. Unobserved
    entries with gap > T_gap and (lat) g > T_avg are rejected after warm_up epochs. Loss:
    spbc_weight mean neglog(f_pos) + ignore_weight mean of AN(f_strong) over kept entries +
    reg_weight mean (g_strong - g)^2; stage two has no strong view (the plain one: no
    consistency term). Per dataset: VOC spbc_weight 0.1 (the README's run), else config.py's.
    """

    name = "ignore"
    summary = ("IGNORE: AN on the strong view with the assumed negatives whose logit gap to the "
               "positive's CAM-masked pass is large rejected, + SPBC + consistency (needs spatial "
               "features in stage two).")
    reference = SONG
    paper = SONG_PAPER
    year = 2024
    needs = (SPATIAL_FEATURES,)
    params = {
        "spbc_weight": _weight("spbc_weight", 0.5, "the single-positive BCE term"),
        "ignore_weight": _weight("ignore_weight", 1.0, "the AN term with false negatives rejected"),
        "reg_weight": _weight("reg_weight", 0.5, "the strong/plain consistency term (0 in stage two)"),
        "gap_lambda": unit_interval(0.999, "momentum of the logit-gap threshold (moving average of "
                                           "the observed positives' mean gap)"),
        "avg_lambda": unit_interval(0.999, "momentum of the per-class logit-average threshold"),
        "cam_threshold": unit_interval(0.8, "the masked pass keeps positions whose normalised "
                                            "CAM of the single positive is above this"),
        "warm_up": epoch_count(3, "epochs without rejection (the first warm_up epochs)"),
        "lat": switch(1, "1: reject only where the logit is also above its class's moving "
                         "average (the authors' --lat); 0: the gap alone"),
    }
    #: the README's ResNet-50 run sets spbc_weight 0.1 for VOC; other datasets have no
    #: published run, so the authors' config.py defaults apply
    dataset_defaults: ClassVar = {"voc": {"spbc_weight": 0.1}}

    def init_state(self, observed: Tensor, clean: Tensor | None = None,
                   generator: torch.Generator | None = None,
                   initial: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        dtype = observed.dtype if observed.is_floating_point() else torch.float32
        heads, classes = self.num_heads, observed.shape[-1]
        return {"gap_threshold": torch.zeros(heads, 1, 1, dtype=dtype, device=observed.device),
                "avg_threshold": torch.zeros(heads, 1, classes, dtype=dtype,
                                             device=observed.device)}

    def position_mask(self, cam: Tensor, observed: Tensor) -> Tensor:
        """Stage two's mask of feature-map positions (H, B, P) from ``cam`` (H, B, P, L)."""
        return position_keep_mask(cam, observed, self.value("cam_threshold", cam))

    def image_mask(self, cam: Tensor, observed: Tensor, size: tuple[int, int]) -> Tensor:
        """Stage three's image mask (B, 1, H, W) from ``cam`` (B, L, h, w) (one head)."""
        return image_keep_mask(cam, observed, self.param_values["cam_threshold"][0], size)

    @torch.no_grad()
    def update_thresholds(self, logits: Tensor, gap: Tensor, positive: Tensor,
                          state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """One step of the two moving averages (in ``state``); their new values."""
        gap_t = self.state_tensor(state, "gap_threshold")
        avg_t = self.state_tensor(state, "avg_threshold")
        gap_lambda = self.value("gap_lambda", gap_t)
        avg_lambda = self.value("avg_lambda", avg_t)
        count = positive.sum().clamp(min=1)  # SPML batches have positives; no NaN otherwise
        gap_mean = (gap * positive).sum(dim=(-2, -1), keepdim=True) / count
        gap_t.copy_(gap_lambda * gap_t + (1 - gap_lambda) * gap_mean.to(gap_t.dtype))
        logit_mean = logits.sum(dim=1, keepdim=True) / logits.shape[1]
        avg_t.copy_(avg_lambda * avg_t + (1 - avg_lambda) * logit_mean.to(avg_t.dtype))
        return gap_t.to(logits.dtype), avg_t.to(logits.dtype)

    def rejected(self, logits: Tensor, masked: Tensor, observed: Tensor,
                 state: dict[str, Tensor], epoch: int) -> Tensor:
        """The entries whose loss is rejected (H, B, L) bool; updates the thresholds."""
        gap = (logits - masked).abs().detach()
        positive = (observed == 1).to(logits.dtype)
        gap_t, avg_t = self.update_thresholds(logits.detach(), gap, positive, state)
        candidate = (gap > gap_t) & (observed == 0)
        lat = self.value("lat", logits)  # per head (H, 1, 1) or one float: no host sync
        large = logits.detach() > avg_t
        if isinstance(lat, Tensor):
            candidate &= large | (lat == 0)
        elif lat:
            candidate &= large
        warm = self.value("warm_up", logits)  # 1-based epochs <= warm_up reject nothing
        if isinstance(warm, Tensor):
            return candidate & (epoch + 1 > warm)
        return candidate if epoch + 1 > warm else torch.zeros_like(candidate)

    def forward(self, logits: Tensor, targets: Targets, state: dict[str, Tensor],
                epoch: int) -> Tensor:
        if targets.masked is None:
            raise LossStateError(f"loss {self.name!r} compares the logits with those of a second "
                                 "forward pass on the masked input: pass them as Targets.masked")
        masked = targets.masked.to(logits.dtype)
        strong = logits if targets.strong is None else targets.strong
        observed = targets.observed
        reject = self.rejected(logits, masked, observed, state, epoch)
        positive = (observed == 1).to(logits.dtype)
        f, f_strong = torch.sigmoid(logits), torch.sigmoid(strong)
        spbc = (neglog(f) * positive).sum(dim=(-2, -1)) / positive.sum()
        an = positive * neglog(f_strong) + (1 - positive) * neglog(1 - f_strong)
        kept = (~reject).to(logits.dtype)
        rejection = (an * kept).sum(dim=(-2, -1)) / kept.sum(dim=(-2, -1))
        consistency = ((strong - logits) ** 2).mean(dim=(-2, -1))
        weights = [self.value(name, logits) for name in ("spbc_weight", "ignore_weight",
                                                          "reg_weight")]
        spbc_term, rejection_term, consistency_term = (
            _per_head(w) * term for w, term in zip(weights, (spbc, rejection, consistency),
                                                   strict=True))
        return spbc_term + rejection_term + consistency_term


def _per_head(weight: float | Tensor) -> float | Tensor:
    """A weight from :meth:`SPMLLoss.value` ((H, 1, 1) or a float) as one per head (H,)."""
    return weight.view(-1) if isinstance(weight, Tensor) else weight
