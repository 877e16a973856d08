"""The schemas of the documents featcache reads back, and the readers of a run folder's.

``results.json`` (both stages and zero-shot), ``run.json`` and a fine-tuning configuration's
``history.json`` are read back by ``table``, ``report``, ``predict``, the Python API and the
stages themselves; each is read here, checked against its schema
(:mod:`featcache.schema`), so that a damaged or hand-edited file is refused in one line naming
the file, the key, what it holds, and the command that trains the run again. A pipeline's
recipe (TOML) and its report's table record are checked against theirs
(:data:`RECIPE_SCHEMA`, :data:`TABLE_RECORD_SCHEMA`) by :mod:`featcache.pipeline`.

The schemas name the keys featcache's readers use, with their types; keys a reader never uses
are not checked, and keys that older versions did not write are optional.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from featcache.schema import (
    AnyOf,
    Choice,
    Flag,
    Integer,
    ListOf,
    MapOf,
    Number,
    Record,
    Schema,
    Text,
    nullable,
    read_document,
)

_SCORE = nullable(Number())
_PER_CLASS = nullable(MapOf(Number()))
#: a loss parameter's value as a selection records it (a number; a grid axis lists them)
_PARAMS = MapOf(nullable(Number()))
_EPOCH = Record(optional={"epoch": Integer(), "train_loss": _SCORE, "val_map": _SCORE,
                          "val_map_observed": _SCORE, "test_map": _SCORE, "train_map": _SCORE,
                          "extra": MapOf()})
#: one configuration's selected epoch and its numbers (a seed's choice, a grid's row)
_CHOSEN = {"seed": Integer(), "lr": _SCORE, "batch_size": nullable(Integer()), "params": _PARAMS,
           "best_epoch": nullable(Integer()), "epoch": nullable(Integer()), "val_map": _SCORE,
           "val_map_observed": _SCORE, "train_map": _SCORE, "test_ap_per_class": _PER_CLASS,
           "stopped_at": nullable(Integer()), "epochs": nullable(ListOf(_EPOCH)),
           "weight_decay": _SCORE}
_CONFIG = Record(optional={**_CHOSEN, "test_map": _SCORE})
_COVERAGE = Record(optional={"positives_per_class": MapOf(Number()),
                             "classes_without_positives": ListOf(Text()),
                             "classes_with_few_positives": ListOf(Text()),
                             "min_positives": Integer()})

RESULTS_SCHEMA = Record(
    required={
        "dataset": Text(),
        "loss": Text(),
        "selection": Record(required={"test_map": Number()},
                            optional={**_CHOSEN, "val_map_classes_with_positives": _SCORE,
                                      "test_map_classes_with_positives": _SCORE}),
    },
    optional={
        "featcache_version": Text(),
        "numerics_version": Integer(),
        "created": Text(),
        "command": ListOf(Text()),
        "stage": Choice("linear", "finetune"),
        "loss_reference": Text(),
        "labels": Record(optional={"path": nullable(Text()), "sha256": nullable(Text()),
                                   "mean_positives_per_train_image": _SCORE,
                                   "observation": nullable(MapOf())}),
        "features": Record(optional={"path": nullable(Text()), "sha256": nullable(Text()),
                                     "backbone": nullable(Text()), "dim": nullable(Integer()),
                                     "weights": nullable(Text()), "layout": nullable(Text()),
                                     "spatial_shape": nullable(ListOf(Integer()))}),
        "backbone": Record(optional={"name": nullable(Text()), "weights": nullable(Text()),
                                     "image_size": nullable(Integer())}),
        "init": Record(optional={"mode": nullable(Text()), "val_map": _SCORE, "test_map": _SCORE,
                                 "handoff": nullable(ListOf(Text()))}),
        "head": Record(optional={"kind": nullable(Text())}),
        "sizes": Record(optional={"train": Integer(), "val": Integer(), "test": Integer(),
                                  "classes": Integer()}),
        "pseudo_labels": nullable(MapOf()),
        "protocol": Record(optional={"optimizer": Text(), "epochs": Integer(),
                                     "val_variant": Choice("clean", "observed"),
                                     "early_stop": Text(), "seed": Integer(),
                                     "head_lr_mult": Number(), "training": Text()}),
        "grid": Record(optional={"lr": ListOf(Number()), "batch_size": ListOf(Integer()),
                                 "params": MapOf(ListOf(nullable(Number()))),
                                 "params_source": MapOf(Text()), "seeds": ListOf(Integer())}),
        "summary": Record(optional={"seeds": Integer(), "val_map_mean": _SCORE,
                                    "val_map_std": _SCORE, "val_map_observed_mean": _SCORE,
                                    "val_map_observed_std": _SCORE, "test_map_mean": _SCORE,
                                    "test_map_std": _SCORE, "train_map_mean": _SCORE,
                                    "train_map_std": _SCORE}),
        "evaluation": Record(optional={"validation": _COVERAGE, "test": _COVERAGE}),
        "published": MapOf(),
        "seeds": ListOf(Record(required={"selected": Record(
            required={"seed": Integer(), "test_map": Number()}, optional=_CHOSEN)},
            optional={"seed": Integer(), "configs": ListOf(_CONFIG)}), at_least=1),
        "configs": ListOf(_CONFIG),
        "notes": ListOf(Text()),
        "timings": Record(optional={"seconds": Number()}),
        "machine": MapOf(),
        "settings": MapOf(),
        "fingerprint": Text(),
        "uncertainty": MapOf(),
        "probe": MapOf(),
        "label_sets": nullable(MapOf()),
    },
)

RUN_SCHEMA = Record(required={"settings": MapOf(), "fingerprint": Text()})

#: a finished fine-tuning configuration (:meth:`featcache.finetune.records.ConfigResult.to_json`)
HISTORY_SCHEMA = Record(
    required={"lr": Number(), "batch_size": Integer(), "best_epoch": Integer(),
              "best_val": Number(), "test_ap": ListOf(Number()),
              "epochs": ListOf(Record(required={"epoch": Integer(), "train_loss": Number(),
                                                "val_map_observed": Number(),
                                                "test_map": Number()},
                                      optional={"val_map": _SCORE, "train_map": _SCORE,
                                                "train_seconds": Number(),
                                                "eval_seconds": Number(),
                                                "images_per_second": Number(),
                                                "extra": MapOf()}, closed=True),
                                at_least=1),
              "stopped_at": nullable(Integer()), "seconds": Number()})


_WORD = AnyOf(Text(), Number(), Flag())
#: what a recipe may hold (the module docstring describes each key)
RECIPE_SCHEMA = Record(optional={
    "name": Text(),
    "description": Text(),
    "vars": MapOf(_WORD),
    "steps": ListOf(Record(
        required={"command": AnyOf(Text(), ListOf(Text(), at_least=1))},
        optional={"name": Text(), "skip_if_exists": Text(),
                  "each": MapOf(AnyOf(Text(), ListOf(_WORD, at_least=1)))})),
    "report": Record(optional={
        "stage": Text(), "kind": Text(), "run_id": Text(),
        "reference_run_id": Text(), "datasets": ListOf(Text(), at_least=1),
        "losses": ListOf(Text()), "readme": Text(), "loss": Text(), "param": Text()}),
})


class _TableRows(Schema):
    """The ``rows`` of a table record: each a loss and, per dataset, its cell or null."""

    expected = "a list"
    cell = Record(required={"mean": Number(), "sd": Number(), "seeds": Integer()},
                  optional={"published": nullable(Number()), "delta": nullable(Number())})

    def check(self, value, at: str = "") -> None:
        ListOf(Record(required={"loss": Text()})).check(value, at)
        for number, row in enumerate(value):
            for key, cell in row.items():
                if key != "loss" and cell is not None:
                    self.cell.check(cell, f"{at}[{number}].{key}")


#: a report's ``record`` (a table's results.json, :meth:`ResultsTable.to_json`), read back by
#: ``pipeline render``
TABLE_RECORD_SCHEMA = Record(
    required={"caption": Text(), "datasets": ListOf(Text()), "losses": ListOf(Text()),
              "rows": _TableRows()},
    optional={"notes": ListOf(Text()),
              "provenance": nullable(Record(optional={
                  "command": Text(), "runs_created": nullable(ListOf(Text(), at_least=2)),
                  "featcache_versions": ListOf(Text()), "numerics_versions": ListOf(Text()),
                  "note": Text()})),
              "comparisons": nullable(Record(
                  required={"versus": Text(), "command": Text(),
                            "datasets": MapOf(ListOf(Record(required={"loss": Text(),
                                                                      "estimate": Number()})))}))})

def read_results(path: str | Path, remake: str | Callable[[], str]) -> dict | None:
    """A run's ``results.json`` checked against :data:`RESULTS_SCHEMA` (None when there is
    none); a damaged one is refused naming the key, then ``remake`` (how to train the run
    again: :func:`featcache.protocol.runs.rerun_advice`)."""
    return read_document(path, RESULTS_SCHEMA, "featcache results file", remake)


def read_run_record(path: str | Path) -> dict | None:
    """A run folder's ``run.json`` (its settings and their fingerprint), checked."""
    path = Path(path)
    return read_document(path, RUN_SCHEMA, "featcache run record (run.json)",
                         f"delete {path.parent} to start that run afresh, or train it again "
                         "with --overwrite")


def read_history(path: str | Path) -> dict | None:
    """A finished fine-tuning configuration's ``history.json``, checked."""
    path = Path(path)
    return read_document(path, HISTORY_SCHEMA, "featcache configuration history",
                         f"delete {path} to train that configuration again")


#: the fix for a recipe that cannot be read
RECIPE_ADVICE = ("fix it by hand: the recipe format is described at the top of "
                 "featcache/pipeline.py, and pipelines/*.toml are examples")


def read_recipe(path: str | Path) -> dict:
    """A pipeline recipe (TOML), checked against :data:`RECIPE_SCHEMA`."""
    return read_document(path, RECIPE_SCHEMA, "pipeline recipe", RECIPE_ADVICE, kind="toml")


def read_table_record(path: str | Path, remake: str) -> dict:
    """A pipeline report's table record, checked against :data:`TABLE_RECORD_SCHEMA`."""
    return read_document(path, TABLE_RECORD_SCHEMA, "pipeline table record", remake)
