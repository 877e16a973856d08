"""The test scores of each seed's selected head, kept beside a stage-two run's results.

Each selected head (at its selected epoch) is scored again on the test rows by the kernel the
search's evaluation ran on them (the split's rows, one frozen head of the loss's kind), so the
scores are the ones its recorded test AP came from; a run whose scores give another AP (another
BLAS path) says so in its notes. They go to ``test-scores.h5``
(:mod:`featcache.protocol.test_scores`) and the run's interval to ``results.json``; the
selected head of ``best.pt``, scored the same way on the validation rows, gives the scores its
label sets are calibrated on (``val-scores.h5``, :mod:`featcache.protocol.label_sets`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from featcache.linear.data import TrainingSplits
from featcache.linear.engine.member import create_heads
from featcache.linear.engine.search import SearchResult
from featcache.linear.engine.trainer import HeadResult, feature_rows
from featcache.losses import create_loss
from featcache.metrics import average_precision
from featcache.protocol.label_sets import Calibration, keep_label_sets
from featcache.protocol.uncertainty import keep_test_scores

#: recomputed and recorded per-class test AP (fractions) agree within this
AGREEMENT = 1e-9


def test_targets(data: TrainingSplits) -> torch.Tensor:
    """The labels the test AP is computed against: full labels, else observed positives."""
    test = data.test
    return test.clean if test.clean is not None else (test.observed == 1).float()


def head_test_scores(data: TrainingSplits, loss: str, head: HeadResult,
                     split: str = "test") -> torch.Tensor:
    """One selected head's probabilities (N, L) on the test (or validation) rows, as its
    evaluation made them."""
    device = data.test.observed.device
    params = {name: [value] for name, value in head.config.param_dict.items()}
    kind = create_heads(create_loss(loss, data.num_classes, 1, params=params, facts=data.facts),
                        data.feature_dim, data.spatial_shape, data.num_classes,
                        [torch.Generator()], device=device)
    frozen = kind.frozen(head.weight.t().contiguous()[None].to(device),
                         head.bias.reshape(1, 1, -1).to(device))
    return feature_rows(getattr(data, split)).scores(frozen)[0]


def keep_selected_scores(run_dir: Path, result: SearchResult, data: TrainingSplits,
                         document: dict) -> None:
    """Write ``test-scores.h5`` of every seed's selected head and the run's interval."""
    targets = test_targets(data)
    scores, selected = [], 0
    for number, seed in enumerate(result.seeds):
        found = head_test_scores(data, result.spec.loss, seed.selected)
        selected = number if seed.selected is result.selected else selected
        ap = average_precision(found, targets.to(found.device)).cpu()
        if not torch.allclose(ap, seed.selected.test_ap.double(), rtol=0, atol=AGREEMENT):
            document["notes"].append(
                f"seed {seed.seed}: its test scores in test-scores.h5 give test mAP "
                f"{float(ap.mean()) * 100:.4f}, the search recorded "
                f"{float(seed.selected.test_ap.mean()) * 100:.4f} (another BLAS path)")
        scores.append(found.float().cpu().numpy())
    keep_test_scores(run_dir, np.stack(scores), [s.seed for s in result.seeds],
                     targets.cpu().numpy(), np.asarray(data.test.rows), data.classes, document,
                     document["summary"]["test_map_mean"])
    val = head_test_scores(data, result.spec.loss, result.selected, "val")
    calibration = Calibration(val.float().cpu().numpy(), data.val.observed.cpu().numpy(),
                              np.asarray(data.val.rows), list(data.classes))
    clean = data.test.clean
    keep_label_sets(run_dir, calibration, scores[selected],
                    None if clean is None else clean.cpu().numpy(), document)
