"""``featcache train-linear`` from start to finish: data, losses, run folders, searches, outputs.

The click command only parses options into :class:`LinearOptions` and calls :func:`run_linear`;
the Python API and the pipeline recipes call it the same way. :func:`train_linear_phase` is
LinearInit's linear phase, which stage three asks for when no linear run fits.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from featcache.data.featurefile import FeatureFile, open_features
from featcache.data.labelfile import LabelSet, load_labels
from featcache.errors import FeatcacheWarning, Interrupted, plural
from featcache.fileio import write_text_if_changed
from featcache.heads import CAM_BLOCK, CAM_BLOCK_TENSORS
from featcache.linear.data import TrainingSplits, read_linear_data, split_rows
from featcache.linear.engine.search import SearchResult, SearchSpec, run_search, run_searches
from featcache.linear.lossrun import LinearOutcome, LossRun
from featcache.linear.memory import (
    FLOAT32,
    GroupShape,
    Placement,
    SplitSizes,
    allocated_memory,
    default_budget,
    mark_interpreter,
    parse_size,
    plan_placement,
    release_freed_memory,
)
from featcache.linear.options import LinearOptions
from featcache.linear.outputs import prepare_writing, run_settings, write_run
from featcache.linear.plan import LinearPlan, RunOutputs, SplitRowsOf, plan_linear
from featcache.linear.report import losses_table, run_summary
from featcache.linear.stream import load_streamed_data
from featcache.linear.zeroshot import ZERO_SHOT, score_zero_shot
from featcache.losses import SPATIAL_FEATURES, SPMLLoss, loss_class
from featcache.paths import labels_path, runs_dir
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.grid import LINEAR_EPOCHS
from featcache.protocol.handoff import LinearPhaseRequest
from featcache.protocol.loss_choice import needs_spatial, resolve_params
from featcache.protocol.runs import RunFolder, new_run_id, open_finished_or_new
from featcache.protocol.tensorboard_log import log_run, require_tensorboard
from featcache.runtime import (
    Ranks,
    describe_device,
    on_main,
    pick_device,
    ranks,
    usable_cpus,
)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_linear(options: LinearOptions, say: Callable[[str], None] = _stderr,
               on_run: Callable[[LossRun], None] | None = None) -> LinearOutcome:
    """Train (or reuse) the search of every chosen loss and, for several, write their table.

    Status lines (skipped losses, reused runs) go to ``say``; ``on_run`` sees each loss's run
    as soon as it is done.
    """
    mark_interpreter()  # --max-memory counts what the search allocates from here on
    options.validate()
    if options.tensorboard:
        require_tensorboard()
    budget = default_budget() if options.max_memory is None else parse_size(options.max_memory)
    with ranks(options.device) as job:
        if not job.is_main:  # one voice: rank 0 says what happens and writes every file
            say, on_run = (lambda _: None), None
        plan = plan_linear(options, budget, job, say)
        say(f"run id {plan.run_id}: {plan.runs}/<loss>/{plan.run_id}")
        return _run_linear(plan, job, say, on_run)


def _run_linear(plan: LinearPlan, job: Ranks, say: Callable[[str], None],
                on_run: Callable[[LossRun], None] | None) -> LinearOutcome:
    folders = _run_folders(plan)
    done: dict[str, LossRun] = {}

    def keep(run: LossRun) -> None:
        done[run.loss] = run
        if plan.tensorboard and job.is_main:
            log_run(plan.tensorboard, run.document, run.run_dir, replace=not run.reused)
        if on_run is not None:
            on_run(run)

    with locked_folders(job, folders.values()):
        if plan.zero_shot:
            assert plan.files.pooled is not None  # zero_shot_wanted: the row needs the pooled file
            keep(score_zero_shot(plan.labels, plan.files.pooled, folders[ZERO_SHOT],
                                 plan.val_variant, plan.outputs.overwrite, job.device, say, job))
        # Pooled losses train on the pooled features file, BoostLU's on the spatial one.
        for spatial in (False, True):
            these = [spec for spec in plan.specs if needs_spatial(spec.loss) == spatial]
            if these:
                _train_searches(plan, these, spatial, folders, job, say, keep, done)
    runs = [done[name] for name in [ZERO_SHOT] * int(plan.zero_shot)
            + [spec.loss for spec in plan.specs]]
    outcome = LinearOutcome(runs, list(plan.skipped))
    if len(runs) > 1:
        _write_losses_table(outcome, plan, job)
    return outcome


def _train_searches(plan: LinearPlan, these: Sequence[SearchSpec], spatial: bool,
                    folders: Mapping[str, Path], job: Ranks, say: Callable[[str], None],
                    keep: Callable[[LossRun], None], done: Mapping[str, LossRun]) -> None:
    """The searches of ``these`` losses, on the spatial features file or the pooled one, each
    kept as soon as it is written (a finished run with the same settings is reused)."""
    features = plan.files.spatial if spatial else plan.files.pooled
    assert features is not None  # the plan opened the file its losses read
    data = load_training_data(
        plan.labels, features, job.device, plan.budget, plan.stream,
        [(spec.loss, len(spec.configs(0)) // len(spec.batch_sizes)) for spec in these],
        groups=plan.groups, jobs=plan.jobs, say=say, pseudo_choice=plan.pseudo_labels,
        known_rows=plan.first_rows if features is plan.files.first else None)
    data = plan.mode.data(data)
    if job.is_main and these[0] is plan.specs[0]:
        for note in evaluation_notes(*evaluation_coverage(data, plan.val_variant)):
            warnings.warn(note, FeatcacheWarning, stacklevel=4)
    todo = _unfinished(data, these, folders, plan.outputs, say, job, keep)

    def finished(result: SearchResult) -> None:
        kept = plan.mode.refit(data, result, job.device)
        keep(write_loss_run(data, kept, folders[result.spec.loss], plan.outputs, job.device,
                            job))

    try:
        run_searches(data, todo, job.device, plan.outputs.progress,
                     planned_jobs(data, plan.jobs), job, on_done=finished,
                     on_idle=lambda: prepare_writing(data))
    except Interrupted as exc:
        raise exc.adding(interrupted_detail(plan.specs, done, plan.run_id,
                                            plan.given_run_id)) from None


def _run_folders(plan: LinearPlan) -> dict[str, Path]:
    """Each loss's run folder of the plan's run id (and the zero-shot row's when it is scored)."""
    losses = [spec.loss for spec in plan.specs] + ([ZERO_SHOT] if plan.zero_shot else [])
    return {loss: plan.runs / loss / plan.run_id for loss in losses}


def _unfinished(data: TrainingSplits, these: Sequence[SearchSpec], folders: Mapping[str, Path],
                outputs: RunOutputs, say: Callable[[str], None], job: Ranks,
                keep: Callable[[LossRun], None]) -> list[SearchSpec]:
    """The searches still to train: a finished run with these settings is reused (kept)."""
    todo = []
    for spec in these:
        reused = reuse_finished(data, spec, folders[spec.loss], outputs, say, job)
        if reused is not None:
            keep(reused)
        else:
            todo.append(spec)
    return todo


def _write_losses_table(outcome: LinearOutcome, plan: LinearPlan, job: Ranks) -> None:
    """The table of every loss of the run (``runs/table-<run-id>.md``, ``.csv``, ``.json``)."""
    outcome.table = losses_table(plan.labels.dataset,
                                 {run.loss: run.document for run in outcome.runs})
    out = plan.runs / f"table-{plan.run_id}"
    if job.is_main:
        write_text_if_changed(out.with_suffix(".md"), outcome.table.markdown())
        write_text_if_changed(out.with_suffix(".csv"), outcome.table.csv())
        write_text_if_changed(out.with_suffix(".json"),
                              json.dumps(outcome.table.records(), indent=2) + "\n")
    outcome.table_path = out.with_suffix(".md")


def interrupted_detail(specs: Sequence[SearchSpec], done: Mapping[str, LossRun], run_id: str,
                       given_id: str | None) -> str:
    """What an interrupted search kept, and the command that picks it up."""
    finished = [spec.loss for spec in specs if spec.loss in done]
    again = ("run the same command again" if given_id else
             f"run the same command again with --run-id {run_id}")
    if not finished:
        them = "them" if len(specs) > 1 else "it"
        return f"no loss had finished (run id {run_id}); {again} to train {them} from the start"
    return (f"{len(finished)} of {plural(len(specs), 'loss', 'losses')} finished and kept under run id {run_id} "
            f"({', '.join(finished)}); {again} to reuse them and train the rest")



def load_training_data(labels: LabelSet, features: FeatureFile, device: torch.device,
                       budget: int, stream: bool, losses: Sequence[tuple[str, int]], groups: int,
                       jobs: int | None, say: Callable[[str], None] = _stderr,
                       pseudo_choice: str | None = None,
                       known_rows: SplitRowsOf | None = None) -> TrainingSplits:
    """The search's data, in memory when it fits ``budget`` (the protocol's exact path), else
    with the training features streamed from the file (:mod:`featcache.linear.stream`).

    ``losses`` lists (loss, heads per group); ``groups`` counts the (seed, batch size) groups,
    of which ``jobs`` (default: one per core) train at once on the CPU.
    ``known_rows``: :func:`~featcache.linear.data.split_rows` of ``features`` when the caller
    has it (it is computed once per features file).
    """
    known_rows = known_rows or split_rows(labels, features)
    parts, _ = known_rows
    sizes = SplitSizes(len(parts["train"].rows), len(parts["val"].rows), len(parts["test"].rows),
                       labels.num_classes, features.dim)
    workers = 1 if device.type != "cpu" else max(1, jobs or usable_cpus())
    shapes = [group_shape(loss_class(name), heads, labels.train.clean is not None)
              for name, heads in losses]
    placement = _placement(sizes, features, shapes, workers, groups, budget, stream)
    if placement.in_memory:
        if placement.jobs:
            say(placement.describe())
        return replace(read_linear_data(labels, features, device, pseudo_choice, known_rows),
                       placement=placement)
    say(placement.describe())
    data = load_streamed_data(labels, features, placement, device, pseudo_choice, known_rows)
    release_freed_memory()  # what reading and checking freed goes back before training grows
    return data


def _placement(sizes: SplitSizes, features: FeatureFile, shapes: Sequence[GroupShape],
               workers: int, groups: int, budget: int, stream: bool) -> Placement:
    """The memory plan: the losses stacked in shared groups
    (:mod:`featcache.linear.engine.stacking`; cut into a piece per worker) when that fits in memory
    with every process asked for, else one loss's group at a time, as its own plan allows (fewer
    processes, streaming)."""
    concurrency = min(workers, groups)

    def plan(group: GroupShape) -> Placement:
        return plan_placement(sizes, features.dtype.itemsize, features.chunk_rows, group,
                              concurrency, budget, allocated_memory(), force_stream=stream)

    if len(shapes) > 1 and not stream:
        stacked = plan(GroupShape.stacked(shapes, pieces=concurrency))
        if stacked.in_memory and not stacked.jobs:
            return stacked
    alone = plan(max(shapes, key=lambda shape: shape.bytes(sizes), default=GroupShape(1)))
    return replace(alone, stacked=False) if len(shapes) > 1 else alone


def planned_jobs(data: TrainingSplits, jobs: int) -> int:
    """``jobs``, or fewer when the memory plan could afford only fewer processes."""
    placement = getattr(data, "placement", None)
    return placement.jobs if placement is not None and placement.jobs else jobs


def group_shape(loss: type[SPMLLoss], heads: int, train_map: bool) -> GroupShape:
    """What one group of ``loss`` keeps per training row, from what the loss declares."""
    keeps_state = loss.init_state is not SPMLLoss.init_state
    scoring = CAM_BLOCK_TENSORS * CAM_BLOCK * FLOAT32 if SPATIAL_FEATURES in loss.needs else 0
    return GroupShape(heads=heads, per_example_state=2 * keeps_state + len(loss.learned_state),
                      learned_state=len(loss.learned_state),
                      train_scores=loss.end_epoch is not SPMLLoss.end_epoch, train_map=train_map,
                      scoring_work=scoring)


def train_loss(data: TrainingSplits, spec: SearchSpec, run_dir: Path, outputs: RunOutputs,
               device: torch.device, say: Callable[[str], None], job: Ranks | None = None,
               jobs: int | None = None) -> LossRun:
    """One loss's search into ``run_dir``, or the finished run there when its settings match
    (``jobs``: CPU worker processes, default one per core).

    Under ``torchrun`` (``job``) the ranks share the groups; rank 0 alone touches the folder.
    """
    with locked_folders(job, [run_dir]):
        reused = reuse_finished(data, spec, run_dir, outputs, say, job)
        if reused is not None:
            return reused
        result = run_search(data, spec, device=device, progress=outputs.progress, jobs=jobs,
                            job=job)
        return write_loss_run(data, result, run_dir, outputs, device, job)


def locked_folders(job: Ranks | None, folders: Iterable[Path]) -> ExitStack:
    """The run folders' locks, held by the writer (rank 0) until the returned stack closes:
    a second process on the same run id is refused, naming this one (every rank stops)."""
    stack = ExitStack()

    def acquire() -> None:
        for folder in folders:
            stack.enter_context(RunFolder(folder).lock())

    try:
        on_main(job, acquire)
    except BaseException:
        stack.close()
        raise
    return stack


def reuse_finished(data: TrainingSplits, spec: SearchSpec, run_dir: Path, outputs: RunOutputs,
                   say: Callable[[str], None], job: Ranks | None) -> LossRun | None:
    """The finished run in ``run_dir`` when its settings match (else the folder is started
    for a new run, or refused when it finished with other settings)."""
    data = loss_class(spec.loss).fit_data(data)  # its pseudo-labels are part of its settings
    folder, reuse = on_main(job, lambda: open_finished_or_new(
        run_dir, run_settings(spec, data), outputs.overwrite, say))
    if not reuse:
        return None
    say(f"{spec.loss}: run {run_dir.name} already finished with these settings; reusing it")
    document = folder.results()
    return LossRun(spec.loss, run_dir, document, True, document["timings"]["seconds"])


def write_loss_run(data: TrainingSplits, result: SearchResult, run_dir: Path,
                   outputs: RunOutputs, device: torch.device, job: Ranks | None) -> LossRun:
    """Write a finished search's run folder (rank 0) and describe it (every rank)."""
    data = loss_class(result.spec.loss).fit_data(data)
    where = describe_device(device)
    if job is not None and job.world > 1:
        where += f", {plural(job.world, 'rank')} (torchrun)"
    document = on_main(job, lambda: write_run(run_dir, result, data, where,
                                              run_summary(result, data), plot=outputs.plots))
    return LossRun(result.spec.loss, run_dir, document, False, result.seconds)


def train_linear_phase(request: LinearPhaseRequest) -> Path:
    """LinearInit's linear phase (one configuration, 25 epochs) as a normal stage-two run."""
    device = pick_device(request.device)
    labels = load_labels(labels_path(request.dataset, request.cache), image_names=False)
    data = load_training_data(labels, open_features(request.features, labels), device,
                              default_budget(), False, [(request.loss, 1)], groups=1, jobs=1,
                              pseudo_choice=request.pseudo_labels)
    spec = SearchSpec(loss=request.loss, learning_rates=[request.lr],
                      batch_sizes=[request.batch_size],
                      params=resolve_params(request.loss, request.params, data.facts),
                      seeds=[request.seed], epochs=LINEAR_EPOCHS, val_variant=request.val_variant)
    run_dir = runs_dir(request.dataset, request.loss, request.cache) / new_run_id()
    return train_loss(data, spec, run_dir, RunOutputs(progress=request.progress), device,
                      _stderr).run_dir
