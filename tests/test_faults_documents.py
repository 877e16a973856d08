"""featcache's own files, damaged or edited by hand (issue 45, class 1): every file featcache
reads back is checked on reading (a schema per JSON document, kinds and shapes per HDF5
dataset), and each case below ends in one line naming the file, what is wrong and the command
that makes it again, with every other file byte-identical. The commands run for real, each in
its own process (:func:`faults.run_many`); the command printed works when pasted."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke
from faults import digests, one_error_line, run_many
from linear_fixtures import synthetic_dataset

LINEAR = ["train-linear", "--dataset", "toy", "--backbone", "toy", "--loss", "an", "--epochs",
          "2", "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots", "--device", "cpu"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A cache with one finished linear run ``r1`` whose results record its command line."""
    cache = tmp_path_factory.mktemp("documents") / "cache"
    synthetic_dataset(cache, name="toy", classes=4, n_train=40, n_test=20)
    argv, before = sys.argv, os.environ.get("FEATCACHE_CACHE")
    sys.argv = ["featcache", *LINEAR, "--run-id", "r1"]
    os.environ["FEATCACHE_CACHE"] = str(cache)
    try:  # in-process (setting up); the command line recorded as a user's
        made = invoke(*sys.argv[1:])
    finally:
        sys.argv = argv
        if before is None:
            del os.environ["FEATCACHE_CACHE"]
        else:
            os.environ["FEATCACHE_CACHE"] = before
    assert made.exit_code == 0, made.output
    return cache



def _edit_json(path: Path, change) -> None:
    document = json.loads(path.read_text())
    document = change(document)
    path.write_text(json.dumps(document))


def _set(keys: tuple[str, ...], value):
    def change(document):
        inner = document
        for key in keys[:-1]:
            inner = inner[key]
        inner[keys[-1]] = value
        return document
    return change


def _replace_dataset(path: Path, key: str, data) -> None:
    with h5py.File(path, "a") as h5:
        del h5[key]
        h5[key] = data


def _observed_halves(path: Path) -> None:
    with h5py.File(path, "r") as h5:
        observed = h5["train/observed"][()].astype(np.float64)
    observed[observed == 1] = 0.5
    _replace_dataset(path, "train/observed", observed)


def _head_without_bias(path: Path) -> None:
    import torch

    head = torch.load(path, weights_only=True)
    del head["bias"]
    torch.save(head, path)


def test_damaged_or_hand_edited_files_are_refused_in_one_line_naming_file_key_and_remake(
        finished, tmp_path, monkeypatch):
    run = "toy/runs/an/r1"
    # (what is damaged, how, the command that reads it, what the line says)
    cases = [
        (f"{run}/results.json", lambda p: _edit_json(p, _set(("selection", "test_map"), "87.1")),
         ["report", "{cache}/toy", "--out", "{root}/report.html"],
         "is not a valid featcache results file: selection.test_map is the string '87.1', "
         "expected a number; train the run again: `featcache train-linear"),
        (f"{run}/results.json", lambda p: _edit_json(p, _set(("summary",), None)),
         ["table", "{cache}/toy/runs"],
         "is not a valid featcache results file: summary is null, expected an object; train the "
         "run again: `featcache train-linear"),
        (f"{run}/results.json", lambda p: p.write_text("[1, 2]"),
         ["predict", "--run", "{cache}/" + run, "--features", "{cache}/toy/features-toy.h5",
          "--out", "{root}/p.csv"],
         "is not a valid featcache results file: the document is a list, expected an object; "
         "train the run again"),
        (f"{run}/run.json", lambda p: p.write_bytes(bytes(range(256)) * 3),
         [*LINEAR, "--cache", "{cache}", "--run-id", "r1"],
         "is not a valid featcache run record (run.json): it holds binary data, not text; "
         "delete {cache}/" + run + " to start that run afresh, or train it again with "
         "--overwrite"),
        ("toy/labels.h5", lambda p: _replace_dataset(p, "classes", np.arange(4)),
         ["info", "{cache}/toy/labels.h5"],
         "/classes holds int64 numbers, expected text; make it again"),
        ("toy/labels.h5", _observed_halves,
         [*LINEAR, "--cache", "{cache}", "--run-id", "half"],
         "/train/observed holds 0.5 at row 0, class "),
        ("toy/features-toy.h5",
         lambda p: _replace_dataset(p, "train/features", np.zeros((40, 16), np.int32)),
         [*LINEAR, "--cache", "{cache}", "--run-id", "ints"],
         "/train/features holds int32 numbers, expected floating-point numbers; make it again"),
        (f"{run}/best.pt", _head_without_bias,
         ["predict", "--run", "{cache}/" + run, "--features", "{cache}/toy/features-toy.h5",
          "--out", "{root}/p.csv"],
         "is not a valid featcache linear head: bias is missing; train the run again: "
         "`featcache train-linear"),
        ("r.toml", lambda p: p.write_bytes(b"\x00\x01binary\xff" * 10),
         ["pipeline", "run", "{root}/r.toml", "--dry-run"],
         "r.toml is not a valid pipeline recipe: it holds binary data, not text; fix it by hand"),
        ("r.toml", lambda p: p.write_text('name = "r"\nsteps = "not a list"\n'),
         ["pipeline", "run", "{root}/r.toml", "--dry-run"],
         "r.toml is not a valid pipeline recipe: steps is the string 'not a list', expected a "
         "list; fix it by hand"),
    ]
    roots, argv = [], []
    for number, (damaged, damage, command, _) in enumerate(cases):
        root = tmp_path / f"case{number}"
        cache = shutil.copytree(finished, root / "cache")
        target = (cache if damaged.startswith("toy/") else root) / damaged
        damage(target)
        roots.append((root, target, digests(root, target)))
        argv.append([word.format(cache=cache, root=root) for word in command])
    results = run_many(argv, tmp_path, prelude="import torch")
    for (root, target, before), result, (damaged, _, _, says) in zip(roots, results, cases,
                                                                       strict=True):
        line = one_error_line(result)
        assert line.startswith(str(target) if damaged.startswith("toy/") else
                               str(root)), line
        assert says.format(cache=root / "cache") in line, line
        assert digests(root, target) == before, damaged  # nothing else touched, nothing made

    # the command the first line names trains the run again when pasted
    first = one_error_line(results[0])
    words = shlex.split(first.rsplit("`", 2)[-2])
    assert words[0] == "featcache" and words[-1] == "--overwrite"
    fixed = roots[0][0] / "cache" / run / "results.json"
    monkeypatch.setenv("FEATCACHE_CACHE", str(roots[0][0] / "cache"))
    remade = invoke(*words[1:])
    assert remade.exit_code == 0, remade.output
    assert isinstance(json.loads(fixed.read_text())["selection"]["test_map"], float)


def test_every_results_file_the_stages_write_fits_its_schema(finished):
    from featcache.protocol.documents import RESULTS_SCHEMA, RUN_SCHEMA

    run = finished / "toy" / "runs" / "an" / "r1"
    RESULTS_SCHEMA.check(json.loads((run / "results.json").read_text()))
    RUN_SCHEMA.check(json.loads((run / "run.json").read_text()))


def test_the_schema_names_the_deepest_key_that_is_wrong():
    from featcache.protocol.documents import HISTORY_SCHEMA, RESULTS_SCHEMA
    from featcache.schema import Mismatch

    document = {"dataset": "d", "loss": "an", "selection": {"test_map": 1.0},
                "seeds": [{"selected": {"seed": 0, "test_map": 1.0, "params": {"k": "two"}}}]}
    with pytest.raises(Mismatch, match=r"^seeds\[0\]\.selected\.params\.k is the string 'two', "
                                       r"expected a number or null$"):
        RESULTS_SCHEMA.check(document)
    with pytest.raises(Mismatch, match=r"^selection is missing$"):
        RESULTS_SCHEMA.check({"dataset": "d", "loss": "an"})
    epoch = {"epoch": 1, "train_loss": 0.5, "val_map_observed": 1.0, "test_map": 1.0}
    history = {"lr": 0.1, "batch_size": 8, "best_epoch": 1, "best_val": 1.0, "test_ap": [1.0],
               "stopped_at": None, "seconds": 1.0, "epochs": [epoch]}
    HISTORY_SCHEMA.check(history)
    with pytest.raises(Mismatch, match=r"^epochs\[0\]\.loss is not a key this file holds$"):
        HISTORY_SCHEMA.check({**history, "epochs": [{**epoch, "loss": 1}]})


def test_a_pseudo_label_file_holding_other_values_is_refused(finished, tmp_path):
    from featcache.data.labelfile import load_labels
    from featcache.data.pseudofile import load_pseudo_labels, write_pseudo_labels
    from featcache.errors import InputError

    labels = load_labels(finished / "toy" / "labels.h5")
    path = write_pseudo_labels(tmp_path / "pseudo-labels-vlpl.h5", labels,
                               np.zeros((len(labels.train), labels.num_classes), np.int8),
                               {"name": "vlpl", "rule": "vlpl"})
    _replace_dataset(path, "train/pseudo",
                     np.full((len(labels.train), labels.num_classes), 0.5))
    with pytest.raises(InputError, match=r"/train/pseudo holds 0.5 at row 0, class 0; "
                                         r"pseudo-labels are 1, 0 and -1; make it again: "
                                         r"`featcache pseudo-label --dataset "):
        load_pseudo_labels(path, labels)
