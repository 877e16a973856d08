"""``featcache finetune``: stage three, end-to-end fine-tuning from LinearInit or a fresh head."""

from __future__ import annotations

import click

from featcache.commands.common import (
    EPOCHS,
    TORCH_SEED,
    FiniteFloat,
    batch_sizes_option,
    cache_option,
    chosen_dataset,
    dataset_option,
    learning_rates_option,
    parse_params,
    preprocess_option,
    pseudo_labels_option,
    tensorboard_line,
    tensorboard_option,
    val_option,
)
from featcache.errors import plural


def _require_loss(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--loss is required (also when a recipe's step is checked): its error names the finished
    linear runs ``--init best`` could start from."""
    if value is not None or ctx.resilient_parsing:
        return value
    raise click.UsageError(_missing_loss(ctx.params.get("dataset"), ctx.params.get("cache"),
                                         ctx.params.get("init") or "best"), ctx=ctx)


@click.command("finetune")
@dataset_option()
@click.option("--loss", default=None, callback=_require_loss,
              help="The loss (`featcache losses` lists them)  [required; without it the "
                   "error names the finished linear runs --init best can start from].")
@click.option("--init", "init", default="best", show_default=True, metavar="best|none|PATH",
              help="best: the finished linear run of this loss with the best validation mAP on "
                   "these labels (trained first, with LinearInit's fixed hyperparameters, when there "
                   "is none); none: a fresh head (the papers' 'Fine-tuned' column); PATH: a linear "
                   "run directory or its best.pt.")
@learning_rates_option(help="Learning rates of the grid, comma-separated or repeated (backbone; "
                            "the head gets --head-lr-mult times it).")
@batch_sizes_option(help="Batch sizes of the grid, comma-separated or repeated (global: shared "
                         "among the ranks under torchrun; --bsize is an alias).")
@click.option("--epochs", default=10, show_default=True, type=EPOCHS,
              help="Fine-tuning epochs (the reference code's 10; Cole et al.'s paper says 5 for "
                   "LinearInit: --epochs 5).")
@click.option("--head-lr-mult", default=1.0, show_default=True, type=FiniteFloat(min=0, min_open=True),
              help="Learning-rate multiplier of the linear head (Kim et al. use 10).")
@click.option("--param", "param_pairs", multiple=True, metavar="NAME=VALUE",
              help="Loss parameter (repeatable). With LinearInit the linear run's values are the "
                   "default.")
@click.option("--linear-lr", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Learning rate of the linear phase when it must be trained first  [default: "
                   "LinearInit's: an-ls 1e-4, role 1e-3; required for other losses].")
@click.option("--linear-batch-size", "--linear-bsize", "linear_batch_size",
              type=click.IntRange(min=1), default=None,
              help="Batch size of that linear phase  [default: an-ls 8 (16 on nuswide), role 16 "
                   "(8 on cub); required for other losses].")
@click.option("--backbone", default=None,
              help="Backbone for --init none (`featcache backbones` lists them)  [default: "
                   "resnet50; with LinearInit: the run's].")
@click.option("--weights", default=None,
              help="v1, v2 (ResNets), a timm/open_clip pretrained tag, random or a checkpoint path  "
                   "[default: with LinearInit the run's weights (others are refused); with --init "
                   "none the backbone's default, v1 for ResNets].")
@click.option("--image-size", type=click.IntRange(min=32), default=None,
              help="Network input size SIZE x SIZE  [default: the linear run's features' size; "
                   "with --init none the backbone's, 448 for ResNets].")
@preprocess_option(
    help="With --init none: the backbone's own transform or the protocol's squash + ImageNet "
         "normalisation (see `featcache features --help`). LinearInit uses the transform of the "
         "run's features.")
@pseudo_labels_option
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto",
              show_default=True,
              help="auto: bf16 autocast on GPUs that have it (else fp16 with a grad scaler), fp32 "
                   "on the CPU. The loss is always computed in float32.")
@click.option("--compile", "use_compile", is_flag=True, default=False,
              help="torch.compile the network. Compiling is paid once per batch size (later "
                   "configurations of the grid reuse the graphs); it pays when it makes the step "
                   "faster by more than that share of the training time, which is least likely "
                   "at large batches, where the step already runs at its compute's rate "
                   "(docs/finetune.md; figures in docs/performance.md).")
@click.option("--deterministic", is_flag=True, default=False,
              help="GPU: deterministic cuDNN and PyTorch kernels, no autotuner (slower): the same "
                   "command gives the same bits, and a resumed run equals an uninterrupted one. "
                   "The CPU is deterministic anyway.")
@click.option("--schedule", type=click.Choice(["auto", "ddp", "per-gpu"]), default="auto",
              show_default=True,
              help="Under torchrun: ddp trains each configuration on all GPUs together; per-gpu "
                   "trains several configurations at once, one per GPU; auto uses per-gpu for "
                   "batches that would give a GPU fewer than 32 images (the protocol's 8 and 16), "
                   "ddp for larger ones.")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="DataLoader processes decoding images  [default: all CPUs but one per GPU; 1 "
                   "on the CPU].")
@click.option("--eval-batch-size", type=click.IntRange(min=1), default=None,
              help="Images per evaluation forward pass  [default: 256 on a GPU, 32 on the CPU].")
@val_option
@click.option("--early-stop", type=click.Choice(["none", "kim", "zhou"]), default="none",
              show_default=True,
              help="Per-configuration early stopping: Kim et al. (3-point drop below the best) or "
                   "Zhou et al. (first epoch that does not improve).")
@click.option("--seed", default=0, show_default=True, type=TORCH_SEED,
              help="Seeds the data order, the flips, a fresh head and the loss's initial state.")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda when available), cpu, cuda, cuda:N; under torchrun each rank uses "
                   "cuda:LOCAL_RANK.")
@click.option("--images-root", type=click.Path(file_okay=False), default=None,
              help="Folder the labels file's image paths are relative to (default: its image_root).")
@click.option("--run-id", default=None,
              help="Name of the run directory  [default: UTC time; with --resume the newest "
                   "unfinished run].")
@click.option("--resume", is_flag=True, default=False,
              help="Continue an interrupted run from its last finished epoch (same options).")
@click.option("--overwrite", is_flag=True, default=False,
              help="Start the run id afresh, discarding what an earlier run of that id left.")
@click.option("--keep-checkpoints", type=click.Choice(["last", "best", "all"]), default="last",
              show_default=True,
              help="What stays on disk besides the best weights (best.pt): last, the latest "
                   "epoch's checkpoint of the configuration in training (what --resume continues "
                   "from); best, no checkpoint (least disk: an interrupted configuration starts "
                   "over); all, every epoch's checkpoint (configs/<lr-bs>/epoch-NNN.pt). The disk "
                   "use and a time estimate are printed before training starts.")
@click.option("--no-plots", is_flag=True, help="Do not draw curves.png.")
@tensorboard_option
@click.option("--quiet", is_flag=True, help="No progress bars.")
@cache_option
def command(dataset, loss, init, learning_rates, batch_sizes, epochs, head_lr_mult, param_pairs,
            linear_lr, linear_batch_size, backbone, weights, image_size, preprocess, pseudo_labels,
            precision, use_compile, deterministic, schedule, workers, eval_batch_size, val_variant, early_stop,
            seed, device, images_root, run_id,
            resume, overwrite, keep_checkpoints, no_plots, tensorboard, quiet, cache):
    """Stage three: fine-tune the whole network end to end on the images.

    \b
    Every configuration of the lr x batch grid trains for --epochs from the same start (the
    linear run's head and, for ROLE, its label estimates phi; or a fresh head); the best epoch
    and configuration are selected by validation mAP. Writes
    <cache>/<dataset>/finetune/<loss>/<run-id>/: results.json (last), best.pt, summary.md,
    curves.png, and a checkpoint per epoch for --resume. Several GPUs:
      torchrun --nproc_per_node N -m featcache finetune --dataset voc --loss role
    """
    from featcache.finetune.options import FinetuneOptions
    from featcache.finetune.run import run_finetune
    from featcache.interrupt import safe_points
    from featcache.linear.run import train_linear_phase

    dataset = chosen_dataset(dataset, cache)
    params = parse_params(param_pairs)
    for name, values in params.items():
        if len(values) != 1:
            raise click.BadParameter(f"{name} has {plural(len(values), 'value')}; fine-tuning takes one value "
                                     "per loss parameter", param_hint="--param")
    options = FinetuneOptions(
        dataset=dataset, loss=loss, init=init, learning_rates=learning_rates,
        batch_sizes=batch_sizes, epochs=epochs, head_lr_mult=head_lr_mult,
        params={k: v[0] for k, v in params.items()}, linear_lr=linear_lr,
        linear_batch_size=linear_batch_size, backbone=backbone, weights=weights,
        image_size=image_size, preprocess=preprocess, pseudo_labels=pseudo_labels,
        precision=precision, compile=use_compile,
        deterministic=deterministic, schedule=schedule, workers=workers,
        eval_batch_size=eval_batch_size, val_variant=val_variant, early_stop=early_stop, seed=seed,
        device=device, images_root=images_root, run_id=run_id, resume=resume, overwrite=overwrite,
        keep_checkpoints=keep_checkpoints,
        plots=not no_plots, progress=not quiet, cache=cache, tensorboard=tensorboard,
    )
    with safe_points():  # stage three stops at its next step, keeping finished epochs
        outcome = run_finetune(options, linear_phase=train_linear_phase)
    if outcome is not None:
        click.echo(outcome)
        if tensorboard:
            click.echo(tensorboard_line(tensorboard), err=True)


def _missing_loss(dataset: str | None, cache: str | None, init: str) -> str:
    """``Missing option '--loss'``, with the finished linear runs of ``dataset`` (default: the
    only one prepared) that ``--init best`` could start from (at most a few run ids per loss);
    the plain line where the dataset cannot be read yet."""
    from featcache.errors import FeatcacheError

    message = "Missing option '--loss': the loss to fine-tune (`featcache losses` lists them)"
    try:
        return message + _runs_to_start_from(chosen_dataset(dataset, cache), cache, init)
    except FeatcacheError:  # no such dataset (yet): the missing option is the news
        return message


def _runs_to_start_from(dataset: str, cache: str | None, init: str) -> str:
    """'; ...' naming what ``--init best`` could start from on ``dataset`` ('' for another
    --init)."""
    import shlex

    from featcache.data.labelfile import load_labels
    from featcache.errors import name_list
    from featcache.paths import labels_path, runs_root
    from featcache.protocol.catalog import loss_names
    from featcache.protocol.loss_choice import WITHOUT_IMAGES
    from featcache.protocol.runs import finished_runs

    labels = load_labels(labels_path(dataset, cache), image_names=False)
    if labels.provenance.get("source_format") in WITHOUT_IMAGES:
        return (f"; but {dataset} has features and no images (imported or generated), "
                "so it cannot be fine-tuned end to end: its linear runs are final")
    if init != "best":
        return ""
    root = runs_root(dataset, cache)
    found = {folder.name: [run.name for run in finished_runs(folder)]
             for folder in sorted(root.iterdir()) if folder.is_dir()} if root.is_dir() else {}
    found = {loss: runs for loss, runs in found.items() if runs and loss in loss_names()}
    if not found:
        return (f"; {dataset} has no finished linear run yet, so --init best trains "
                "LinearInit's linear phase first (its hyperparameters are known for an-ls and role)")
    listed = "; ".join(f"{loss} ({name_list(runs, 3)})" for loss, runs in found.items())
    example = "role" if "role" in found else next(iter(found))
    return (f"; --init best can start from the finished linear runs of {dataset}: "
            f"{listed}, e.g. `featcache finetune --dataset {dataset} --loss {example}"
            f"{'' if cache is None else ' --cache ' + shlex.quote(str(cache))}`")
