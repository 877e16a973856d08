"""TensorBoard logs of finished runs (``--tensorboard DIR``, both training stages).

A run is logged once it is selected, from the per-epoch records its ``results.json`` keeps
(nothing is threaded through the training loops): every configuration under
``DIR/<dataset>/<loss>/<stage>-<run-id>/<lr>-<batch>-<seed>`` with its per-epoch scalars

- ``loss/train``: the mean training loss of the epoch,
- ``mAP/val`` (clean validation labels), ``mAP/val_observed`` (the single positives),
  ``mAP/test`` and, where recorded, ``mAP/train`` (the training-set "label recovery" mAP),

at steps 1, 2, ... (epochs counted from 1, as in every output), and each seed's selected
configuration with its hyper-parameters and selected val / test mAP (``add_hparams``, in the
configuration's own folder), plus a text note with the command and the settings fingerprint.
Runs from different days then compare in one ``tensorboard --logdir DIR`` view.

``tensorboard`` is an optional dependency (``pip install 'featcache[tensorboard]'``).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
from pathlib import Path

from featcache.errors import OptionError
from featcache.protocol.configurations import Configuration, configurations, varying_params

#: the environment variable that gives ``--tensorboard`` its default
TENSORBOARD_ENV = "FEATCACHE_TENSORBOARD"

#: per-epoch fields of a record -> scalar tags
SCALARS = {"train_loss": "loss/train", "val_map": "mAP/val",
           "val_map_observed": "mAP/val_observed", "test_map": "mAP/test",
           "train_map": "mAP/train"}


def require_tensorboard() -> None:
    """Refuse ``--tensorboard`` in one line when the package is missing (before any training)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise OptionError("--tensorboard needs the tensorboard package, which is not installed: "
                          "pip install 'featcache[tensorboard]' (or pip install tensorboard)")


def run_log_dir(root: str | Path, document: dict, run_dir: str | Path) -> Path:
    """``root/<dataset>/<loss>/<stage>-<run-id>``: where one run's configurations are logged."""
    return (Path(root) / document["dataset"] / document["loss"]
            / f"{document.get('stage', 'linear')}-{Path(run_dir).name}")


def log_run(root: str | Path, document: dict, run_dir: str | Path, replace: bool = True) -> Path:
    """Log every configuration of a finished run under ``root``; returns the run's log folder.

    ``replace``: a run just trained replaces the logs of an earlier run of the same id (which
    ``--overwrite`` discarded); a reused run (``replace=False``) is logged only where it is not
    logged yet, so running a command again adds no duplicate curves.
    """
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    target = run_log_dir(root, document, run_dir)
    if target.exists():
        if not replace and any(target.rglob("events.out.tfevents.*")):
            return target
        shutil.rmtree(target)
    configs = configurations(document)
    varying = varying_params(configs)
    for config in configs:
        with SummaryWriter(log_dir=str(target / config.name(varying))) as writer:
            for record in config.epochs:
                for field, tag in SCALARS.items():
                    if record.get(field) is not None:
                        writer.add_scalar(tag, float(record[field]), int(record["epoch"]))
            if config.selected:
                writer.add_text("run", run_note(document, run_dir, config), 0)
                writer.add_hparams(*selected_hparams(document, config), run_name=".")
    return target


def selected_hparams(document: dict, config: Configuration) -> tuple[dict, dict]:
    """The hyper-parameters and metrics of a selected configuration (``add_hparams``)."""
    hparams = {"stage": document.get("stage", "linear"), "loss": document["loss"],
               "lr": float(config.lr), "batch_size": int(config.batch_size),
               "seed": int(config.seed), "epoch": int(config.best_epoch),
               "epochs": int(document.get("protocol", {}).get("epochs", 0)),
               "val_variant": document.get("protocol", {}).get("val_variant", "clean"),
               **{f"param/{k}": float(v) for k, v in config.params.items()}}
    if document.get("stage") == "finetune":
        hparams["init"] = document.get("init", {}).get("mode", "?")
        hparams["head_lr_mult"] = float(document["protocol"].get("head_lr_mult", 1.0))
    metrics = {"hparam/val_mAP": float(config.val_map or 0.0),
               "hparam/test_mAP": float(config.test_map or 0.0)}
    return hparams, metrics


def run_note(document: dict, run_dir: str | Path, config: Configuration) -> str:
    """What made the run (Markdown for TensorBoard's text tab)."""
    command = shlex.join(document.get("command", []))
    return (f"run `{run_dir}`, selected for seed {config.seed}  \n"
            f"command: `{command}`  \n"
            f"created {document.get('created')}, featcache {document.get('featcache_version')}  \n"
            f"settings fingerprint `{document.get('fingerprint')}`")
