"""What a fine-tuning run leaves in ``<cache>/<dataset>/finetune/<loss>/<run-id>/``:
results.json, summary.md (:mod:`featcache.finetune.report`) and curves.png.

``results.json`` is written last, atomically: a run directory without it is unfinished (its
checkpoints let ``--resume`` continue). ``best.pt`` is written during the run
(:func:`featcache.finetune.search.write_best`), with the test probabilities of its epoch, which
go to ``test-scores.h5`` at the end (:func:`keep_best_scores`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.finetune.data import FinetuneData
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.records import ConfigResult
from featcache.finetune.report import summary_markdown
from featcache.finetune.search import BEST, GridResult
from featcache.finetune.start import StartPoint
from featcache.losses import loss_class
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.label_sets import Calibration, keep_label_sets
from featcache.protocol.plots import plot_series
from featcache.protocol.records import document_header, machine_record
from featcache.protocol.runs import RESULTS, fingerprint
from featcache.protocol.uncertainty import keep_test_scores
from featcache.published import published


def _config_record(result: ConfigResult) -> dict:
    best = result.best
    return {
        "lr": result.config.lr, "batch_size": result.config.batch_size,
        "best_epoch": best.epoch + 1,
        "val_map": best.val_map, "val_map_observed": best.val_map_observed,
        "test_map": best.test_map, "train_map": best.train_map, "stopped_at": result.stopped_at,
        "seconds": result.seconds, "epochs": [r.to_json() for r in result.epochs],
    }


def results_document(grid: GridResult, plan: FinetunePlan, start: StartPoint, data: FinetuneData,
                     run_settings: dict, machine: dict) -> dict:
    """Everything worth keeping about a fine-tuning run, as JSON-ready data."""
    selected = grid.selected
    best = selected.best
    epochs = [r for c in grid.configs for r in c.epochs]
    train_seconds = sum(r.train_seconds for r in epochs)
    images = sum(r.images_per_second * r.train_seconds for r in epochs)
    setting = "linearinit" if start.mode == "linear" else "finetune"
    loss = loss_class(plan.loss)
    val_cover, test_cover = evaluation_coverage(data, plan.val_variant)
    val_map = best.val_map if plan.val_variant == "clean" else best.val_map_observed
    return {
        **document_header("finetune", loss, data.labels),
        "images_root": str(data.root),
        "init": start.record,
        "backbone": {"name": start.backbone, **start.weights_identity,
                     "image_size": start.image_size, "preprocess": start.preprocess},
        "pseudo_labels": None if data.pseudo_labels is None else data.pseudo_labels.identity(),
        "sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test),
                  "classes": data.num_classes},
        "protocol": {
            "optimizer": "adam", "epochs": plan.epochs, "head_lr_mult": plan.head_lr_mult,
            "learned_state_lr_mult": {name: plan.params.get(param) for name, param in
                              loss.learned_state.items()},
            "val_variant": plan.val_variant, "early_stop": plan.early_stop,
            "seed": plan.seed, "train_transform": "resize, horizontal flip (seeded), normalize",
            "train_drop_last": True, "eval_every_example": True,
        },
        "grid": {"lr": run_settings["learning_rates"], "batch_size": run_settings["batch_sizes"]},
        "selection": {
            "lr": selected.config.lr, "batch_size": selected.config.batch_size,
            "params": plan.params,
            **({"params_estimates": plan.param_estimates} if plan.param_estimates else {}),
            "epoch": best.epoch + 1,
            "val_map": best.val_map, "val_map_observed": best.val_map_observed,
            "test_map": best.test_map, "train_map": best.train_map,
            "test_ap_per_class": {c: a * 100.0 for c, a in zip(data.classes, selected.test_ap,
                                                                strict=True)},
            "val_map_classes_with_positives": val_cover.map_over_present(val_map),
            "test_map_classes_with_positives": test_cover.map_over_present(best.test_map),
        },
        "evaluation": {"validation": val_cover.to_json(), "test": test_cover.to_json()},
        "configs": [_config_record(c) for c in grid.configs],
        "published": {
            "setting": setting,
            "finetune": published("finetune", plan.loss, data.dataset),
            "linearinit": published("linearinit", plan.loss, data.dataset),
        },
        "notes": start.notes + data.notes + evaluation_notes(val_cover, test_cover, val_map,
                                                             best.test_map),
        "timings": {"seconds": grid.seconds, "train_seconds": train_seconds,
                    "train_images_per_second": images / max(train_seconds, 1e-9),
                    "epochs": len(epochs)},
        "machine": machine_record(**machine),
        "settings": run_settings,
        "fingerprint": fingerprint(run_settings),
    }


def linear_start(document: dict) -> tuple[float | None, float | None] | None:
    """LinearInit's linear head, epoch 0 of every curve: its validation mAP (in the variant
    that selects: the linear run's clean one, none for observed labels) and test mAP; None
    from a fresh head."""
    init = document.get("init", {})
    if init.get("mode") != "linear":
        return None
    clean = document["protocol"]["val_variant"] == "clean"
    return (init.get("val_map") if clean else None), init.get("test_map")


def write_outputs(run_dir: Path, document: dict, grid: GridResult, plot: bool = True) -> None:
    """summary.md, curves.png, then results.json last (marks the run finished)."""
    write_text_atomic(run_dir / "summary.md", summary_markdown(document))
    if plot:
        variant = document["protocol"]["val_variant"]
        curves = [(f"lr={c.config.lr:g} bs={c.config.batch_size}", [r.epoch + 1 for r in c.epochs],
                   [r.selection(variant) for r in c.epochs], [r.test_map for r in c.epochs])
                  for c in grid.configs]
        selected = grid.selected
        plot_series(curves, (selected.best.epoch + 1, selected.best_val), run_dir / "curves.png",
                    title=f"{document['dataset']} / {document['loss']}: fine-tuned",
                    start=linear_start(document), start_label="LinearInit start")
    write_json_atomic(run_dir / RESULTS, document)


def keep_best_scores(run_dir: Path, data: FinetuneData, document: dict) -> None:
    """``test-scores.h5`` from the test probabilities ``best.pt`` keeps, and the run's interval
    in ``document`` (a run resumed from a ``best.pt`` written before featcache kept them has
    neither, and says so)."""
    import torch

    saved = torch.load(run_dir / BEST, map_location="cpu", weights_only=True, mmap=True)
    scores = saved.get("test_scores")
    if scores is None:
        document["notes"].append(f"no test-scores.h5: {run_dir / BEST} was written by a featcache "
                                 "that did not keep the test scores (no interval for this run)")
        return
    test = data.test
    targets = test.clean if test.clean is not None else (test.observed == 1).float()
    keep_test_scores(run_dir, scores.numpy(), [int(document["protocol"]["seed"])],
                     targets.numpy(), test.rows - len(data.labels.train), data.classes,
                     document, document["selection"]["test_map"])
    val_scores = saved.get("val_scores")
    if val_scores is None:
        document["notes"].append(f"no val-scores.h5: {run_dir / BEST} was written by a featcache "
                                 "that did not keep the validation scores (no label sets)")
        return
    calibration = Calibration(val_scores.numpy(), data.val.observed.numpy(),
                              np.asarray(data.val.rows), list(data.classes))
    keep_label_sets(run_dir, calibration, scores.numpy(), None if test.clean is None
                    else test.clean.numpy(), document)
