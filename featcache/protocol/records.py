"""What both stages record: per-epoch metrics and the common parts of every ``results.json``.

Epochs are 0-based in memory and counted from 1 in every output (the reference code's logs
count from 0: its "best epoch 19" is our epoch 20).
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from dataclasses import dataclass, field
from typing import Protocol

import torch

from featcache import __version__
from featcache.data.labelfile import LabelSet
from featcache.protocol.numerics import KEY as NUMERICS_KEY
from featcache.protocol.numerics import NUMERICS_VERSION
from featcache.runtime import cpu_arithmetic


@dataclass
class EpochRecord:
    """Metrics of one epoch of one configuration (mAP in percent)."""

    epoch: int
    train_loss: float
    val_map: float | None
    val_map_observed: float
    test_map: float
    train_map: float | None = None
    extra: dict = field(default_factory=dict)

    def selection(self, val_variant: str) -> float:
        """The validation mAP that selects: clean labels, or the observed single positives."""
        if val_variant != "clean":
            return self.val_map_observed
        assert self.val_map is not None, "--val clean is refused without clean validation labels"
        return self.val_map

    def to_json(self) -> dict:
        return ({"epoch": self.epoch + 1, "train_loss": self.train_loss, "val_map": self.val_map,
                 "val_map_observed": self.val_map_observed, "test_map": self.test_map,
                 "train_map": self.train_map}
                | ({"extra": self.extra} if self.extra else {}))


class NamedLoss(Protocol):
    """What a results document names of its loss (a loss class, or the zero-shot row)."""

    @property
    def name(self) -> str: ...

    @property
    def reference(self) -> str: ...


def document_header(stage: str, loss: NamedLoss, labels: LabelSet) -> dict:
    """The first keys of a run's results.json: versions (featcache's and its numerics',
    :mod:`featcache.protocol.numerics`), time, command, stage, data, loss."""
    return {
        "featcache_version": __version__,
        NUMERICS_KEY: NUMERICS_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "stage": stage,
        "dataset": labels.dataset,
        "loss": loss.name,
        "loss_reference": loss.reference,
        "labels": {"path": str(labels.path), "sha256": labels.sha256,
                   "mean_positives_per_train_image": labels.k,
                   "observation": labels.observation},
    }


def observation_line(observation: dict | None) -> str | None:
    """A summary line naming a biased single-positive sampler (None for the protocol's own)."""
    observation = observation or {}
    rule = observation.get("rule", "uniform")
    if rule in ("uniform", "given"):
        return None
    return (f"- observed labels: {rule}-biased single positives (Arroyo et al. 2023), seed "
            f"{observation.get('obs_seed')}")


def machine_record(device: str, **extra) -> dict:
    """Where a run ran: the device in words, anything the stage adds, Python, torch, platform,
    and for the CPU the fingerprint of its matrix arithmetic (runs of the same settings with
    the same fingerprint agree bit for bit: :func:`featcache.runtime.cpu_arithmetic`)."""
    arithmetic = {"cpu_arithmetic": cpu_arithmetic()} if device.startswith("cpu") else {}
    return {"device": device, **extra, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform(), **arithmetic}


def selected_params(document: dict) -> dict[str, float]:
    """Every loss parameter of the configuration a results.json selected (both stages)."""
    return dict(document["selection"]["params"])
