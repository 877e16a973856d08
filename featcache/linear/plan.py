"""A ``train-linear`` call resolved once: :func:`plan_linear` turns the options as given
(:class:`~featcache.linear.options.LinearOptions`) and the labels into a frozen
:class:`LinearPlan`: the search mode, the features files, the losses the data can train (and
those skipped, with why), each with its search and every parameter resolved and range-checked,
the validation variant, the worker processes, the run id. The rest of the command reads the
plan, never the options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from featcache.data.labelfile import LabelSet, load_labels
from featcache.linear.data import SplitRows, split_rows
from featcache.linear.engine.search import SearchSpec
from featcache.linear.options import LinearOptions
from featcache.linear.search_modes import LinearSearchMode, linear_search_mode
from featcache.linear.zeroshot import split_zero_shot, zero_shot_wanted
from featcache.paths import prepared_dataset
from featcache.protocol.feature_source import FeatureFiles, open_feature_files
from featcache.protocol.loss_choice import (
    choose_losses,
    requested_losses,
    resolve_params,
    split_params,
    training_facts,
)
from featcache.protocol.runs import new_run_id
from featcache.protocol.search_modes import search_mode
from featcache.protocol.selection import resolve_val_variant
from featcache.runtime import Ranks, on_main, worker_processes

#: each features file's rows of every split, and the notes on the rows dropped
SplitRowsOf = tuple[dict[str, SplitRows], list[str]]


@dataclass(frozen=True)
class RunOutputs:
    """How a run folder is written and what the command shows while it trains."""

    overwrite: bool = False  # a finished run with other settings is replaced, not refused
    plots: bool = True  # curves.png
    progress: bool = True  # progress bars


@dataclass(frozen=True)
class LinearPlan:
    """Everything a ``train-linear`` call does, resolved before any features are loaded."""

    runs: Path  # the dataset's runs folder: each loss's run is ``<runs>/<loss>/<run_id>``
    labels: LabelSet
    mode: LinearSearchMode
    files: FeatureFiles
    first_rows: SplitRowsOf  # the split rows of ``files.first``
    specs: tuple[SearchSpec, ...]  # one search per loss to train, in the order given
    skipped: tuple[tuple[str, str], ...]  # (loss, why) of ``--loss all``'s losses not trained
    zero_shot: bool  # whether CLIP's zero-shot row is scored
    val_variant: str  # resolved: clean or observed
    jobs: int  # CPU worker processes (before the memory plan)
    run_id: str
    given_run_id: str | None  # ``--run-id`` (None: made from the time)
    budget: int  # bytes for features and training state (``--max-memory``)
    stream: bool
    pseudo_labels: str | None
    epochs: int
    early_stop: str
    groups: int  # (seed, batch size) groups of a search
    outputs: RunOutputs
    tensorboard: str | None


def plan_linear(options: LinearOptions, budget: int, job: Ranks,
                say: Callable[[str], None]) -> LinearPlan:
    """The plan of a ``train-linear`` call whose options were validated; status lines (the
    backbone's file, the validation variant, skipped losses) go to ``say``."""
    folder = prepared_dataset(options.dataset, options.cache)
    labels = load_labels(folder.labels, image_names=False)
    zero_shot_asked, losses = split_zero_shot(options.losses)
    files = open_feature_files(options.dataset, options.backbone, folder.features, losses, labels,
                               say)
    first_rows = split_rows(labels, files.first)
    mode = linear_search_mode(search_mode(options.search))
    variant, specs, skipped, zero_shot = _search_specs(options, losses, mode, labels, files,
                                                       first_rows, zero_shot_asked, say)
    jobs, capped = worker_processes(options.jobs, job.local_world)
    if capped and job.device.type == "cpu":
        say(capped)
    run_id = on_main(job, lambda: options.run_id or new_run_id())
    return LinearPlan(
        runs=folder.runs, labels=labels, mode=mode, files=files,
        first_rows=first_rows, specs=tuple(specs), skipped=tuple(skipped), zero_shot=zero_shot,
        val_variant=variant, jobs=jobs, run_id=run_id, given_run_id=options.run_id,
        budget=budget, stream=options.stream, pseudo_labels=options.pseudo_labels,
        epochs=options.epochs, early_stop=options.early_stop,
        groups=len(options.seeds) * len(options.batch_sizes),
        outputs=RunOutputs(overwrite=options.overwrite, plots=options.plots,
                           progress=options.progress),
        tensorboard=options.tensorboard)


def _search_specs(options: LinearOptions, losses: str | Sequence[str], mode: LinearSearchMode,
                  labels: LabelSet, files: FeatureFiles, first_rows: SplitRowsOf,
                  zero_shot: str | None, say: Callable[[str], None]
                  ) -> tuple[str, list[SearchSpec], list[tuple[str, str]], bool]:
    """(the validation variant, the search of each loss the data can train, those skipped with
    why, whether the zero-shot row is scored): every parameter resolved and range-checked
    before any features are loaded."""
    parts, _ = first_rows
    pooled = files.pooled
    facts = training_facts(labels, parts["train"].observed(),
                           labels.train.clean is not None, options.pseudo_labels,
                           spatial=files.spatial is not None,
                           backbone=pooled.backbone if pooled else files.source.tag,
                           features_command=pooled.command if pooled else "")
    names = requested_losses(losses)
    chosen, skipped = (choose_losses(losses, facts, given=set(options.params))
                       if names else ([], []))
    zero_shot_scored = zero_shot_wanted(zero_shot, files, skipped)
    chosen = mode.losses(chosen, skipped, names == ["all"])
    variant, note = resolve_val_variant(options.val_variant, labels.train.clean is not None,
                                        labels.path)
    if note:
        say(note)
    for name, reason in skipped:
        say(f"skipping {name}: {reason}")
    given = split_params(options.params, chosen)
    specs = [mode.spec(SearchSpec(loss=name, learning_rates=list(options.learning_rates),
                                  batch_sizes=list(options.batch_sizes),
                                  params=resolve_params(name, given[name], facts),
                                  seeds=list(options.seeds), epochs=options.epochs,
                                  val_variant=variant, early_stop=options.early_stop),
                       options.weight_decays) for name in chosen]
    return variant, specs, skipped, zero_shot_scored
