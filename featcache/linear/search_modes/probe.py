"""``--search probe``: the wider field's linear-probe conventions, on the same one-pass engine.

Frozen-feature evaluation outside the SPML papers differs from the protocol's search
(:mod:`featcache.linear.engine.search`) in four ways, all taken here:

- **L2-normalised features** (CLIP_benchmark's ``Featurizer(normalize=True)``): every row of
  every split is divided by its norm before training and scoring.
- **Weight decay searched beside the learning rate** (CLIP_benchmark's ``WeightDecayTuner``;
  DINOv3's linear evaluation grid of learning rates x weight decays): decoupled weight decay,
  ``torch.optim.AdamW``'s update, on the head's weight and bias (Adam with no decay is the
  protocol's optimizer; AdamW is CLIP_benchmark's). The whole lr x weight-decay x batch grid
  trains in one pass as stacked heads, each head with its own learning rate and decay.
- **Learning rates scaled with the batch size** (DINOv2's ``scale_lr``): the grid's learning
  rates are given for batch 256 and a head of batch size B trains at ``lr x B / 256``.
- **The selected setting refit on train + validation** (CLIP_benchmark's
  ``optimize_weight_decay`` then ``_evaluate`` on the train+val loader): after the selection
  (the protocol's: best epoch, then best configuration by validation mAP), the selected
  configuration trains again from the same initialisation on the training and validation rows
  together for the selected number of epochs; its last epoch's head is the run's head and its
  test mAP the run's test mAP. The validation mAP reported stays the selection's (the refit
  trained on those rows).

Default grid (docs/linear.md says why): base learning rates ``PROBE_LEARNING_RATES`` (DINOv3's
range, every decade from 1e-3 to 1) x weight decays ``PROBE_WEIGHT_DECAYS``
(CLIP_benchmark's first sweep ``logspace(-6, 2, 7)``, every second point) x the protocol's batch
sizes, 25 epochs, the protocol's selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from featcache.errors import InputError, OptionError
from featcache.linear.data import LinearData, SplitTensors, TrainingSplits
from featcache.linear.engine.search import SearchResult, SearchSpec, SeedResult, run_search
from featcache.linear.search_modes import LinearSearchMode, register_linear_search_mode
from featcache.losses import ResolvedParams
from featcache.protocol.loss_choice import needs_spatial
from featcache.protocol.search_modes.probe import (
    L2_NORMALISED,
    PROBE,
    PROBE_WEIGHT_DECAYS,
)
from featcache.protocol.selection import LAST_EPOCH

#: DINOv2's scale_lr: lr x batch size / 256
REFERENCE_BATCH = 256


def probe_losses(losses: list[str], skipped: list[tuple[str, str]], every: bool) -> list[str]:
    """The losses a probe search trains: pooled-feature ones. With ``--loss all`` the BoostLU
    losses join ``skipped`` with the reason; named, they are refused."""
    spatial = [name for name in losses if needs_spatial(name)]
    if spatial and not every:
        raise OptionError(f"--search probe trains on L2-normalised pooled features; "
                          f"{', '.join(spatial)} train BoostLU heads on feature maps: use "
                          "--search protocol for them")
    skipped += [(name, "trains on feature maps; --search probe normalises pooled features")
                for name in spatial]
    return [name for name in losses if name not in spatial]


def probe_spec(spec: SearchSpec, weight_decays: Sequence[float] | None = None) -> SearchSpec:
    """``spec`` as a probe search: its learning rates are for batch 256, weight decays added."""
    return replace(spec, search=PROBE.name, lr_reference_batch=REFERENCE_BATCH,
                   weight_decays=list(PROBE_WEIGHT_DECAYS if weight_decays is None
                                      else weight_decays))


def normalised(data: TrainingSplits) -> LinearData:
    """A copy whose features are L2-normalised row by row (every split); only data held in
    memory (a streamed search keeps its rows in the file)."""
    if not isinstance(data, LinearData):
        raise InputError("--search probe L2-normalises the features in memory, but these "
                         "features are streamed from the file (larger than --max-memory, or "
                         "--stream): raise --max-memory, or use --search protocol")
    if data.spatial_shape is not None:
        raise InputError(f"--search probe trains on pooled features; {data.features.path} "
                         "holds feature maps (BoostLU's heads): use --search protocol for "
                         "BoostLU losses")

    def unit(split: SplitTensors) -> SplitTensors:
        return replace(split, features=torch.nn.functional.normalize(split.features, dim=1))

    return replace(data, train=unit(data.train), val=unit(data.val), test=unit(data.test))


def train_and_val(data: LinearData) -> LinearData:
    """The training rows and the validation rows as one training split (the refit's); the
    validation and test splits stay as they are."""
    train, val = data.train, data.val

    def joined(a: Tensor | None, b: Tensor | None) -> Tensor | None:
        return None if a is None or b is None else torch.cat([a, b])

    merged = SplitTensors(features=torch.cat([train.features, val.features]),
                          observed=torch.cat([train.observed, val.observed]),
                          clean=joined(train.clean, val.clean),
                          rows=np.concatenate([train.rows, val.rows]))
    return replace(data, train=merged, pseudo_labels=None)


def refit(data: LinearData, result: SearchResult, device: torch.device | str,
          progress: bool = False) -> SearchResult:
    """Each seed's selected configuration trained again on train + validation for its selected
    number of epochs (``data``: the search's data before any loss fitted it); the result with
    those heads selected and the probe record (:attr:`SearchResult.probe`)."""
    merged = train_and_val(data)
    spec = result.spec
    seeds, refits = [], []
    for seed in result.seeds:
        chosen = seed.selected
        config = chosen.config
        params = ResolvedParams(values={k: [v] for k, v in config.params},
                                sources=dict(spec.resolved_params.sources),
                                estimates=dict(spec.resolved_params.estimates))
        one = SearchSpec(loss=spec.loss, learning_rates=[config.lr],
                         batch_sizes=[config.batch_size], params=params, seeds=[config.seed],
                         epochs=chosen.best_epoch + 1, val_variant=LAST_EPOCH,
                         weight_decays=[config.weight_decay], search=PROBE.name)
        head = run_search(merged, one, device=device, progress=progress, jobs=1).seeds[0].selected
        if head.config.key() != config.key():  # the same initialisation as the selected head
            raise AssertionError(f"refit of {config.key()} trained {head.config.key()}")
        refitted = replace(
            chosen, weight=head.weight, bias=head.bias, state=head.state, test_ap=head.test_ap,
            epochs=[*chosen.epochs[:chosen.best_epoch],
                    replace(chosen.best, test_map=head.best.test_map,
                            train_map=head.best.train_map)])
        seeds.append(SeedResult(seed=seed.seed, heads=seed.heads, selected=refitted))
        refits.append({"seed": seed.seed, "rows": len(merged.train), "epochs": len(head.epochs),
                       "test_map": head.best.test_map,
                       "test_map_before_refit": chosen.best.test_map,
                       "train_map": head.best.train_map, "train_loss": head.best.train_loss})
    record = {
        "name": PROBE.name,
        "features": L2_NORMALISED,
        "optimizer": "adamw (decoupled weight decay on the head's weight and bias)",
        "learning_rates_base": list(spec.learning_rates),
        "lr_scaling": f"lr x batch size / {spec.lr_reference_batch}",
        "weight_decays": list(spec.weight_decays),
        "selection": "the protocol's: best epoch, then best configuration by validation mAP",
        "refit": refits,
        "sources": {"features": "CLIP_benchmark (Featurizer normalize=True)",
                    "weight_decay": "CLIP_benchmark WeightDecayTuner; DINOv3 linear eval grid",
                    "lr_scaling": "DINOv2 eval/linear.py scale_lr",
                    "refit": "CLIP_benchmark: the tuned weight decay trained on train+val"},
    }
    return replace(result, seeds=seeds, probe=record,
                   notes=result.notes + [f"probe search: the selected configuration refit on "
                                         f"{len(merged.train)} train + validation rows; "
                                         "validation mAP is the selection's, test mAP the "
                                         "refit's"])


class ProbeHooks(LinearSearchMode):
    """``--search probe`` in stage two: pooled-feature losses only, the probe grid, L2-normalised
    rows, the selection refit on train + validation."""

    def losses(self, losses: list[str], skipped: list[tuple[str, str]], every: bool) -> list[str]:
        return probe_losses(losses, skipped, every)

    def spec(self, spec: SearchSpec, weight_decays: Sequence[float] | None) -> SearchSpec:
        return probe_spec(spec, weight_decays)

    def data(self, data: TrainingSplits) -> TrainingSplits:
        return normalised(data)

    def refit(self, data: TrainingSplits, result: SearchResult,
              device: torch.device) -> SearchResult:
        if not isinstance(data, LinearData):  # normalised() keeps only data in memory
            raise TypeError("the probe search refits on data held in memory")
        return refit(data, result, device)


PROBE_HOOKS = register_linear_search_mode(ProbeHooks(PROBE))
