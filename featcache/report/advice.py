"""What the report advises where a table lacks something: the command that made a run, and the
one that adds the reference loss (``an``) a heatmap compares against."""

from __future__ import annotations

import shlex
from html import escape

from featcache.report.groups import REFERENCE_LOSS, TableGroup
from featcache.report.html import typed_command
from featcache.report.runs import Run

#: options of one loss that the reference loss may not take (train-linear refuses a --param
#: no selected loss has), and finetune's linear-phase options (an starts from a fresh head)
LOSS_OPTIONS = ("--param", "--eps-pos", "--eps-neg", "--pseudo-labels", "--linear-lr",
                "--linear-batch-size", "--linear-bsize", "--init", "--loss")
#: flags of one run that the reference loss's new run must not take
RUN_FLAGS = ("--resume",)


def with_loss(run: Run, loss: str) -> str:
    """The command that trains ``loss`` with the settings of ``run``'s table: stage two's as
    the run's command was typed with ``--loss`` set to ``loss``; stage three's from a fresh
    head (``--init none``) on the run's network, image size and grid."""
    document = run.document
    argv = typed_command(document)
    if document.get("stage") == "finetune":
        return shlex.join(_finetune_words(run, loss))
    if argv[:2] != ["featcache", "train-linear"]:  # not recorded, or a step of `pipeline run`
        return shlex.join(["featcache", "train-linear", "--dataset",
                           str(document.get("dataset", "?")), "--loss", loss,
                           *_cache_words(run)])
    return shlex.join([*argv[:2], "--loss", loss, *_without(argv[2:])])


def _without(words: list[str]) -> list[str]:
    """``words`` without the options of one loss (and their values) and one run's flags."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in LOSS_OPTIONS:
            skip = True
        elif word not in RUN_FLAGS and not word.startswith(tuple(f"{o}=" for o in LOSS_OPTIONS)):
            out.append(word)
    return out


def _finetune_words(run: Run, loss: str) -> list[str]:
    """``featcache finetune`` of ``loss`` from a fresh head with ``run``'s table settings."""
    settings, network = run.document.get("settings", {}), run.document.get("backbone", {})
    words = ["featcache", "finetune", "--dataset", str(run.document.get("dataset", "?")),
             "--loss", loss, "--init", "none", "--backbone", str(network.get("name")),
             "--weights", str(network.get("weights_file") or network.get("weights")),
             "--image-size", str(network.get("image_size")),
             "--lr", ",".join(f"{lr:g}" for lr in settings.get("learning_rates", [])),
             "--bsize", ",".join(str(b) for b in settings.get("batch_sizes", [])),
             "--epochs", str(settings.get("epochs")),
             "--head-lr-mult", f"{settings.get('head_lr_mult', 1.0):g}",
             "--val", str(settings.get("val_variant", "clean")),
             "--seed", str(settings.get("seed", 0)),
             "--precision", str(settings.get("precision", "auto")), "--run-id", run.run_id]
    if network.get("preprocess", "native") != "native":
        words += ["--preprocess", str(network["preprocess"])]
    if settings.get("early_stop", "none") != "none":
        words += ["--early-stop", str(settings["early_stop"])]
    return words + _cache_words(run)


def _cache_words(run: Run) -> list[str]:
    """``--cache DIR`` when ``run``'s dataset folder is not under the default cache root."""
    from featcache.paths import cache_root

    cache = run.path.parent.parent.parent.parent
    return [] if cache.resolve() == cache_root().resolve() else ["--cache", str(cache)]


def missing_reference_note(group: TableGroup) -> str:
    """The heatmap's key (HTML) when its table has no ``an`` run: for losses on feature maps
    (a spatial file, where ``an`` does not train) where their comparison is; otherwise the
    command that trains ``an`` with the same settings."""
    spatial = any(run.document.get("features", {}).get("layout") == "spatial"
                  for run in group.runs)
    if spatial:
        return (f"no {REFERENCE_LOSS} run in this table: its losses train on feature maps (a "
                f"spatial features file), which {REFERENCE_LOSS} does not; compare them with "
                f"{REFERENCE_LOSS} in the table of the pooled features")
    command = with_loss(group.runs[0], REFERENCE_LOSS)
    return (f"no {REFERENCE_LOSS} run in this table: nothing to compare against (run "
            f"<code>{escape(command)}</code> to see gains and losses)")
