"""What stage three keeps of a configuration: each epoch's metrics with its timings
(:class:`EpochRecord`) and the configuration's epochs with its best one (:class:`ConfigResult`),
both as stored in checkpoints and ``results.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from featcache.protocol.grid import GridPoint
from featcache.protocol.records import EpochRecord as BaseEpochRecord
from featcache.protocol.selection import should_stop


@dataclass
class EpochRecord(BaseEpochRecord):
    """Metrics of one epoch (``epoch`` 0-based; JSON counts from 1), with its timings."""

    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    images_per_second: float = 0.0

    def to_json(self) -> dict:
        timings = {"train_seconds": self.train_seconds, "eval_seconds": self.eval_seconds,
                   "images_per_second": self.images_per_second}
        record = super().to_json()
        extra = record.pop("extra", None)
        return record | timings | ({"extra": extra} if extra else {})

    @classmethod
    def from_json(cls, record: dict) -> EpochRecord:
        fields = dict(record)
        fields["epoch"] = int(fields["epoch"]) - 1
        return cls(**fields)


@dataclass
class ConfigResult:
    """Everything one configuration produced: its epochs and its best epoch."""

    config: GridPoint
    epochs: list[EpochRecord] = field(default_factory=list)
    best_epoch: int = -1
    best_val: float = -math.inf
    test_ap: list[float] = field(default_factory=list)  # per class at the best epoch, in [0, 1]
    stopped_at: int | None = None
    seconds: float = 0.0

    @property
    def best(self) -> EpochRecord:
        return self.epochs[self.best_epoch]

    def add(self, record: EpochRecord, test_ap: Tensor, val_variant: str) -> bool:
        """Append an epoch; True when it is the new best (the first highest validation mAP)."""
        self.epochs.append(record)
        value = record.selection(val_variant)
        if value > self.best_val:
            self.best_epoch, self.best_val = len(self.epochs) - 1, value
            self.test_ap = test_ap.tolist()
            return True
        return False

    def should_stop(self, rule: str, improved: bool, val_variant: str) -> bool:
        """Kim et al.: val more than 3 points below the best; Zhou et al.: no improvement."""
        return bool(should_stop(rule, self.best_val, self.epochs[-1].selection(val_variant),
                                improved))

    def to_json(self) -> dict:
        return {"lr": self.config.lr, "batch_size": self.config.batch_size,
                "best_epoch": self.best_epoch + 1,
                "best_val": self.best_val, "test_ap": self.test_ap, "stopped_at": self.stopped_at,
                "seconds": self.seconds, "epochs": [r.to_json() for r in self.epochs]}

    @classmethod
    def from_json(cls, record: dict) -> ConfigResult:
        return cls(GridPoint(float(record["lr"]), int(record["batch_size"])),
                   [EpochRecord.from_json(r) for r in record["epochs"]],
                   int(record["best_epoch"]) - 1, float(record["best_val"]), list(record["test_ap"]),
                   record["stopped_at"], float(record["seconds"]))
