"""Whether a ``train-linear`` call scores the zero-shot row (:mod:`featcache.linear.zeroshot`),
and that row's run as a :class:`~featcache.linear.lossrun.LossRun`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from featcache.data.featurefile import FeatureFile, read_text_embeddings
from featcache.data.labelfile import LabelSet
from featcache.errors import OptionError
from featcache.linear.engine.workers import on_main
from featcache.linear.featurefiles import FeatureFiles, requested_losses
from featcache.linear.lossrun import LossRun
from featcache.linear.zeroshot import ZERO_SHOT, zero_shot_run
from featcache.runtime import Ranks, describe_device


def split_zero_shot(losses: str | Sequence[str]) -> tuple[str | None, str | Sequence[str]]:
    """Whether ``--loss`` (``losses``) asks for the zero-shot row (``"named"``, or ``"all"``
    when the features file may have it), and the losses to train."""
    names = requested_losses(losses)
    if names == ["all"]:
        return "all", losses
    if ZERO_SHOT not in names:
        return None, losses
    return "named", [name for name in names if name != ZERO_SHOT]


def zero_shot_wanted(mode: str | None, files: FeatureFiles,
                     skipped: list[tuple[str, str]]) -> bool:
    """Whether this run scores the zero-shot row: named, or ``--loss all`` on a pooled
    features file with class-prompt embeddings (else it is skipped, with the reason)."""
    if mode is None:
        return False
    if mode == "named" and files.pooled is None:
        raise OptionError("--loss zero-shot scores the pooled features file, which the other "
                          "losses named do not read (they train on feature maps): score it in a "
                          "run of its own (--loss zero-shot)")
    if mode == "named" or (files.pooled is not None
                           and read_text_embeddings(files.pooled.path) is not None):
        return True
    skipped.append((ZERO_SHOT, "needs class-prompt text embeddings in the features file (a "
                    "vision-language backbone's file made with the --text option of featcache "
                    "features)"))
    return False


def score_zero_shot(labels: LabelSet, features: FeatureFile, run_dir: Path, val_variant: str,
                    overwrite: bool, device: torch.device, say: Callable[[str], None],
                    job: Ranks) -> LossRun:
    """The zero-shot row's run (:mod:`featcache.linear.zeroshot`), or the finished one
    (``overwrite``: a finished one with other settings is replaced)."""
    document, reused = on_main(job, lambda: zero_shot_run(
        labels, features, run_dir, val_variant, describe_device(device), overwrite, say))
    if reused:
        say(f"{ZERO_SHOT}: run {run_dir.name} already finished with these settings; reusing it")
    return LossRun(ZERO_SHOT, run_dir, document, reused, document["timings"]["seconds"])
