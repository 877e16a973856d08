"""The listing commands on a set of 100,000 classes (issue 45, class 6): ``table`` printed a short
table after minutes of work quadratic in the classes (the classes without a test positive were
gathered with a list's ``in``); it and ``report`` now cost what they show. How long they take is
measured by ``python -m benchmarks.listing`` (never asserted here); this checks that both
finish on such a run, for real, and that the table stays as short as what it shows."""

from __future__ import annotations

import json

import pytest
from dataset_fixtures import invoke
from faults import run_many
from linear_fixtures import synthetic_dataset

CLASSES = 100_000


@pytest.mark.slow
def test_table_and_report_of_a_run_of_100000_classes_finish_and_show_what_they_should(
        tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="big", classes=4, n_train=40, n_test=20)
    made = invoke("train-linear", "--dataset", "big", "--cache", cache, "--loss", "an",
                  "--epochs", "1", "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots",
                  "--device", "cpu", "--run-id", "r")
    assert made.exit_code == 0, made.output
    run = cache / "big" / "runs" / "an" / "r"
    (run / "test-scores.h5").unlink()  # scored on 4 classes: the report says it has none
    document = json.loads((run / "results.json").read_text())
    names = [f"class{i}" for i in range(CLASSES)]
    per_class = {name: float(i % 97) for i, name in enumerate(names)}
    document["selection"]["test_ap_per_class"] = per_class
    document["seeds"][0]["selected"]["test_ap_per_class"] = per_class
    document["sizes"]["classes"] = CLASSES
    for part in ("validation", "test"):
        coverage = document["evaluation"][part]
        coverage["positives_per_class"] = dict.fromkeys(names, 1)
        coverage["classes_without_positives"] = names[1:]
    (run / "results.json").write_text(json.dumps(document))

    table, report = run_many([["table", str(cache / "big" / "runs")],
                              ["report", str(cache / "big"), "--out", str(tmp_path / "r.html")]],
                             tmp_path, timeout=600)
    assert table.returncode == 0 and report.returncode == 0, table.stderr + report.stderr
    assert len(table.stdout) < 4000, len(table.stdout)  # a row per loss, notes that count
    assert f"{CLASSES - 1} classes have no positive in the test split" in table.stdout
    assert "and 99991 more" in table.stdout
    assert (tmp_path / "r.html").stat().st_size > 0
