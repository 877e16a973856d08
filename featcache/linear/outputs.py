"""What a stage-two run leaves in ``<cache>/<dataset>/runs/<loss>/<run-id>/``.

``results.json`` (every configuration's per-epoch metrics, the selection with every loss
parameter, the settings and their fingerprint, timings, the sha256 of its inputs, the test
mAP's bootstrap interval), ``best.pt`` (the selected head and the loss's hand-off state: what
``featcache finetune --init best`` starts from, :mod:`featcache.protocol.handoff`),
``test-scores.h5`` (each seed's selected head's test scores), ``summary.md`` and ``curves.png``.
``results.json`` is written last, atomically: a folder without it is an unfinished run.

Each selected head (at its selected epoch) is scored again on the test rows by the kernel the
search's evaluation ran on them (the split's rows, one frozen head of the loss's kind), so the
kept test scores are the ones its recorded test AP came from; a run whose scores give another
AP (another BLAS path) says so in its notes (:func:`keep_selected_scores`). The selected head
of ``best.pt``, scored the same way on the validation rows, gives the scores its label sets are
calibrated on (``val-scores.h5``, :mod:`featcache.protocol.label_sets`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.evaluation import HeadResult
from featcache.linear.engine.member import create_heads
from featcache.linear.engine.search import SearchResult, SearchSpec
from featcache.linear.engine.trainer import feature_rows
from featcache.losses import create_loss, loss_class
from featcache.metrics import average_precision
from featcache.protocol.coverage import ClassCoverage, evaluation_coverage, evaluation_notes
from featcache.protocol.handoff import HEAD_FILE, save_head
from featcache.protocol.label_sets import Calibration, keep_label_sets
from featcache.protocol.plots import start_series
from featcache.protocol.records import document_header, machine_record
from featcache.protocol.runs import RESULTS, fingerprint
from featcache.protocol.uncertainty import keep_test_scores
from featcache.published import published
from featcache.stats import Resampling
from featcache.stats.label_sets import labelled_rows


def run_settings(result_spec: SearchSpec, data: TrainingSplits) -> dict:
    """The settings that decide whether a finished run can be reused (its fingerprint).

    A streamed run adds how it read the features (its shuffle differs from the protocol's);
    an in-memory run's settings are the protocol's alone.
    """
    settings = {"stage": "linear", "dataset": data.dataset, "labels_sha256": data.labels.sha256,
                "features_sha256": data.features.sha256, **result_spec.settings()}
    if data.pseudo_labels is not None:
        settings["pseudo_labels_sha256"] = data.pseudo_labels.sha256
    placement = getattr(data, "placement", None)
    if placement is not None and not placement.in_memory:
        settings["streaming"] = placement.settings()
    return settings


def _per_class(classes: Sequence[str], test_ap: Tensor) -> dict[str, float]:
    return {c: float(a) * 100 for c, a in zip(classes, test_ap.tolist(), strict=True)}


def _config_record(head: HeadResult, probe: bool = False) -> dict:
    config = head.config
    return {
        "seed": config.seed,
        "lr": config.lr,
        "batch_size": config.batch_size,
        **({"weight_decay": config.weight_decay} if probe else {}),
        "params": config.param_dict,
        "best_epoch": head.best_epoch + 1,
        "val_map": head.best.val_map,
        "val_map_observed": head.best.val_map_observed,
        "test_map": head.best.test_map,
        "train_map": head.best.train_map,
        "stopped_at": head.stopped_at,
        "epochs": [r.to_json() for r in head.epochs],
    }


def _selection_record(selected: HeadResult, classes: list[str], val_cover: ClassCoverage,
                      test_cover: ClassCoverage, val_key: str, probe: bool = False) -> dict:
    """The selected configuration of a search (``selection`` of results.json; ``probe``: with
    its weight decay, ``--search probe``)."""
    return {
        "seed": selected.config.seed, "lr": selected.config.lr,
        "batch_size": selected.config.batch_size, "params": selected.config.param_dict,
        **({"weight_decay": selected.config.weight_decay} if probe else {}),
        "epoch": selected.best_epoch + 1, "val_map": selected.best.val_map,
        "val_map_observed": selected.best.val_map_observed,
        "test_map": selected.best.test_map, "train_map": selected.best.train_map,
        "test_ap_per_class": _per_class(classes, selected.test_ap),
        "val_map_classes_with_positives": val_cover.map_over_present(
            getattr(selected.best, val_key)),
        "test_map_classes_with_positives": test_cover.map_over_present(
            selected.best.test_map),
    }


def _features_record(data: TrainingSplits) -> dict:
    """What results.json records of the features a run trained on."""
    return {"path": str(data.features.path), "sha256": data.features.sha256,
            "backbone": data.features.backbone, "dim": data.feature_dim,
            "weights": data.features.attrs.get("weights"),
            "weights_sha256": data.features.attrs.get("weights_sha256"), **_layout(data)}


def _grid_record(spec: SearchSpec) -> dict:
    """The grid a run searched, with every loss parameter's values and where they came from."""
    params = spec.resolved_params
    return {"lr": list(spec.learning_rates), "batch_size": list(spec.batch_sizes),
            "params": params.values, "params_source": params.sources,
            **({"params_estimates": params.estimates} if params.estimates else {}),
            "seeds": list(spec.seeds)}


def results_document(result: SearchResult, data: TrainingSplits, device: str) -> dict:
    """Everything worth keeping about a search, as JSON-ready data."""
    spec = result.spec
    selected = result.selected
    settings = run_settings(spec, data)
    placement = getattr(data, "placement", None)
    configs_epochs = sum(len(h.epochs) for s in result.seeds for h in s.heads)
    val_cover, test_cover = evaluation_coverage(data, spec.val_variant)
    val_key = "val_map" if spec.val_variant == "clean" else "val_map_observed"
    probe = result.probe is not None
    return {
        **document_header("linear", loss_class(spec.loss), data.labels),
        **({"probe": result.probe} if probe else {}),
        "features": _features_record(data),
        "head": head_kind(spec.loss, data),
        "sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test),
                  "classes": data.num_classes},
        "pseudo_labels": None if data.pseudo_labels is None else data.pseudo_labels.identity(),
        "protocol": {
            "optimizer": "adamw" if probe else "adam", "epochs": spec.epochs,
            "val_variant": spec.val_variant,
            "early_stop": spec.early_stop, "train_drop_last": True, "eval_every_example": True,
            "features": ("in memory, one permutation of every training row per epoch"
                         if placement is None or placement.in_memory else placement.describe()),
            **({} if placement is None else {"memory": placement.record()}),
        },
        "grid": _grid_record(spec),
        "selection": _selection_record(selected, data.classes, val_cover, test_cover, val_key,
                                       probe),
        "summary": result.summary(),
        "evaluation": {"validation": val_cover.to_json(), "test": test_cover.to_json()},
        "published": {
            "linear": published("linear", spec.loss, data.dataset),
            "recovery": published("recovery", spec.loss, data.dataset),
        },
        "seeds": [{"seed": seed.seed,
                   "selected": _config_record(seed.selected, probe) | {
                       "epochs": None,
                       "test_ap_per_class": _per_class(data.classes, seed.selected.test_ap)},
                   "configs": [_config_record(h, probe) for h in seed.heads]}
                  for seed in result.seeds],
        "notes": result.notes + evaluation_notes(val_cover, test_cover,
                                                 getattr(selected.best, val_key),
                                                 selected.best.test_map),
        "timings": {"seconds": result.seconds, "configuration_epochs": configs_epochs,
                    "configuration_epochs_per_second": configs_epochs / max(result.seconds, 1e-9),
                    **({"shared": result.shared} if result.shared is not None else {})},
        "machine": machine_record(device),
        "settings": settings,
        "fingerprint": fingerprint(settings),
    }


def _layout(data: TrainingSplits) -> dict:
    shape = data.spatial_shape
    return {} if shape is None else {"layout": "spatial", "spatial_shape": list(shape)}


def head_kind(loss: str, data: TrainingSplits) -> dict:
    """What the run's heads are, as recorded (:attr:`~featcache.heads.HeadKind.recorded`):
    ``linear`` on pooled features (a CAM head's weights are a linear head's), or ``boostlu`` (a
    1x1 convolution over spatial maps of ``spatial_shape`` (h, w, D), boosted by the ``alpha``
    of the loss parameters)."""
    kind = loss_class(loss).head.recorded
    return {"kind": kind.value, **({"spatial_shape": list(data.spatial_shape)}
                                   if kind.spatial and data.spatial_shape else {})}


def head_payload(result: SearchResult, data: TrainingSplits) -> dict:
    """The selected head with its loss parameters, hand-off state and input identity."""
    head = result.selected
    handoff = loss_class(result.spec.loss).handoff_state
    return {
        "dataset": data.dataset,
        "loss": result.spec.loss,
        "classes": list(data.classes),
        "weight": head.weight,
        "bias": head.bias,
        "handoff": {name: head.state[name] for name in handoff if name in head.state},
        "params": head.config.param_dict,
        "lr": head.config.lr,
        "batch_size": head.config.batch_size,
        "seed": head.config.seed,
        "epoch": head.best_epoch + 1,
        "val_map": head.best.val_map,
        "test_map": head.best.test_map,
        "train_rows": torch.as_tensor(data.train.rows),
        "labels_sha256": data.labels.sha256,
        "features_sha256": data.features.sha256,
        "features_path": str(data.features.path),
        "backbone": data.features.backbone,
        "weights": data.features.attrs.get("weights"),
        "weights_sha256": data.features.attrs.get("weights_sha256"),
        "weights_seed": data.features.attrs.get("weights_seed"),
        "image_size": data.features.attrs.get("image_size"),
        "transform": data.features.attrs.get("transform"),
        "feature_dim": data.feature_dim,
        "head": head_kind(result.spec.loss, data),
        # a probe run's head scores L2-normalised rows (featcache.linear.search_modes.probe)
        **({"features_transform": result.probe["features"]} if result.probe else {}),
    }


def write_run(run_dir: Path, result: SearchResult, data: TrainingSplits, device: str,
              summary_md: str, plot: bool = True) -> dict:
    """Write best.pt, summary.md, curves.png, then results.json last (marks the run finished)."""
    document = results_document(result, data, device)
    # curves.png is drawn (in the drawing process, where one runs) while the statistics are made
    curves = (start_curves(result, run_dir / "curves.png",
                           title=f"{data.dataset} / {result.spec.loss}") if plot else None)
    keep_selected_scores(run_dir, result, data, document)  # test-scores.h5, the interval
    save_head(run_dir / HEAD_FILE, head_payload(result, data))
    write_text_atomic(run_dir / "summary.md", summary_md)
    if curves is not None:
        curves()
    write_json_atomic(run_dir / RESULTS, document)
    return document


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


def prepare_writing(data: TrainingSplits) -> None:
    """Make now what writing any run of ``data`` needs, whatever its results: the bootstrap's
    image counts of the test rows (the interval's, and the label sets' of the rows with a
    positive; kept by :class:`~featcache.stats.Resampling`) and the sparse matrices the
    interval ranks with. The search calls it while a core is free (its last groups still
    training), so that the writing after them is shorter; the numbers are the same."""
    import scipy.sparse  # noqa: F401  (featcache.stats.RankedClasses imports it when first used)

    plan = Resampling()
    plan.keep_image_counts(len(data.test.observed))
    if data.test.clean is not None:
        plan.keep_image_counts(labelled_rows(data.test.clean.cpu().numpy()))


def plot_curves(result: SearchResult, path: Path, title: str = "") -> Path:
    """Save validation (solid) and test (dotted) mAP per epoch of every configuration of seed 0."""
    return start_curves(result, path, title)()


def start_curves(result: SearchResult, path: Path, title: str = "") -> Callable[[], Path]:
    """:func:`plot_curves` begun where the figures are drawn: the function returned waits for it
    (:func:`~featcache.protocol.plots.start_series`)."""
    curves = []
    for head in result.seeds[0].heads:
        label = f"lr={head.config.lr:g} bs={head.config.batch_size}"
        varied = [k for k, values in result.spec.resolved_params.values.items() if len(values) > 1]
        if varied:
            label += " " + " ".join(f"{k}={head.config.param_dict[k]:g}" for k in varied)
        curves.append((label, [r.epoch + 1 for r in head.epochs],
                       [r.val_map if r.val_map is not None else r.val_map_observed for r in head.epochs],
                       [r.test_map for r in head.epochs]))
    best = result.selected
    return start_series(curves, (best.best_epoch + 1, best.best_val), path, title)
