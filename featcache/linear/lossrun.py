"""What a ``train-linear`` call returns: each loss's run (:class:`LossRun`) and the outcome
(:class:`LinearOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from featcache.errors import plural
from featcache.protocol.table_cells import seed_choices
from featcache.tables import Table


@dataclass
class LossRun:
    """One loss's run: its folder, its results document, and whether it was reused."""

    loss: str
    run_dir: Path
    document: dict
    reused: bool
    seconds: float = 0.0

    def line(self) -> str:
        """The closing line printed for this loss: with several seeds, the mean +- std the
        table shows and each seed's selection; the mAP over classes with positives when some
        class has none in the test split."""
        selection, summary = self.document["selection"], self.document["summary"]
        variant = self.document["protocol"]["val_variant"]
        key = "val_map" if variant == "clean" else "val_map_observed"
        axes = [k for k, values in self.document["grid"].get("params", {}).items()
                if len(values) > 1]  # --param axes: their selected values are said too

        def chosen(params: dict) -> str:
            return "".join(f", {k}={params[k]:g}" for k in axes)

        if summary["seeds"] > 1:
            choices = "; ".join(f"seed {c.seed}: {c.describe()}{chosen(c.params)}"
                                for c in seed_choices(self.document, str(self.run_dir)))
            text = (f"{self.loss}: val {summary[key + '_mean']:.2f}  test "
                    f"{summary['test_map_mean']:.2f} +- {summary['test_map_std']:.2f} over "
                    f"{plural(summary['seeds'], 'seed')}  ({choices}")
        elif selection["lr"] is None:  # the zero-shot row: nothing trained or selected
            text = (f"{self.loss}: val {selection[key]:.2f}  test {selection['test_map']:.2f}  "
                    "(cosine to the class prompts, no training")
        else:
            text = (f"{self.loss}: val {selection[key]:.2f}  test {selection['test_map']:.2f}  (lr "
                    f"{selection['lr']:g}, batch {selection['batch_size']}"
                    f"{chosen(selection['params'])}, epoch {selection['epoch']}")
        present = selection.get("test_map_classes_with_positives")
        if present is not None and abs(present - selection["test_map"]) > 1e-9:
            text += f"; test {present:.2f} over the classes with positives"
        shared = self.document.get("timings", {}).get("shared")
        others = (f", its share of the time {plural(shared['losses'], 'loss', 'losses')} trained "
                  "together"
                  if isinstance(shared, dict) and shared.get("losses") else "")
        return f"{text}; {self.seconds:.1f} s{others}) -> {self.run_dir}"


@dataclass
class LinearOutcome:
    """What a ``train-linear`` call did: one run per loss, the losses skipped, the table."""

    runs: list[LossRun]
    skipped: list[tuple[str, str]]
    table: Table | None = None
    table_path: Path | None = None
