"""Every configuration a ``results.json`` trained, either stage, with its per-epoch records.

Stage two keeps them per seed (``seeds[].configs[]``), stage three for its one seed
(``configs[]``); both record the same per-epoch fields (:class:`~featcache.protocol.records.EpochRecord`).
The report and the TensorBoard logs read runs through :func:`configurations` so that both
stages look alike to them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Configuration:
    """One configuration of a run's grid: its hyper-parameters, epochs and selection."""

    seed: int
    lr: float
    batch_size: int
    params: dict
    best_epoch: int  # 1-based, the epoch selected by validation mAP
    epochs: list[dict]  # EpochRecord.to_json() per epoch
    selected: bool  # the configuration its seed selected
    val_key: str  # "val_map" (clean validation labels) or "val_map_observed"

    @property
    def val_map(self) -> float | None:
        """Validation mAP (the selecting variant) at the selected epoch."""
        return self._at_best(self.val_key)

    @property
    def test_map(self) -> float | None:
        """Test mAP at the selected epoch."""
        return self._at_best("test_map")

    def _at_best(self, key: str) -> float | None:
        for record in self.epochs:
            if record["epoch"] == self.best_epoch:
                return record.get(key)
        return None

    def name(self, varying: tuple[str, ...] = ()) -> str:
        """``0.001-8-0`` (lr-batch-seed), with ``-name=value`` for each parameter in
        ``varying`` (those that take several values in the grid)."""
        text = f"{self.lr:g}-{self.batch_size}-{self.seed}"
        return text + "".join(f"-{k}={self.params[k]:g}" for k in varying if k in self.params)


def val_key(document: dict) -> str:
    """The validation field that selected: clean labels, or the observed single positives."""
    variant = document.get("protocol", {}).get("val_variant", "clean")
    return "val_map" if variant == "clean" else "val_map_observed"


def configurations(document: dict) -> list[Configuration]:
    """Every configuration of a results document, in the order it lists them."""
    key = val_key(document)
    if document.get("stage") == "finetune":
        selection = document["selection"]
        seed = int(document.get("protocol", {}).get("seed", 0))
        return [Configuration(seed, c["lr"], c["batch_size"], dict(selection.get("params", {})),
                              c["best_epoch"], c["epochs"],
                              (c["lr"], c["batch_size"]) == (selection["lr"],
                                                             selection["batch_size"]), key)
                for c in document["configs"]]
    out = []
    for entry in document["seeds"]:
        chosen = entry["selected"]
        for c in entry["configs"]:
            same = ((c["lr"], c["batch_size"], c["params"])
                    == (chosen["lr"], chosen["batch_size"], chosen["params"]))
            out.append(Configuration(int(c["seed"]), c["lr"], c["batch_size"], dict(c["params"]),
                                     c["best_epoch"], c["epochs"], same, key))
    return out


def varying_params(configs: list[Configuration]) -> tuple[str, ...]:
    """The loss parameters that take several values among ``configs`` (a grid axis)."""
    names = sorted({k for c in configs for k in c.params})
    return tuple(k for k in names if len({c.params.get(k) for c in configs}) > 1)
