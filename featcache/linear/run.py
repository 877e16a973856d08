"""``featcache train-linear`` from start to finish: data, losses, run folders, searches, outputs.

The click command only parses options into :class:`LinearOptions` and calls :func:`run_linear`;
the Python API and the pipeline recipes call it the same way. :func:`train_linear_phase` is
LinearInit's linear phase, which stage three asks for when no linear run fits.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featcache.errors import FeatcacheWarning
from featcache.fileio import write_text_atomic
from featcache.linear.data import LinearData, load_linear_data
from featcache.linear.outputs import run_settings, write_run
from featcache.linear.report import losses_table, run_summary
from featcache.linear.search import SearchSpec, run_search
from featcache.losses import loss_class
from featcache.paths import dataset_dir, existing_labels, find_features, labels_path, runs_dir
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.grid import BATCH_SIZES, LEARNING_RATES, LINEAR_EPOCHS, check_grid
from featcache.protocol.handoff import LinearPhaseRequest
from featcache.protocol.loss_choice import choose_losses, resolve_params, split_params
from featcache.protocol.results_table import seed_choices
from featcache.protocol.runs import new_run_id, open_finished_or_new
from featcache.protocol.selection import check_early_stop, check_val_variant
from featcache.runtime import describe_device, pick_device
from featcache.tables import Table


@dataclass
class LinearOptions:
    """Every option of ``featcache train-linear``."""

    dataset: str
    losses: str | Sequence[str] = "an-ls"
    learning_rates: Sequence[float] = LEARNING_RATES
    batch_sizes: Sequence[int] = BATCH_SIZES
    epochs: int = LINEAR_EPOCHS
    params: Mapping[str, Sequence[float]] = field(default_factory=dict)
    seeds: Sequence[int] = (0,)
    val_variant: str = "clean"
    early_stop: str = "none"
    backbone: str | None = None
    run_id: str | None = None
    jobs: int | None = None
    plots: bool = True
    progress: bool = True
    device: str = "auto"
    cache: str | None = None
    overwrite: bool = False
    pseudo_labels: str | None = None  # the pseudo-label set for the losses that need one


@dataclass
class LossRun:
    """One loss's run: its folder, its results document, and whether it was reused."""

    loss: str
    run_dir: Path
    document: dict
    reused: bool
    seconds: float = 0.0

    def line(self) -> str:
        """The closing line printed for this loss: with several seeds, the mean +- std the
        table shows and each seed's selection; the mAP over classes with positives when some
        class has none in the test split."""
        selection, summary = self.document["selection"], self.document["summary"]
        variant = self.document["protocol"]["val_variant"]
        key = "val_map" if variant == "clean" else "val_map_observed"
        if summary["seeds"] > 1:
            choices = "; ".join(f"seed {c.seed}: {c.describe()}"
                                for c in seed_choices(self.document, str(self.run_dir)))
            text = (f"{self.loss}: val {summary[key + '_mean']:.2f}  test "
                    f"{summary['test_map_mean']:.2f} +- {summary['test_map_std']:.2f} over "
                    f"{summary['seeds']} seeds  ({choices}")
        else:
            text = (f"{self.loss}: val {selection[key]:.2f}  test {selection['test_map']:.2f}  (lr "
                    f"{selection['lr']:g}, batch {selection['batch_size']}, epoch "
                    f"{selection['epoch']}")
        present = selection.get("test_map_classes_with_positives")
        if present is not None and abs(present - selection["test_map"]) > 1e-9:
            text += f"; test {present:.2f} over the classes with positives"
        return f"{text}; {self.seconds:.1f} s) -> {self.run_dir}"


@dataclass
class LinearOutcome:
    """What a ``train-linear`` call did: one run per loss, the losses skipped, the table."""

    runs: list[LossRun]
    skipped: list[tuple[str, str]]
    table: Table | None = None
    table_path: Path | None = None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_linear(options: LinearOptions, say: Callable[[str], None] = _stderr,
               on_run: Callable[[LossRun], None] | None = None) -> LinearOutcome:
    """Train (or reuse) the search of every chosen loss and, for several, write their table.

    Status lines (skipped losses, reused runs) go to ``say``; ``on_run`` sees each loss's run
    as soon as it is done.
    """
    check_grid(options.learning_rates, options.batch_sizes)
    check_early_stop(options.early_stop)
    device = pick_device(options.device)
    data = load_linear_data(existing_labels(options.dataset, options.cache),
                            find_features(options.dataset, options.backbone, options.cache),
                            device=device, pseudo_choice=options.pseudo_labels)
    facts = data.facts
    losses, skipped = choose_losses(options.losses, facts, given=set(options.params))
    check_val_variant(options.val_variant, data.val.clean is not None, data.labels.path)
    for name, reason in skipped:
        say(f"skipping {name}: {reason}")
    for note in evaluation_notes(*evaluation_coverage(data, options.val_variant)):
        warnings.warn(note, FeatcacheWarning, stacklevel=2)
    given = split_params(options.params, losses)
    # Every loss's parameters are resolved (and range-checked) before any loss trains.
    specs = [SearchSpec(loss=name, learning_rates=list(options.learning_rates),
                        batch_sizes=list(options.batch_sizes),
                        params=resolve_params(name, given[name], facts), seeds=list(options.seeds),
                        epochs=options.epochs, val_variant=options.val_variant,
                        early_stop=options.early_stop) for name in losses]
    run_id = options.run_id or new_run_id()
    runs = []
    for spec in specs:
        run = train_loss(data, spec, runs_dir(options.dataset, spec.loss, options.cache) / run_id,
                         options, device, say)
        runs.append(run)
        if on_run is not None:
            on_run(run)
    outcome = LinearOutcome(runs, skipped)
    if len(runs) > 1:
        outcome.table = losses_table(data.dataset, {run.loss: run.document for run in runs})
        out = dataset_dir(options.dataset, options.cache) / "runs" / f"table-{run_id}"
        write_text_atomic(out.with_suffix(".md"), outcome.table.markdown())
        write_text_atomic(out.with_suffix(".csv"), outcome.table.csv())
        write_text_atomic(out.with_suffix(".json"),
                          json.dumps(outcome.table.records(), indent=2) + "\n")
        outcome.table_path = out.with_suffix(".md")
    return outcome


def train_loss(data: LinearData, spec: SearchSpec, run_dir: Path, options: LinearOptions,
               device, say: Callable[[str], None]) -> LossRun:
    """One loss's search into ``run_dir``, or the finished run there when its settings match."""
    data = loss_class(spec.loss).fit_data(data)  # its pseudo-labels are part of its settings
    folder, reuse = open_finished_or_new(run_dir, run_settings(spec, data), options.overwrite)
    if reuse:
        say(f"{spec.loss}: run {run_dir.name} already finished with these settings; reusing it")
        document = folder.results()
        return LossRun(spec.loss, run_dir, document, True, document["timings"]["seconds"])
    result = run_search(data, spec, device=device, progress=options.progress, jobs=options.jobs)
    document = write_run(run_dir, result, data, describe_device(device), run_summary(result, data),
                         plot=options.plots)
    return LossRun(spec.loss, run_dir, document, False, result.seconds)


def train_linear_phase(request: LinearPhaseRequest) -> Path:
    """LinearInit's linear phase (one configuration, 25 epochs) as a normal stage-two run."""
    device = pick_device(request.device)
    data = load_linear_data(labels_path(request.dataset, request.cache), request.features,
                            device=device, pseudo_choice=request.pseudo_labels)
    spec = SearchSpec(loss=request.loss, learning_rates=[request.lr],
                      batch_sizes=[request.batch_size],
                      params=resolve_params(request.loss, request.params, data.facts),
                      seeds=[request.seed], epochs=LINEAR_EPOCHS, val_variant=request.val_variant)
    run_dir = runs_dir(request.dataset, request.loss, request.cache) / new_run_id()
    options = LinearOptions(dataset=request.dataset, progress=request.progress)
    return train_loss(data, spec, run_dir, options, device, _stderr).run_dir
