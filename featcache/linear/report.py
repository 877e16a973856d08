"""Markdown summaries of stage-two results: one run, and every loss side by side."""

from __future__ import annotations

from featcache.errors import plural
from featcache.linear.data import TrainingSplits
from featcache.linear.engine.search import SearchResult
from featcache.linear.zeroshot import ZERO_SHOT
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.records import observation_line
from featcache.protocol.table_cells import seed_choices
from featcache.published import PROTOCOL_DATASETS, published
from featcache.tables import Table


def config_table(result: SearchResult) -> Table:
    """Every configuration of every seed: its best epoch and metrics."""
    table = Table(["seed", "lr", "batch", "params", "best epoch", "val mAP", "test mAP", "train mAP"])
    shown = [k for k, values in result.spec.resolved_params.values.items()
             if len(values) > 1 or result.spec.resolved_params.sources.get(k) == "given"]
    for seed in result.seeds:
        for head in seed.heads:
            params = ", ".join([f"{k}={head.config.param_dict[k]:g}" for k in shown]
                               + ([f"wd={head.config.weight_decay:g}"] if result.probe else [])
                               ) or "-"
            best = head.best
            table.add(seed.seed, f"{head.config.lr:g}", head.config.batch_size, params,
                      head.best_epoch + 1, best.val_map if best.val_map is not None
                      else best.val_map_observed, best.test_map, best.train_map)
    return table


def run_summary(result: SearchResult, data: TrainingSplits) -> str:
    """The Markdown written to a run's summary.md."""
    spec = result.spec
    selected = result.selected
    summary = result.summary()
    lines = [
        f"# {data.dataset} / {spec.loss}: linear heads on {data.features.backbone} features",
        "",
        f"- train / val / test: {len(data.train)} / {len(data.val)} / {plural(len(data.test), 'image')}, "
        f"{plural(data.num_classes, 'class', 'classes')}",
        f"- grid: lr {', '.join(f'{x:g}' for x in spec.learning_rates)} x batch "
        f"{', '.join(map(str, spec.batch_sizes))}"
        + "".join(f" x {k} {', '.join(f'{v:g}' for v in values)}"
                  for k, values in spec.resolved_params.values.items() if len(values) > 1)
        + f", {plural(spec.epochs, 'epoch')}, {'seed' if len(spec.seeds) == 1 else 'seeds'} "
        f"{', '.join(map(str, spec.seeds))}, validation: {spec.val_variant}",
    ]
    if result.probe is not None:
        probe = result.probe
        lines.append(f"- probe search: {probe['features']} features, AdamW weight decay "
                     f"{', '.join(f'{v:g}' for v in probe['weight_decays'])}, base lr "
                     f"{', '.join(f'{v:g}' for v in probe['learning_rates_base'])} scaled as "
                     f"{probe['lr_scaling']} (the configurations' lr are the scaled ones), the selection "
                     "refit on train + val")
    if len(result.seeds) > 1:
        lines.append("- selected per seed: " + "; ".join(
            f"seed {s.seed}: lr {s.selected.config.lr:g}, batch {s.selected.config.batch_size}, "
            f"epoch {s.selected.best_epoch + 1}, test {s.selected.best.test_map:.2f}"
            for s in result.seeds))
        lines.append(f"- best.pt holds seed {selected.config.seed}'s head (the best validation mAP)")
    else:
        lines.append(f"- selected: lr {selected.config.lr:g}, batch {selected.config.batch_size}, "
                     f"epoch {selected.best_epoch + 1} (seed {selected.config.seed})")
    lines.append("- loss parameters: " + (", ".join(f"{k}={v:g}" for k, v in selected.config.params)
                                          or "none"))
    observation = observation_line(data.labels.observation)
    if observation:
        lines.append(observation)
    val_key = "val_map" if spec.val_variant == "clean" else "val_map_observed"
    if summary["seeds"] > 1:
        lines.append(f"- test mAP {summary['test_map_mean']:.2f} +- {summary['test_map_std']:.2f} "
                     f"over {plural(summary['seeds'], 'seed')} (val {summary[val_key + '_mean']:.2f})")
    else:
        lines.append(f"- test mAP {selected.best.test_map:.2f} (val {getattr(selected.best, val_key):.2f})")
    if selected.best.train_map is not None:
        lines.append(f"- training-set mAP against the full labels (label recovery): "
                     f"{selected.best.train_map:.2f}")
    reference = published("linear", spec.loss, data.dataset)
    if reference is not None:
        lines.append(f"- published (Cole et al. Table 1, linear): {reference:.1f}")
    lines.append(f"- time: {result.seconds:.1f} s" + (
        f", its share of the time {plural(result.shared['losses'], 'loss', 'losses')} trained together "
        "(results.json timings.shared)" if result.shared else ""))
    val_cover, test_cover = evaluation_coverage(data, spec.val_variant)
    for note in result.notes + evaluation_notes(val_cover, test_cover,
                                                getattr(selected.best, val_key),
                                                selected.best.test_map):
        lines.append(f"- note: {note}")
    lines += ["", "## Configurations", "", config_table(result).markdown()]
    return "\n".join(lines) + "\n"


#: the table's note when losses trained together: what their seconds are
SHARED_SECONDS = ("seconds: the losses trained together (stacked groups on shared workers), "
                  "each given its share of their wall time (results.json timings.shared), so the "
                  "column adds up to the time they took")


def losses_table(dataset: str, documents: dict[str, dict]) -> Table:
    """One row per loss: each seed's selected lr / batch / epoch (joined by ``/`` when there
    are several seeds), val and test mAP as mean +- std over seeds, published beside ours;
    with a ``zero-shot`` row (no training: ``-`` for lr, batch and epoch), each row's test mAP
    above it."""
    show_published = dataset in PROTOCOL_DATASETS
    baseline = documents.get(ZERO_SHOT)
    columns = ["loss", "lr", "batch", "epoch", "val mAP", "test mAP", "std", "train mAP"]
    if baseline is not None:
        columns += ["above zero-shot"]
    if show_published:
        columns += ["published", "delta"]
    columns += ["seconds"]
    shared = any(isinstance(doc.get("timings", {}).get("shared"), dict)
                 for doc in documents.values())
    table = Table(columns, notes=[SHARED_SECONDS] if shared else [])
    for loss, doc in documents.items():
        summary = doc["summary"]
        choices = seed_choices(doc, loss)
        val = summary.get("val_map_mean")
        if val is None:
            val = summary.get("val_map_observed_mean")
        test = summary["test_map_mean"]
        row = [loss, "/".join(_choice(c.lr, "g") for c in choices),
               "/".join(_choice(c.batch_size) for c in choices),
               "/".join(_choice(c.epoch) for c in choices), val, test,
               summary["test_map_std"] if summary["seeds"] > 1 else None, summary.get("train_map_mean")]
        if baseline is not None:
            row.append(test - baseline["summary"]["test_map_mean"])
        if show_published:
            reference = published("linear", loss, dataset)
            row += [reference, None if reference is None else test - reference]
        row.append(doc["timings"]["seconds"])
        table.add(*row)
    return table


def _choice(value: object, spec: str = "") -> str:
    """One selected setting, ``-`` where there is none (the zero-shot row)."""
    return "-" if value is None else format(value, spec)
