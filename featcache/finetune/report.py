"""Markdown summaries of stage-three results: one run's summary.md and its table of
configurations (stage two's are in :mod:`featcache.linear.report`)."""

from __future__ import annotations

from featcache.errors import plural
from featcache.protocol.records import observation_line
from featcache.published import PROTOCOL_DATASETS
from featcache.tables import Table


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
