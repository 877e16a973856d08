"""Per-epoch checkpoints, so that ``--resume`` continues exactly.

A run folder holds ``run.json`` (the settings that must not change on resume, with their
fingerprint: :class:`featcache.protocol.runs.RunFolder`) and, per configuration,
``configs/<name>/checkpoint.pt`` after every epoch:
network, optimizer, grad scaler, the loss's per-example state (phi, pseudo-labels, corrected
labels), RNG states, the epoch and the history so far. Everything is written atomically
(temporary name, then rename), so an interruption leaves the previous checkpoint intact.
Once a configuration has finished, its history is kept in ``configs/<key>/history.json``
and the (large) checkpoint is deleted. ``--keep-checkpoints`` decides what else is kept
(:mod:`featcache.finetune.budget`): ``all`` keeps every epoch's checkpoint as
``configs/<key>/epoch-NNN.pt``; ``best`` writes no checkpoint at all.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path
from typing import cast

import numpy as np
import torch

from featcache.errors import FeatcacheWarning, InputError, plural
from featcache.fileio import save_torch_atomic, write_bytes_atomic
from featcache.protocol.documents import read_history as read_checked_history
from featcache.protocol.runs import describe_differences
from featcache.torchfile import load_checked

FORMAT = "featcache-finetune-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT = "checkpoint.pt"
HISTORY = "history.json"


def rng_states() -> dict:
    """The RNG states of torch (CPU and CUDA), numpy and Python's ``random``."""
    keys, pos, has_gauss, cached = cast(tuple, np.random.get_state())[1:]  # the legacy tuple
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": [version, list(internal), gauss],
    }


def restore_rng_states(states: dict) -> None:
    """Undo :func:`rng_states`.

    The checkpoint holds one CUDA state per device visible when it was written. Resumed with
    fewer visible devices (or none), the states of the devices that are there are restored and
    a warning names the rest: featcache draws its order, flips and initial state from seeded
    CPU generators, so the training numbers do not depend on them.
    """
    torch.set_rng_state(states["torch"])
    restore_cuda_rng_states(list(states.get("cuda") or []))
    state = states["numpy"]
    np.random.set_state(("MT19937", state["keys"].numpy().astype(np.uint32), state["pos"],
                         state["has_gauss"], state["cached"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def restore_cuda_rng_states(saved: list) -> None:
    """Restore per-device CUDA RNG states for the devices visible now; warn about the others."""
    if not saved:
        return
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, state in enumerate(saved[:visible]):
        torch.cuda.set_rng_state(state, index)
    if len(saved) > visible:
        warnings.warn(
            f"the checkpoint holds the CUDA random states of {plural(len(saved), 'GPU')} and {visible} "
            f"{'is' if visible == 1 else 'are'} visible now: restored {visible}, left "
            f"{len(saved) - visible} unrestored (featcache's order, flips and initial state come "
            "from seeded CPU generators, so the run's numbers do not depend on them)",
            FeatcacheWarning, stacklevel=3)


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write a checkpoint atomically (tensors moved to the CPU by the caller)."""
    save_torch_atomic(path, {"format": FORMAT, "format_version": FORMAT_VERSION, **payload})


def keep_epoch_copy(checkpoint: Path, epoch: int) -> Path:
    """``--keep-checkpoints all``: keep this epoch's checkpoint as ``epoch-NNN.pt`` beside it (a
    hard link: no extra space until the next epoch replaces ``checkpoint.pt``)."""
    target = checkpoint.with_name(f"epoch-{epoch:03d}.pt")
    target.unlink(missing_ok=True)
    try:
        os.link(checkpoint, target)
    except OSError:  # a file system without hard links
        write_bytes_atomic(target, checkpoint.read_bytes())
    return target


def load_checkpoint(path: Path, identity: dict) -> dict:
    """A checkpoint written for ``identity``; refuses a corrupt or incompatible one."""
    payload = load_checked(path, "delete it to restart this configuration, or start a new run "
                                 "without --resume")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise InputError(f"{path} is not a featcache fine-tuning checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path} has checkpoint format {payload.get('format_version')}; this "
                         f"featcache reads {FORMAT_VERSION}: start a new run")
    stored = payload.get("identity", {})
    if stored != identity:
        raise InputError(f"checkpoint {path} was written by another configuration "
                         f"({describe_differences(stored, identity)}); resume with the options it "
                         "was started with, or start a new --run-id")
    return payload


def read_history(path: Path) -> dict | None:
    """A finished configuration's history (None when there is none yet), checked."""
    return read_checked_history(path)
