"""Runs grouped into the loss tables of the report: one table per stage and protocol.

A table holds the runs that :class:`~featcache.protocol.results_table.ResultsTable` may pool:
one stage, the same inputs and protocol (labels, features or network, grid, epochs,
validation); runs of one loss pool their seeds when their settings agree and no seed repeats.
A run that does not fit an existing table (another features file, another grid, the same seed
of a loss again, other loss parameters) starts a further table, so that every run of the
dataset is in exactly one table and no cell mixes settings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from featcache.protocol.results_table import ResultsTable
from featcache.protocol.table_cells import seed_choices
from featcache.protocol.uncertainty import TableUncertainty, table_uncertainty
from featcache.report.runs import Run
from featcache.stats import Resampling

#: settings that differ between the losses of one table (each loss's own) or between seeds
_PER_LOSS = {"loss", "params", "seeds", "seed", "init", "pseudo_labels_sha256"}
#: the loss every other loss's per-class AP is compared with (Cole et al.'s baseline)
REFERENCE_LOSS = "an"
#: the report's resampling: 1000 resamples from seed 0, 95% intervals
RESAMPLING = Resampling()


def protocol_key(run: Run) -> str:
    """What every run of one table shares (the settings that are not the loss's own)."""
    settings = run.document.get("settings", {})
    return json.dumps({k: v for k, v in settings.items() if k not in _PER_LOSS}, sort_keys=True)


def _loss_key(run: Run) -> str:
    settings = run.document.get("settings", {})
    return json.dumps({k: v for k, v in settings.items() if k not in ("seeds", "seed")},
                      sort_keys=True)


@dataclass
class TableGroup:
    """One loss table: its runs and the table built from them."""

    stage: str
    runs: list[Run]
    table: ResultsTable

    def runs_of(self, loss: str) -> list[Run]:
        return [run for run in self.runs if run.loss == loss]

    @cached_property
    def uncertainty(self) -> TableUncertainty:
        """Every cell's interval and, where the table has ``an``, its paired comparison with
        it (per class too), from the runs' test scores."""
        versus = REFERENCE_LOSS if REFERENCE_LOSS in self.table.losses else None
        return table_uncertainty(self.table.cells, RESAMPLING, versus,
                                 {run.name: run.path for run in self.runs})


def table_groups(runs: Sequence[Run]) -> list[TableGroup]:
    """The loss tables of ``runs``: stage two's first, in the order their runs were made."""
    placed: list[tuple[str, str, list[Run]]] = []  # (stage, protocol key, runs)
    for run in runs:
        key = protocol_key(run)
        seeds = {c.seed for c in seed_choices(run.document, run.name)}
        for stage, group_key, members in placed:
            if stage != run.stage or group_key != key:
                continue
            same = [m for m in members if m.loss == run.loss]
            if all(_loss_key(m) == _loss_key(run) and not seeds & {
                    c.seed for c in seed_choices(m.document, m.name)} for m in same):
                members.append(run)
                break
        else:
            placed.append((run.stage, key, [run]))
    order = {"linear": 0, "finetune": 1}
    placed.sort(key=lambda item: order.get(item[0], 2))
    return [TableGroup(stage, members, ResultsTable.from_documents(
        [(member.name, member.document) for member in members])) for stage, _, members in placed]
