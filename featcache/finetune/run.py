"""``featcache finetune`` from start to finish: data, start point, run folder, grid, outputs."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from featcache.errors import (
    FeatcacheWarning,
    InputError,
    Interrupted,
    OutputExistsError,
)
from featcache.finetune.budget import (
    SHORT_RUN_STEPS,
    check_disk,
    measure_seconds,
    plan_budget,
    training_steps,
)
from featcache.finetune.checkpoint import HISTORY
from featcache.finetune.data import FinetuneData, load_finetune_data
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.outputs import keep_best_scores, results_document, write_outputs
from featcache.finetune.plan import FinetunePlan, resolve_plan
from featcache.finetune.search import GridResult, run_grid
from featcache.finetune.start import StartPoint, resolve_start
from featcache.locks import OutputLock
from featcache.losses import loss_class
from featcache.paths import check_name, existing_labels, finetune_dir
from featcache.progress import say
from featcache.protocol.coverage import evaluation_coverage, evaluation_notes
from featcache.protocol.grid import GridPoint
from featcache.protocol.handoff import LinearPhase
from featcache.protocol.runs import RunFolder, latest_unfinished, new_run_id
from featcache.protocol.selection import resolve_val_variant
from featcache.protocol.tensorboard_log import log_run, require_tensorboard
from featcache.runtime import Ranks, backend_flags, on_main, ranks, training_threads


def run_finetune(options: FinetuneOptions, linear_phase: LinearPhase | None = None) -> str | None:
    """Run the whole command; returns the closing line on rank 0 (None on the others).

    ``linear_phase`` trains LinearInit's linear phase when ``--init best`` finds no linear run
    (the command passes stage two's :func:`featcache.linear.run.train_linear_phase`).
    """
    options.validate()
    if options.tensorboard:
        require_tensorboard()
    if options.run_id is not None:
        check_name(options.run_id, "--run-id")
    with ranks(options.device) as job:
        data, start, plan = prepare_run(options, job, linear_phase)
        identity = plan.run_settings(start, data)
        run_lock: dict[str, OutputLock] = {}
        threads = training_threads(job.device, plan.workers)

        def measured_budget(path: Path) -> None:
            # timed with the run's own threads (its steps' cost depends on them)
            with backend_flags(job.device, plan.precision, threads=threads):
                announce_budget(plan, start, data, plan.configs(), path, job, options.resume)

        def open_locked() -> Path:
            path, run_lock["lock"] = open_run_dir(options, identity, measured_budget)
            return path

        run_dir = on_main(job, open_locked)
        if job.is_main:
            say(f"run folder: {run_dir}")
        try:
            with backend_flags(job.device, plan.precision, cudnn_benchmark=True,
                               threads=threads, deterministic=plan.deterministic):
                result = _train_grid(plan, start, data, job, run_dir)
            if not job.is_main:
                return None
            document = results_document(result, plan, start, data, identity,
                                        plan.machine(job, result.schedule))
            keep_best_scores(run_dir, data, document)
            write_outputs(run_dir, document, result, plot=options.plots)
            if options.tensorboard:
                log_run(options.tensorboard, document, run_dir)
        finally:
            if "lock" in run_lock:
                run_lock["lock"].release()
        return _closing_line(plan, document, result, run_dir)


def prepare_run(options: FinetuneOptions, job: Ranks, linear_phase: LinearPhase | None = None
                ) -> tuple[FinetuneData, StartPoint, FinetunePlan]:
    """The run's data (fitted to its loss), its start point and its plan: the options resolved
    once. Rank 0 says how the validation labels were chosen and what the splits lack."""
    data = loss_class(options.loss).fit_data(load_finetune_data(
        existing_labels(options.dataset, options.cache), options.images_root,
        options.pseudo_labels))
    variant, note = resolve_val_variant(options.val_variant, data.val.clean is not None,
                                        data.labels.path)
    if job.is_main:
        if note:
            say(note)
        for note in evaluation_notes(*evaluation_coverage(data, variant)):
            warnings.warn(note, FeatcacheWarning, stacklevel=3)
    start = resolve_start(options, data, job, linear_phase, val_variant=variant)
    return data, start, resolve_plan(options, variant, start, data, job)


def _train_grid(plan: FinetunePlan, start: StartPoint, data: FinetuneData, job: Ranks,
                run_dir: Path) -> GridResult:
    """The grid, trained; an interruption says how to continue it."""
    try:
        return run_grid(plan.configs(), plan, start, data, job, run_dir, plan.schedule)
    except Interrupted as exc:
        raise exc.adding(f"continue with the same command and --resume --run-id "
                         f"{run_dir.name}") from None


def _closing_line(plan: FinetunePlan, document: dict, result: GridResult, run_dir: Path) -> str:
    """The command's last line: the selected configuration's scores and where the run is."""
    selection = document["selection"]
    val = selection["val_map"] if plan.val_variant == "clean" else selection["val_map_observed"]
    return (f"{plan.loss}: val {val:.2f}  test {selection['test_map']:.2f}  (lr "
            f"{selection['lr']:g}, batch {selection['batch_size']}, epoch {selection['epoch']}; "
            f"{result.seconds:.1f} s, {document['timings']['train_images_per_second']:.1f} "
            f"train images/s) -> {run_dir}")


def loss_params(loss: str, given: dict[str, float], data: FinetuneData) -> dict[str, float]:
    """Every parameter of ``loss``: ``given``, else the dataset's default, the data's (k), the
    default."""
    return loss_class(loss).resolve(given, facts=data.facts).single()


def open_run_dir(options: FinetuneOptions, settings: dict,
                 check: Callable[[Path], None] = lambda path: None) -> tuple[Path, OutputLock]:
    """The run folder and its lock, held (the caller releases it): a new folder, or
    (``--resume``) the interrupted one with the same settings. ``check(path)`` runs once the
    folder is locked and before a new one is created (the disk budget)."""
    root = finetune_dir(options.dataset, options.loss, options.cache)
    if options.resume:
        folder = RunFolder(root / options.run_id if options.run_id else latest_unfinished(root))
    else:
        folder = RunFolder(root / (options.run_id or new_run_id()))
    lock = folder.lock("wait for it to finish, stop it (Ctrl-C; it can be resumed), or choose "
                       "another --run-id").acquire()
    try:
        _check_run_dir(folder, options, settings)
        check(folder.path)
        if not options.resume:
            folder.start(settings, fresh=True)
    except BaseException:
        lock.release()
        raise
    return folder.path, lock


def _check_run_dir(folder: RunFolder, options: FinetuneOptions, settings: dict) -> None:
    if options.resume:
        if folder.finished:
            raise OutputExistsError(f"{folder.path} is a finished run: nothing to resume (pass "
                                    "--overwrite without --resume to train it again)")
        if folder.settings() is None:
            raise InputError(f"{folder.path} holds no fine-tuning run to resume (no run.json); "
                             "start it without --resume")
        folder.require_same(settings, "resume")
        return
    if folder.path.exists() and any(folder.path.iterdir()) and not options.overwrite:
        if folder.finished:
            raise OutputExistsError(f"{folder.path} holds a finished run; pass --overwrite to "
                                    "train it again or choose another --run-id")
        raise OutputExistsError(f"{folder.path} holds an unfinished run; pass --resume to continue "
                                "it, --overwrite to start it afresh, or another --run-id")


def configs_to_train(configs: Sequence[GridPoint], run_dir: Path,
                     resume: bool) -> list[GridPoint]:
    """The configurations a run will train: with ``--resume``, those without a finished
    history; otherwise all (``--overwrite`` trains the finished ones again)."""
    return [c for c in configs
            if not (resume and (run_dir / "configs" / c.name() / HISTORY).is_file())]


def announce_budget(plan: FinetunePlan, start: StartPoint, data: FinetuneData,
                    configs: Sequence[GridPoint], run_dir: Path, job: Ranks,
                    resume: bool = False) -> None:
    """Say the run's disk use and time before it starts; refuse when the disk cannot hold it."""
    left = configs_to_train(configs, run_dir, resume)
    budget = plan_budget(start, data, plan.loss, plan.params, len(left), plan.epochs,
                         plan.keep_checkpoints)
    budget.device, budget.image_size, budget.dataset = (job.device.type, start.image_size,
                                                        data.dataset)
    batch_sizes = [c.batch_size for c in left]
    steps = training_steps(len(data.train), batch_sizes, plan.epochs)
    if left and steps <= SHORT_RUN_STEPS:
        budget.short_steps = steps
    elif left:
        per_epoch = measure_seconds(start, data, plan.loss, batch_sizes,
                                    plan.eval_batch_size, plan.precision, job.device,
                                    plan.workers)
        budget.seconds = per_epoch * plan.epochs / max(1, job.world)
    check_disk(budget, run_dir, say)
