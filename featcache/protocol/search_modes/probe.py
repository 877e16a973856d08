"""``--search probe`` as every part of featcache sees it: the wider field's linear-probe
conventions (CLIP_benchmark, DINOv2), whose heads score L2-normalised rows and were refit with
AdamW weight decay, so they neither start fine-tuning nor become an ``SPMLClassifier``. Its
default grid is declared here; what stage two does with it is in
:mod:`featcache.linear.search_modes.probe` (docs/linear.md says why)."""

from __future__ import annotations

import numpy as np

from featcache.protocol.search_modes import (
    SearchMode,
    default_search_mode,
    register_search_mode,
)

#: base learning rates, for batch 256 (every decade from 1e-2 to 10)
PROBE_LEARNING_RATES = (1e-2, 1e-1, 1.0, 10.0)
#: CLIP_benchmark's first weight-decay sweep, np.logspace(-6, 2, 7), every second point
PROBE_WEIGHT_DECAYS = tuple(float(v) for v in np.logspace(-6, 2, 7)[::2])
#: what a probe run's head expects of its input rows (best.pt ``features_transform``)
L2_NORMALISED = "l2-normalised"


class ProbeSearch(SearchMode):
    name = "probe"
    help = ("the wider field's linear-probe conventions (CLIP_benchmark, DINOv2): "
            "L2-normalised features, weight decay searched beside the learning rate (AdamW), "
            "--lr given for batch 256 and scaled by batch/256 (default 1e-2,1e-1,1,10), the "
            "selection refit on train + validation (docs/linear.md).")
    features_transform = L2_NORMALISED
    learning_rates = PROBE_LEARNING_RATES
    searches_weight_decay = True
    weight_decay_help = ("the weight decays of the grid (default 1e-6,4.6e-4,0.215,100: "
                         "CLIP_benchmark's first sweep, every second point).")

    def head_rows(self, rows: np.ndarray) -> np.ndarray:
        """Each row divided by its norm (CLIP_benchmark's ``Featurizer(normalize=True)``)."""
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return (rows / np.maximum(norms, 1e-12)).astype(np.float32)

    def linear_init_refusal(self, where: str) -> str | None:
        return (f"{where} is a --search {self.name} run: its head scores "
                f"{self.features_transform} features, not the trunk's output; start from a "
                f"run of the protocol's search (--search {default_search_mode().name})")

    def estimator_refusal(self, where: str) -> str | None:
        # !s: the transform's name before "rows", not a count
        return (f"{where} is a --search {self.name} run: its head scores "
                f"{self.features_transform!s} rows and was refit with AdamW weight decay, which "
                "SPMLClassifier does not do; predict with the run itself (run.predict_proba)")


PROBE = register_search_mode(ProbeSearch())
