"""The pseudo-label rules, on cosine similarities between image views and class prompts.

``vlpl`` (Xing et al., github mvrl/VLPL @ ed09b59, ``models.py``): per image, q = softmax over
the classes of cos / temperature; a pseudo-positive where q > threshold (strict; q sums to 1,
so at most floor(1 / threshold) per image). With ``negative_ratio`` r > 0 (the reference's
``partial``, used only by its ``clip_vision`` branch) the floor(r L) classes of lowest q become
pseudo-negatives (-1), set after the positives.

``aevlp`` (Tran et al., github Fsoft-AIC/AEVLP @ 0bad82a, ``utils.get_pseudo_labels``, the
"DAMP" rule): S^g = softmax(cos_global / temperature) and S^v the same for each of the G x G
tiles; a = max_v S^v, b = min_v S^v, m = mean_v S^v; rho = the global score of the observed
positive, eta_n = min(rho, eta); F = (S^g + (a if a > eta_n else b)) / 2; the ``top_k`` classes
of largest F become pseudo-positives where F >= threshold. The floor(r L) classes of lowest
(S^g + m) / 2 are then set to 0 in the reference (so it never makes a pseudo-negative);
``mark_negatives`` sets them to -1 instead, the negatives AEVLP's GPR loss has a term for.

Both return int8 matrices (N, L) of 1 / 0 / -1; observed positives may be pseudo-positive too
(the losses use the observed label there). Ties in ``top_k`` and in the lowest classes are
broken by ``torch.topk`` (not specified), as in the reference.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

RULES = ("vlpl", "aevlp")

#: VLPL's main_clip.py defaults, the same for every dataset
VLPL_DEFAULTS = {"temperature": 0.01, "threshold": 0.3, "negative_ratio": 0.0}

#: AEVLP's configs/*.json and config.py (_LOOKUP: top_k); other datasets get COCO's values
AEVLP_DEFAULTS = {
    "voc": {"temperature": 0.01, "eta": 0.0, "threshold": 0.5, "top_k": 3, "negative_ratio": 0.2},
    "coco": {"temperature": 0.01, "eta": 0.3, "threshold": 0.5, "top_k": 3, "negative_ratio": 0.3},
    "nuswide": {"temperature": 0.01, "eta": 0.3, "threshold": 0.6, "top_k": 3,
                "negative_ratio": 0.2},
    "cub": {"temperature": 0.1, "eta": 0.005, "threshold": 0.005, "top_k": 32,
            "negative_ratio": 0.2},
}
AEVLP_GENERIC = AEVLP_DEFAULTS["coco"]
#: AEVLP's tile grid per dataset (``grid_size``: 5 for CUB, else 4)
AEVLP_GRID = {"cub": 5}


def rule_defaults(rule: str, dataset: str) -> dict:
    """Every parameter of ``rule`` with its default on ``dataset``."""
    if rule == "vlpl":
        return dict(VLPL_DEFAULTS)
    return dict(AEVLP_DEFAULTS.get(dataset, AEVLP_GENERIC), mark_negatives=False)


def cosine(images: Tensor, texts: Tensor) -> Tensor:
    """Cosines (..., L) between image embeddings (..., E) and class embeddings (L, E)."""
    images = torch.nn.functional.normalize(images.float(), dim=-1)
    texts = torch.nn.functional.normalize(texts.float(), dim=-1)
    return images @ texts.T


def vlpl_rule(similarity: Tensor, temperature: float = 0.01, threshold: float = 0.3,
              negative_ratio: float = 0.0) -> Tensor:
    """VLPL's pseudo-labels from cosines (N, L)."""
    q = torch.softmax(similarity / temperature, dim=-1)
    pseudo = (q > threshold).to(torch.int8)
    count = int(negative_ratio * similarity.shape[-1])
    if count > 0:
        lowest = torch.topk(q, count, dim=-1, largest=False).indices
        pseudo.scatter_(-1, lowest, -1)
    return pseudo


def aevlp_rule(global_similarity: Tensor, tile_similarity: Tensor, observed: Tensor,
               temperature: float = 0.01, eta: float = 0.3, threshold: float = 0.5,
               top_k: int = 3, negative_ratio: float = 0.3, mark_negatives: bool = False) -> Tensor:
    """AEVLP's (DAMP) pseudo-labels from global cosines (N, L), tile cosines (N, V, L) and the
    observed labels (N, L; 1 marks the observed positive)."""
    classes = global_similarity.shape[-1]
    s_global = torch.softmax(global_similarity / temperature, dim=-1)
    s_tiles = torch.softmax(tile_similarity / temperature, dim=-1)
    high, low = s_tiles.max(dim=1).values, s_tiles.min(dim=1).values
    mean = s_tiles.mean(dim=1)
    rho = (s_global * (observed == 1)).max(dim=-1).values
    gate = torch.minimum(rho, torch.tensor(eta, dtype=rho.dtype)).unsqueeze(-1)
    final = 0.5 * (s_global + torch.where(high > gate, high, low))
    values, indices = torch.topk(final, min(int(top_k), classes), dim=-1)
    pseudo = torch.zeros(final.shape, dtype=torch.int8)
    pseudo.scatter_(-1, indices, (values >= threshold).to(torch.int8))
    count = int(negative_ratio * classes)
    if count > 0:
        lowest = torch.topk(0.5 * (s_global + mean), count, dim=-1, largest=False).indices
        pseudo.scatter_(-1, lowest, -1 if mark_negatives else 0)
    return pseudo


def check_params(rule: str, params: dict) -> None:
    """ValueError naming a parameter outside its range."""
    checks = {
        "temperature": lambda v: v > 0, "threshold": lambda v: math.isfinite(v),
        "negative_ratio": lambda v: 0 <= v <= 1, "eta": lambda v: math.isfinite(v),
        "top_k": lambda v: v >= 1 and float(v).is_integer(),
    }
    ranges = {"temperature": "> 0", "threshold": "a number", "negative_ratio": "in [0, 1]",
              "eta": "a number", "top_k": "a whole number >= 1"}
    for key, value in params.items():
        if key in checks and not checks[key](value):
            raise ValueError(f"--{key.replace('_', '-')} {value}: must be {ranges[key]} ({rule} rule)")
