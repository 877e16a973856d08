"""What a fine-tuning run leaves behind: results.json, summary.md and curves.png.

``results.json`` is written last, atomically: a run directory without it is unfinished (its
checkpoints let ``--resume`` continue). ``best.pt`` is written during the run
(:func:`featcache.finetune.search.write_best`).
"""

from __future__ import annotations

from pathlib import Path

from featcache.errors import plural
from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.finetune.data import FinetuneData
from featcache.finetune.loop import ConfigResult, Settings
from featcache.finetune.search import GridResult
from featcache.finetune.start import StartPoint
from featcache.losses import loss_class
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.plots import plot_series
from featcache.protocol.records import document_header, machine_record, observation_line
from featcache.protocol.runs import RESULTS, fingerprint
from featcache.published import PROTOCOL_DATASETS, published
from featcache.tables import Table


def _config_record(result: ConfigResult) -> dict:
    best = result.best
    return {
        "lr": result.config.lr, "batch_size": result.config.batch_size,
        "best_epoch": best.epoch + 1,
        "val_map": best.val_map, "val_map_observed": best.val_map_observed,
        "test_map": best.test_map, "train_map": best.train_map, "stopped_at": result.stopped_at,
        "seconds": result.seconds, "epochs": [r.to_json() for r in result.epochs],
    }


def results_document(grid: GridResult, settings: Settings, start: StartPoint, data: FinetuneData,
                     run_settings: dict, machine: dict) -> dict:
    """Everything worth keeping about a fine-tuning run, as JSON-ready data."""
    selected = grid.selected
    best = selected.best
    epochs = [r for c in grid.configs for r in c.epochs]
    train_seconds = sum(r.train_seconds for r in epochs)
    images = sum(r.images_per_second * r.train_seconds for r in epochs)
    setting = "linearinit" if start.mode == "linear" else "finetune"
    loss = loss_class(settings.loss)
    val_cover, test_cover = evaluation_coverage(data, settings.val_variant)
    val_map = best.val_map if settings.val_variant == "clean" else best.val_map_observed
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
            "optimizer": "adam", "epochs": settings.epochs, "head_lr_mult": settings.head_lr_mult,
            "learned_state_lr_mult": {name: settings.params.get(param) for name, param in
                              loss.learned_state.items()},
            "val_variant": settings.val_variant, "early_stop": settings.early_stop,
            "seed": settings.seed, "train_transform": "resize, horizontal flip (seeded), normalize",
            "train_drop_last": True, "eval_every_example": True,
        },
        "grid": {"lr": run_settings["learning_rates"], "batch_size": run_settings["batch_sizes"]},
        "selection": {
            "lr": selected.config.lr, "batch_size": selected.config.batch_size,
            "params": settings.params,
            **({"params_estimates": settings.param_estimates} if settings.param_estimates else {}),
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
            "finetune": published("finetune", settings.loss, data.dataset),
            "linearinit": published("linearinit", settings.loss, data.dataset),
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


def config_table(document: dict) -> Table:
    table = Table(["lr", "batch", "best epoch", "val mAP", "test mAP", "train mAP", "stopped",
                   "seconds"])
    variant = document["protocol"]["val_variant"]
    for config in document["configs"]:
        val = config["val_map"] if variant == "clean" else config["val_map_observed"]
        table.add(f"{config['lr']:g}", config["batch_size"], config["best_epoch"], val,
                  config["test_map"], config["train_map"], config["stopped_at"], config["seconds"])
    return table


def summary_markdown(document: dict) -> str:
    """The Markdown written to a run's summary.md."""
    selection, init = document["selection"], document["init"]
    variant = document["protocol"]["val_variant"]
    val = selection["val_map"] if variant == "clean" else selection["val_map_observed"]
    sizes = document["sizes"]
    backbone = document["backbone"]
    if init.get("mode") == "linear":
        start = (f"LinearInit from {init['run_dir']} ({init['loss']}, lr {init['lr']:g}, batch "
                 f"{init['batch_size']}, epoch {init['epoch']}, val {init['val_map']:.2f}"
                 + (f", with its {', '.join(init['handoff'])}" if init.get("handoff") else "") + ")")
    else:
        start = "a fresh linear head (--init none)"
    lines = [
        f"# {document['dataset']} / {document['loss']}: fine-tuned end to end",
        "",
        f"- train / val / test: {sizes['train']} / {sizes['val']} / {plural(sizes['test'], 'image')}, "
        f"{plural(sizes['classes'], 'class', 'classes')}",
        f"- network: {backbone['name']} ({backbone.get('weights')} weights), "
        f"{backbone['image_size']}x{backbone['image_size']} images; start: {start}",
        f"- grid: lr {', '.join(f'{x:g}' for x in document['grid']['lr'])} x batch "
        f"{', '.join(map(str, document['grid']['batch_size']))}, {document['protocol']['epochs']} "
        f"epochs, head lr x{document['protocol']['head_lr_mult']:g}, validation: {variant}",
        f"- selected: lr {selection['lr']:g}, batch {selection['batch_size']}, epoch "
        f"{selection['epoch']}",
        "- loss parameters: " + (", ".join(f"{k}={v:g}" for k, v in selection["params"].items())
                                 or "none"),
        f"- test mAP {selection['test_map']:.2f} (val {val:.2f})",
    ]
    observation = observation_line(document["labels"].get("observation"))
    if observation:
        lines.append(observation)
    if selection.get("train_map") is not None:
        lines.append(f"- training-set mAP of the predictions made while training: "
                     f"{selection['train_map']:.2f}")
    if document["dataset"] in PROTOCOL_DATASETS:
        refs = document["published"]
        for key, name in (("finetune", "fine-tuned (Cole et al. Table 1 / later work)"),
                          ("linearinit", "+LinearInit (Cole et al. Table 1)")):
            if refs.get(key) is not None:
                lines.append(f"- published, {name}: {refs[key]:.1f}")
    timings, machine = document["timings"], document["machine"]
    lines.append(f"- time: {timings['seconds']:.1f} s; training {timings['train_images_per_second']:.1f} "
                 f"images/s on {machine['device']} ({machine['precision']}"
                 f"{', compiled' if machine.get('compile') else ''}, {plural(machine['world_size'], 'rank')})")
    for note in document["notes"]:
        lines.append(f"- note: {note}")
    lines += ["", "## Configurations", "", config_table(document).markdown()]
    return "\n".join(lines) + "\n"


def write_outputs(run_dir: Path, document: dict, grid: GridResult, plot: bool = True) -> None:
    """summary.md, curves.png, then results.json last (marks the run finished)."""
    write_text_atomic(run_dir / "summary.md", summary_markdown(document))
    if plot:
        variant = document["protocol"]["val_variant"]
        curves = [(f"lr={c.config.lr:g} bs={c.config.batch_size}", [r.epoch + 1 for r in c.epochs],
                   [r.selection(variant) for r in c.epochs], [r.test_map for r in c.epochs])
                  for c in grid.configs]
        selected = grid.selected
        init = document["init"]
        start = None
        if init.get("mode") == "linear":  # epoch 0: the linear head fine-tuning starts from
            start = (init.get("val_map") if variant == "clean" else None, init.get("test_map"))
        plot_series(curves, (selected.best.epoch + 1, selected.best_val), run_dir / "curves.png",
                    title=f"{document['dataset']} / {document['loss']}: fine-tuned", start=start,
                    start_label="LinearInit start")
    write_json_atomic(run_dir / RESULTS, document)
