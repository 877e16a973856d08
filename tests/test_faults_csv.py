"""Output that a spreadsheet would run (issue 45, class 5): class names and image names such as
``=cmd|' /C calc'!A0`` or ``+SUM(1+1)`` are written into ``table --format csv`` and
``predict``'s CSV with a leading ``'`` (OWASP's CSV-injection rule: cells starting with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return); numbers, negative ones included, are written
as they are. The commands run for real, each in its own process."""

from __future__ import annotations

import csv
import io

import numpy as np
from dataset_fixtures import invoke
from faults import run_many

from featcache.data.featurewrite import write_features
from featcache.data.labelfile import LabelSet, SplitLabels, load_labels, write_labels
from featcache.data.sampling import observe_uniform, split_train_val
from featcache.tables import Table, spreadsheet_safe

HOSTILE = ["=cmd|' /C calc'!A0", "+SUM(1+1)", "-2+3", "@A1", "\tTAB", "plain"]


def _dataset(cache, rows: int = 40) -> None:
    """A dataset whose class names and image names would run in a spreadsheet."""
    rng = np.random.default_rng(0)
    classes = len(HOSTILE)

    def split(n, prefix):
        clean = np.zeros((n, classes), np.uint8)
        clean[np.arange(n), np.arange(n) % classes] = 1
        names = np.array([f"{prefix}{i:03d}.jpg" for i in range(n)], dtype=object)
        names[0] = f"=HYPERLINK(\"x\")-{prefix}.jpg"
        return SplitLabels(names, observe_uniform(clean), clean)

    train, test = split(rows, "train/"), split(rows // 2, "test/")
    train_idx, val_idx = split_train_val(rows)
    path = cache / "evil" / "labels.h5"
    write_labels(LabelSet("evil", HOSTILE, train, test, train_idx, val_idx), path)
    labels = load_labels(path)
    basis = rng.standard_normal((classes, 8)).astype(np.float32)
    write_features(cache / "evil" / "features-toy.h5", labels,
                   {name: (part.clean @ basis + rng.standard_normal((len(part), 8))).astype(
                       np.float32) for name, part in (("train", train), ("test", test))},
                   {"backbone": "toy", "weights": "none"})


def _cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_cells_a_spreadsheet_would_run_are_escaped_in_table_and_predict_csv(tmp_path):
    cache = tmp_path / "cache"
    _dataset(cache)
    made = invoke("train-linear", "--dataset", "evil", "--cache", cache, "--loss", "an",
                  "--epochs", "1", "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots",
                  "--device", "cpu", "--run-id", "r")
    assert made.exit_code == 0, made.output
    run = cache / "evil" / "runs" / "an" / "r"
    table, per_class = run_many([
        ["table", str(run), "--format", "csv"],
        ["table", str(run), "--format", "csv", "--per-class"],
        ["predict", "--run", str(run), "--features", str(cache / "evil" / "features-toy.h5"),
         "--out", str(tmp_path / "p.csv"), "--top-k", "2"],
    ], tmp_path, prelude="import torch")[:2]
    assert table.returncode == 0 and per_class.returncode == 0, table.stderr + per_class.stderr
    escaped = ["'" + name if name[0] in "=+-@\t" else name for name in HOSTILE]
    rows = _cells(per_class.stdout)
    assert [row[1] for row in rows[1:]] == escaped  # the class column, each class once
    assert all(float(row[3]) >= 0 for row in rows[1:])  # numbers as they are

    predictions = _cells((tmp_path / "p.csv").read_text())
    assert predictions[0] == ["image", *escaped, "labels"]
    assert predictions[1][0] == "'=HYPERLINK(\"x\")-train/.jpg"
    assert all(not cell.startswith(("=", "+", "@", "\t")) and
               (not cell.startswith("-") or _number(cell))
               for row in predictions for cell in row)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_numbers_stay_numbers_and_only_text_is_escaped():
    table = Table(["name", "delta", "text"])
    table.add("-x", -1.5, "-0.25")
    table.add("@y", 2.0, "\rz")
    assert _cells(table.csv()) == [["name", "delta", "text"], ["'-x", "-1.5", "-0.25"],
                                   ["'@y", "2.0", "'\rz"]]
    assert spreadsheet_safe(-3) == -3 and spreadsheet_safe("plain") == "plain"
    assert spreadsheet_safe("+1") == "+1" and spreadsheet_safe("+1+1") == "'+1+1"
