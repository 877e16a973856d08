"""Each run's card on the report page: its selected numbers, learning curves, configurations
and provenance (command, inputs, settings and their fingerprint), grouped by loss.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from featcache.errors import plural
from featcache.protocol.catalog import loss_names
from featcache.protocol.configurations import configurations, varying_params
from featcache.protocol.results_table import STAGES, features_text
from featcache.report.html import command_text, esc, number, setting
from featcache.report.runs import Run
from featcache.report.svg import PALETTE, Series, curves_svg, legend_html


def run_series(run: Run, only_selected: bool = False) -> list[Series]:
    """A run's configurations as curves (one colour per lr x batch x parameters)."""
    configs = configurations(run.document)
    varying = varying_params(configs)
    selection = run.document["selection"]
    colours: dict[str, str] = {}
    series = []
    for config in configs:
        if only_selected and not config.selected:
            continue
        key = f"lr {config.lr:g}, batch {config.batch_size}" + "".join(
            f", {k}={config.params[k]:g}" for k in varying if k in config.params)
        colour = colours.setdefault(key, PALETTE[len(colours) % len(PALETTE)])
        seeds = len({c.seed for c in configs})
        label = key + (f", seed {config.seed}" if seeds > 1 else "")
        records = config.epochs
        overall = (config.selected and config.lr == selection["lr"]
                   and config.batch_size == selection["batch_size"]
                   and config.seed == selection.get("seed", config.seed))
        series.append(Series(label, [r["epoch"] for r in records],
                             [r.get(config.val_key) for r in records],
                             [r.get("test_map") for r in records], colour,
                             config.best_epoch if config.selected else None, overall))
    return series


def run_card(run: Run) -> str:
    """A run's section: its selected numbers, curves, configurations and provenance."""
    document = run.document
    selection = document["selection"]
    variant = document.get("protocol", {}).get("val_variant", "clean")
    val_key = "val_map" if variant == "clean" else "val_map_observed"
    summary = document.get("summary", {})
    if summary.get("seeds", 1) > 1:
        headline = (f"test mAP {summary['test_map_mean']:.2f} ± {summary['test_map_std']:.2f} "
                    f"over {plural(summary['seeds'], 'seed')}; best seed {selection['seed']}: ")
    else:
        headline = ""
    headline += (f"val <b data-key=\"val\">{number(selection.get(val_key))}</b>, test "
                 f"<b data-key=\"test\">{number(selection['test_map'])}</b> (lr "
                 f"{setting(selection['lr'])}, batch {setting(selection['batch_size'])}, epoch "
                 f"{setting(selection['epoch'])})")
    series = run_series(run)
    stage = "fine-tuned" if run.stage == "finetune" else "linear"
    chart = curves_svg(series, f"{document['dataset']} / {run.loss} ({stage}): {run.run_id}")
    return (f'<article class="run" id="{run.anchor}"><h4>{esc(run.name)} '
            f'<span class="muted">({esc(STAGES.get(run.stage, run.stage))})</span></h4>'
            f"<p>{headline}</p>{chart}{legend_html(series)}"
            f"{configurations_html(run)}{provenance_html(run)}</article>")


def configurations_html(run: Run) -> str:
    """Every configuration's selected epoch and numbers (the selected ones marked)."""
    configs = configurations(run.document)
    if not configs:  # the zero-shot row trains nothing
        return ""
    varying = varying_params(configs)
    rows = "".join(
        f'<tr{" class=selected" if c.selected else ""}><td>{c.seed}</td><td>{c.lr:g}</td>'
        f"<td>{c.batch_size}</td><td>{esc(', '.join(f'{k}={c.params[k]:g}' for k in varying))}"
        f"</td><td>{c.best_epoch}</td><td data-v=\"{c.val_map!r}\">{number(c.val_map)}</td>"
        f'<td data-v="{c.test_map!r}">{number(c.test_map)}</td>'
        f"<td>{'&#9733;' if c.selected else ''}</td></tr>" for c in configs)
    return ("<details><summary>configurations (each at its best validation epoch)</summary>"
            '<table class="sortable small"><thead><tr><th>seed</th><th>lr</th><th>batch</th>'
            "<th>params</th><th>best epoch</th><th>val mAP</th><th>test mAP</th>"
            f"<th>selected</th></tr></thead><tbody>{rows}</tbody></table></details>")


def _shared_text(timings: dict) -> str:
    """', its share of ...' for a run trained beside other losses (an older run: '')."""
    shared = timings.get("shared")
    if not isinstance(shared, dict) or not shared.get("losses"):
        return ""
    return f", its share of the time {plural(shared['losses'], 'loss', 'losses')} trained together"


def provenance_html(run: Run) -> str:
    """What made the run: command, time, version, inputs, settings and their fingerprint."""
    document = run.document
    inputs = [f"labels {document.get('labels', {}).get('path')} (sha256 "
              f"{document.get('labels', {}).get('sha256')})"]
    if "features" in document:
        features = document["features"]
        weights = features.get("weights")  # none: imported features, made by no backbone here
        inputs.append(f"features {features.get('path')}: {features_text(features)} "
                      f"({f'{weights} weights; ' if weights not in (None, '', 'none') else ''}sha256 "
                      f"{features.get('sha256')})")
    if "backbone" in document:
        backbone = document["backbone"]
        inputs.append(f"network {backbone.get('name')} ({backbone.get('weights')} weights), "
                      f"{backbone.get('image_size')} px")
    if document.get("init", {}).get("mode") == "linear":
        inputs.append(f"LinearInit from {document['init'].get('run_dir')}")
    machine, timings = document.get("machine", {}), document.get("timings", {})
    lines = [f"<dt>command</dt><dd><code>{esc(command_text(document))}</code></dd>",
             f"<dt>made</dt><dd>{esc(document.get('created'))}, featcache "
             f"{esc(document.get('featcache_version'))}, {esc(machine.get('device'))}, "
             f"{number(timings.get('seconds'), 1)} s{esc(_shared_text(timings))}</dd>",
             f"<dt>inputs</dt><dd>{'<br>'.join(esc(text) for text in inputs)}</dd>",
             f"<dt>fingerprint</dt><dd><code>{esc(document.get('fingerprint'))}</code></dd>",
             f"<dt>loss parameters</dt><dd>{esc(_params(document['selection']['params']))}</dd>"]
    notes = "".join(f"<li>{esc(note)}</li>" for note in document.get("notes", []))
    settings = json.dumps(document.get("settings", {}), indent=1, sort_keys=True)
    return (f'<dl class="provenance">{"".join(lines)}</dl>'
            + (f'<ul class="notes">{notes}</ul>' if notes else "")
            + f"<details><summary>settings (the fingerprint's input)</summary><pre>"
              f"{esc(settings)}</pre></details>")


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in params.items()) or "none"


def curves_section(runs: Sequence[Run]) -> str:
    """Every run's card, grouped by loss in the registry's order."""
    order = {name: i for i, name in enumerate(loss_names())}
    losses = sorted({run.loss for run in runs}, key=lambda n: (order.get(n, len(order)), n))
    parts = []
    for loss in losses:
        cards = "".join(run_card(run) for run in runs if run.loss == loss)
        parts.append(f'<section class="loss" id="loss-{esc(loss)}"><h3>{esc(loss)}</h3>'
                     f"{cards}</section>")
    return "".join(parts)
