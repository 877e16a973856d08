"""``featcache train-linear``: the protocol's search for one loss, several, or all of them."""

from __future__ import annotations

import click

from featcache.commands.common import (
    EPOCHS,
    FINITE,
    TORCH_SEED,
    batch_sizes_option,
    cache_option,
    chosen_dataset,
    dataset_option,
    learning_rates_option,
    overwrite_option,
    parse_number_list,
    parse_params,
    pseudo_labels_option,
    tensorboard_line,
    tensorboard_option,
    val_option,
)
from featcache.commands.repeated import ListOption, named_losses
from featcache.protocol.search_modes import (
    default_search_mode,
    search_help,
    search_mode,
    search_mode_names,
    weight_decay_help,
)


@click.command("train-linear")
@dataset_option()
@click.option("--loss", "loss_names", cls=ListOption, default="an-ls", show_default=True,
              callback=lambda ctx, param, value: named_losses(value),
              help="A loss, a comma-separated (or repeated) list, or 'all' (`featcache losses` lists them). "
                   "BoostLU losses (ll-r+boostlu, ...) train on the spatial features file "
                   "(`featcache features --spatial`), the others on the pooled one. "
                   "'zero-shot' (in 'all' when the features file has class-prompt embeddings, "
                   "`featcache features --text`) adds CLIP's zero-shot row: no training.")
@learning_rates_option()
@batch_sizes_option()
@click.option("--epochs", default=25, show_default=True, type=EPOCHS)
@click.option("--param", "param_pairs", multiple=True, metavar="NAME=V[,V...]",
              help="Loss parameter (repeatable); several values add a grid axis. Applied to the "
                   "selected losses that have it.")
@click.option("--eps-pos", type=FINITE, default=None, help="an-ls: smoothing of observed positives.")
@click.option("--eps-neg", type=FINITE, default=None, help="an-ls: smoothing of assumed negatives.")
@val_option
@click.option("--seeds", cls=ListOption, default="0", show_default=True,
              help="Comma-separated (or repeated) seeds; each repeats the whole search (mean +- std reported).")
@click.option("--early-stop", type=click.Choice(["none", "kim", "zhou"]), default="none",
              show_default=True,
              help="Optional per-head early stopping rule of Kim et al. (3-point drop) or Zhou et al. "
                   "(first non-improving epoch).")
@click.option("--search", type=click.Choice(search_mode_names()),
              default=default_search_mode().name, show_default=True, help=search_help())
@click.option("--weight-decay", "weight_decays", cls=ListOption, default=None,
              metavar="WD[,WD...]", help=weight_decay_help())
@click.option("--backbone", default=None, help="Which features file (default: the only one).")
@pseudo_labels_option
@click.option("--run-id", default=None,
              help="Name of the run directory (default: UTC time). Re-using the id of a finished "
                   "run with the same settings skips it (resume); different settings are refused.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="CPU only: worker processes, one core each: (seed, batch size) groups train "
                   "in them, and a worker without a group to train evaluates trained groups' "
                   "epochs (default and most: one per core; under torchrun, the cores shared "
                   "among the ranks; more is capped, said in one line). Results do not depend "
                   "on it.")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Memory budget for what stage two allocates (features, labels, training "
                   "state, worker processes; not the interpreter's and libraries' own pages), "
                   "e.g. 1GB (K, M, G, T are powers of 1024; default: half the machine's or "
                   "container's memory). Features that do not fit are streamed from the file; "
                   "the block size and shuffle window follow the budget (a batch mixes the rows "
                   "of one window of blocks, not of the whole split; results.json records both, "
                   "see docs/linear.md), and fewer worker processes run when the budget cannot "
                   "hold them. The floor is the labels and one group's state plus one block: "
                   "it grows with rows x classes, not with the feature width (docs/linear.md; "
                   "figures in docs/performance.md).")
@click.option("--stream", is_flag=True,
              help="Stream the training features from the file even when they fit the budget.")
@click.option("--no-plots", is_flag=True, help="Do not draw curves.png.")
@tensorboard_option
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--device", default="auto", show_default=True,
    help="Torch device: auto (cuda when available, else cpu, with a warning), cpu, cuda, cuda:N. "
         "On CUDA the training steps are replayed as CUDA graphs of many steps each, and "
         "several groups train at once (FEATCACHE_CUDA_GROUPS); FEATCACHE_CUDA_GRAPHS=0 "
         "launches the kernels one by one (docs/linear.md).")
@cache_option
@overwrite_option
@click.pass_context
def command(ctx, dataset, loss_names, learning_rates, batch_sizes, epochs, param_pairs, eps_pos,
            eps_neg, val_variant, seeds, early_stop, search, weight_decays, backbone,
            pseudo_labels, run_id, jobs, max_memory, stream, no_plots, tensorboard, quiet, device, cache,
            overwrite):
    """Train linear heads on cached features with the protocol's grid and selection.

    Under `torchrun --nproc_per_node N -m featcache train-linear ...` the groups are spread
    over the ranks (one per GPU, or gloo processes on the CPU) with the same numbers.

    Every grid point sharing a batch size trains at once as stacked heads on the device, and
    the losses of a call that share their inputs train in one pass (one set of heads, each
    loss's numbers the ones it gets alone); the best epoch and configuration are chosen by
    validation mAP and the test mAP at that epoch is reported. Each loss writes <cache>/<dataset>/runs/<loss>/<run-id>/ (results.json,
    best.pt, summary.md, curves.png); several losses also write a comparison table.
    """
    from featcache.paths import check_name, existing_labels

    dataset = chosen_dataset(dataset, cache)
    if run_id is not None:  # a path where a name belongs is refused before anything else
        check_name(run_id, "--run-id")
    existing_labels(dataset, cache)  # a wrong name is said at once, not after torch's import
    if not no_plots:  # matplotlib loads in its own process while torch loads here
        from featcache.protocol import plot_process

        plot_process.start()
    from featcache.interrupt import safe_points
    from featcache.linear.options import LinearOptions
    from featcache.linear.run import run_linear
    from featcache.process import freeze

    freeze()  # what the imports made lives as long as the process

    mode_rates = search_mode(search).learning_rates  # e.g. base rates, for batch 256
    if mode_rates is not None and (ctx.get_parameter_source("learning_rates")
                                   is click.core.ParameterSource.DEFAULT):
        learning_rates = list(mode_rates)
    if weight_decays is not None:
        weight_decays = parse_number_list(weight_decays, "--weight-decay")
    params = parse_params(param_pairs)
    for name, value in (("eps_pos", eps_pos), ("eps_neg", eps_neg)):
        if value is not None:
            params[name] = [value]
    options = LinearOptions(
        dataset=dataset, losses=loss_names, learning_rates=learning_rates, batch_sizes=batch_sizes,
        epochs=epochs, params=params, seeds=parse_number_list(seeds, "--seeds", kind=int, bounds=TORCH_SEED),
        val_variant=val_variant, early_stop=early_stop, backbone=backbone, run_id=run_id,
        jobs=jobs, max_memory=max_memory, stream=stream, plots=not no_plots, progress=not quiet,
        device=device, cache=cache, overwrite=overwrite, pseudo_labels=pseudo_labels,
        search=search, weight_decays=weight_decays, tensorboard=tensorboard)
    with safe_points():  # stage two stops at its next step, keeping finished losses
        outcome = run_linear(options, say=lambda line: click.echo(line, err=True),
                             on_run=lambda run: click.echo(run.line()))
    if outcome.table is not None and outcome.table_path is not None:
        click.echo("")
        click.echo(outcome.table.markdown())
        click.echo(f"table written to {outcome.table_path.with_suffix('')}.md / .csv / .json")
    if tensorboard:
        click.echo(tensorboard_line(tensorboard), err=True)
