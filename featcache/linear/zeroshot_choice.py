"""Whether a ``train-linear`` call scores the zero-shot row (:mod:`featcache.linear.zeroshot`),
and that row's run as a :class:`~featcache.linear.lossrun.LossRun`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from featcache.data.featurefile import FeatureFile, read_text_embeddings
from featcache.linear.featurefiles import FeatureFiles, requested_losses
from featcache.linear.lossrun import LossRun
from featcache.linear.options import LinearOptions
from featcache.linear.workers import on_main
from featcache.linear.zeroshot import ZERO_SHOT, zero_shot_run
from featcache.runtime import Ranks, describe_device


def split_zero_shot(options: LinearOptions) -> tuple[str | None, LinearOptions]:
    """Whether ``--loss`` asks for the zero-shot row (``"named"``, or ``"all"`` when the
    features file may have it), and the options with the losses to train."""
    names = requested_losses(options.losses)
    if names == ["all"]:
        return "all", options
    if ZERO_SHOT not in names:
        return None, options
    return "named", replace(options, losses=[name for name in names if name != ZERO_SHOT])


def zero_shot_wanted(mode: str | None, files: FeatureFiles,
                     skipped: list[tuple[str, str]]) -> bool:
    """Whether this run scores the zero-shot row: named, or ``--loss all`` on a pooled
    features file with class-prompt embeddings (else it is skipped, with the reason)."""
    if mode is None:
        return False
    if mode == "named" or (files.pooled is not None
                           and read_text_embeddings(files.pooled.path) is not None):
        return True
    skipped.append((ZERO_SHOT, "needs class-prompt text embeddings in the features file (a "
                    "vision-language backbone's file made with the --text option of featcache "
                    "features)"))
    return False


def score_zero_shot(labels, features: FeatureFile, run_dir: Path, options: LinearOptions,
                    device, say: Callable[[str], None], job: Ranks) -> LossRun:
    """The zero-shot row's run (:mod:`featcache.linear.zeroshot`), or the finished one."""
    document, reused = on_main(job, lambda: zero_shot_run(
        labels, features, run_dir, options.val_variant, describe_device(device),
        options.overwrite))
    if reused:
        say(f"{ZERO_SHOT}: run {run_dir.name} already finished with these settings; reusing it")
    return LossRun(ZERO_SHOT, run_dir, document, reused, document["timings"]["seconds"])
