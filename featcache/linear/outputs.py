"""What a stage-two run leaves in ``<cache>/<dataset>/runs/<loss>/<run-id>/``.

``results.json`` (every configuration's per-epoch metrics, the selection with every loss
parameter, the settings and their fingerprint, timings, the sha256 of its inputs, the test
mAP's bootstrap interval), ``best.pt`` (the selected head and the loss's hand-off state: what
``featcache finetune --init best`` starts from, :mod:`featcache.protocol.handoff`),
``test-scores.h5`` (each seed's selected head's test scores), ``summary.md`` and ``curves.png``.
``results.json`` is written last, atomically: a folder without it is an unfinished run.
"""

from __future__ import annotations

from pathlib import Path

import torch

from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.evaluation import HeadResult
from featcache.linear.engine.search import SearchResult, SearchSpec
from featcache.linear.selected_scores import keep_selected_scores
from featcache.losses import loss_class
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.handoff import HEAD_FILE, save_head
from featcache.protocol.records import document_header, machine_record
from featcache.protocol.runs import RESULTS, fingerprint
from featcache.published import published


def run_settings(result_spec, data: TrainingSplits) -> dict:
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


def _per_class(classes, test_ap) -> dict[str, float]:
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


def _selection_record(selected, classes: list[str], val_cover, test_cover, val_key: str,
                      probe: bool = False) -> dict:
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
    keep_selected_scores(run_dir, result, data, document)  # test-scores.h5, the interval
    save_head(run_dir / HEAD_FILE, head_payload(result, data))
    write_text_atomic(run_dir / "summary.md", summary_md)
    if plot:
        from featcache.linear.plots import plot_curves

        plot_curves(result, run_dir / "curves.png", title=f"{data.dataset} / {result.spec.loss}")
    write_json_atomic(run_dir / RESULTS, document)
    return document
