"""``featcache train-linear``: run directories, resume, refusals, and a real feature set."""

from __future__ import annotations

import json
import time

import h5py
import numpy as np
import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import pseudo_label_sets, spatial_features_file, synthetic_dataset

from featcache.losses import loss_names
from featcache.protocol.handoff import load_head
from featcache.protocol.numerics import NUMERICS_VERSION
from featcache.protocol.runs import best_run, load_results

FAST = ("--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots")


@pytest.fixture
def toy(cache_dir):
    synthetic_dataset(cache_dir)
    return cache_dir


def run_dir(cache, loss, run_id="r1"):
    return cache / "toy" / "runs" / loss / run_id


def test_a_run_writes_results_head_summary_and_curves(toy):
    result = invoke("train-linear", "--dataset", "toy", "--loss", "role", "--run-id", "r1",
                    "--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "8,16", "--quiet")
    assert result.exit_code == 0, result.output
    directory = run_dir(toy, "role")
    for name in ("results.json", "best.pt", "summary.md", "curves.png"):
        assert (directory / name).is_file(), name
    document = load_results(directory)
    assert document["loss"] == "role" and document["dataset"] == "toy"
    assert len(document["seeds"][0]["configs"]) == 4
    assert all(len(c["epochs"]) == 2 for c in document["seeds"][0]["configs"])
    assert set(document["selection"]["test_ap_per_class"]) == {f"c{i}" for i in range(5)}
    assert document["labels"]["sha256"] and document["features"]["sha256"]
    assert document["selection"]["params"]["k"] > 1.0  # from the labels file
    head = load_head(directory)
    assert head["weight"].shape == (5, 16) and head["handoff"]["phi"].shape[1] == 5
    assert head["lr"] == document["selection"]["lr"]
    assert best_run(directory.parent) == directory


def test_rerunning_a_finished_run_reuses_it_and_other_settings_are_refused(toy):
    args = ("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r1", *FAST)
    assert invoke(*args).exit_code == 0
    before = (run_dir(toy, "an") / "results.json").read_bytes()
    again = invoke(*args)
    assert again.exit_code == 0 and "reusing" in again.output
    assert (run_dir(toy, "an") / "results.json").read_bytes() == before
    other = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r1",
                   "--epochs", "3", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots")
    assert other.exit_code != 0 and "--overwrite" in other.output
    assert (run_dir(toy, "an") / "results.json").read_bytes() == before
    replaced = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r1",
                      "--epochs", "3", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots",
                      "--overwrite")
    assert replaced.exit_code == 0
    assert json.loads((run_dir(toy, "an") / "results.json").read_text())["protocol"]["epochs"] == 3


def test_a_finished_run_of_another_numerics_version_is_trained_again_and_tables_mark_it(toy):
    args = ("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "r1", *FAST)
    assert invoke(*args).exit_code == 0
    results = run_dir(toy, "an") / "results.json"
    document = json.loads(results.read_text())
    assert document["numerics_version"] == NUMERICS_VERSION
    del document["numerics_version"]  # as written before featcache recorded it
    results.write_text(json.dumps(document))
    table = invoke("table", toy / "toy" / "runs", "--run-id", "r1")
    assert table.exit_code == 0, table.output
    assert "1 run was made under another numerics version" in table.output
    assert "an on toy" in table.output
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert "finished with no numerics version" in again.output and "training it again" in again.output
    assert "reusing" not in again.output
    assert json.loads(results.read_text())["numerics_version"] == NUMERICS_VERSION
    assert "numerics version" not in invoke("table", toy / "toy" / "runs", "--run-id", "r1").output


def test_loss_all_trains_every_loss_and_writes_a_table(toy):
    pseudo_label_sets(toy / "toy" / "labels.h5")  # what vlpl and gpr train on
    spatial_features_file(toy / "toy" / "labels.h5")  # what the BoostLU losses train on
    began = time.perf_counter()
    result = invoke("train-linear", "--dataset", "toy", "--loss", "all", "--run-id", "all",
                    "--epochs", "1", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots")
    wall = time.perf_counter() - began
    assert result.exit_code == 0, result.output
    table = (toy / "toy" / "runs" / "table-all.md").read_text()
    for name in loss_names():
        assert f"| {name} " in table, name
    rows = json.loads((toy / "toy" / "runs" / "table-all.json").read_text())
    assert len(rows) == len(loss_names())
    assert (toy / "toy" / "runs" / "table-all.csv").read_text().startswith("loss,")
    # Issue 46, item 5: each loss has its share of the groups it was stacked in, so the
    # per-loss seconds add up to the command's time, not to a multiple of it.
    documents = {name: load_results(run_dir(toy, name, "all")) for name in loss_names()}
    seconds = {name: doc["timings"]["seconds"] for name, doc in documents.items()}
    assert 0 < sum(seconds.values()) <= 1.25 * wall, (sum(seconds.values()), wall)
    assert sum(row["seconds"] for row in rows) == pytest.approx(sum(seconds.values()))
    groups = {}  # each group's share, as each of its losses records it
    for name, doc in documents.items():
        shared = doc["timings"]["shared"]
        assert shared["losses"] > 1 and shared["span_seconds"] >= 0
        assert seconds[name] == pytest.approx(sum(
            g["seconds"] * g["these_heads"] / g["heads"] for g in shared["groups"]))
        for group in shared["groups"]:
            assert name in group["losses"] and group["busy_seconds"] >= group["seconds"] - 1e-6
            key = (tuple(group["losses"]), group["seed"], group["batch_size"])
            groups.setdefault(key, group["seconds"])
            assert groups[key] == group["seconds"]  # the same share, whoever records it
    # the losses' shares of a group add up to the group's share
    assert sum(seconds.values()) == pytest.approx(sum(groups.values()))
    line = next(x for x in result.output.splitlines() if x.startswith("role: "))
    together = documents["role"]["timings"]["shared"]["losses"]
    assert f"; {seconds['role']:.1f} s, its share of the time {together} losses trained " \
           "together) -> " in line, line
    # Results written before the shares (no timings.shared) read as before everywhere.
    for name in loss_names():
        path = run_dir(toy, name, "all") / "results.json"
        document = json.loads(path.read_text())
        del document["timings"]["shared"]
        path.write_text(json.dumps(document))
    from featcache import load_run
    from featcache.linear.report import SHARED_SECONDS, losses_table
    from featcache.report import build_report

    old = losses_table("toy", {name: load_results(run_dir(toy, name, "all")) for name in loss_names()})
    assert SHARED_SECONDS not in old.markdown()
    assert invoke("table", toy / "toy" / "runs", "--run-id", "all").exit_code == 0
    assert "trained together" not in build_report(toy / "toy", ["all"])
    assert load_run(run_dir(toy, "an", "all")).metrics["test_map"] == documents["an"]["selection"]["test_map"]


@pytest.mark.parametrize("args, message", [
    (("--loss", "qqqq"), "unknown loss 'qqqq'; valid losses: bce"),
    (("--loss", "an", "--param", "alpha=0.1"), "alpha"),
    (("--loss", "an-ls", "--param", "eps_neg=abc"), "'abc' is not a number"),
    (("--loss", "an", "--lr", "1e-2,fast"), "'fast' is not a number"),
    (("--loss", "an", "--bsize", "8.5"), "'8.5' is not an integer"),
    (("--loss", "an", "--bsize", "1000"), "larger than the"),
])
def test_bad_options_get_one_clear_error(toy, args, message):
    result = invoke("train-linear", "--dataset", "toy", "--epochs", "1", "--quiet", *args)
    assert result.exit_code != 0
    assert message in result.output


def test_features_built_from_other_labels_are_refused(toy):
    synthetic_dataset(toy)  # rewrites labels.h5 (new sha256) and the features...
    labels = toy / "toy" / "labels.h5"
    features = toy / "toy" / "features-toy.h5"
    with h5py.File(features, "a") as h5:
        h5.attrs["labels_sha256"] = "0" * 64  # ...now pretend they came from other labels
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", *FAST)
    assert result.exit_code != 0
    assert f"{labels} was prepared again after {features} was extracted" in result.output
    assert "run `featcache features --dataset toy --backbone toy --overwrite`" in result.output


def test_nan_features_are_refused_naming_the_rows(toy):
    with h5py.File(toy / "toy" / "features-toy.h5", "a") as h5:
        data = h5["train/features"]
        row = data[3]
        row[0] = np.nan
        data[3] = row
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", *FAST)
    assert result.exit_code != 0
    assert "NaN or Inf" in result.output and "row 3" in result.output


def test_an_empty_validation_split_is_refused(toy):
    with h5py.File(toy / "toy" / "labels.h5", "a") as h5:
        del h5["split/val"]
        h5["split"].create_dataset("val", data=np.zeros(0, dtype=np.int64))
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", *FAST)
    assert result.exit_code != 0 and "/split/val is empty" in result.output


def test_single_positive_only_data_refuses_full_label_losses_and_clean_validation(cache_dir):
    synthetic_dataset(cache_dir, name="sp", clean_train=False)
    refused = invoke("train-linear", "--dataset", "sp", "--loss", "bce", *FAST)
    assert refused.exit_code != 0 and "no clean training labels" in refused.output
    clean_val = invoke("train-linear", "--dataset", "sp", "--loss", "an", "--val", "clean", *FAST)
    assert clean_val.exit_code != 0
    assert "--val clean: " in clean_val.output and "no clean validation labels" in clean_val.output
    assert "use --val observed" in clean_val.output
    # without --val, the observed labels are chosen, and the command says so in one line
    auto = invoke("train-linear", "--dataset", "sp", "--loss", "an", "--run-id", "auto", *FAST)
    assert auto.exit_code == 0, auto.output
    notes = [line for line in auto.output.splitlines() if "no clean validation labels" in line]
    assert len(notes) == 1 and "selecting by validation mAP on the observed labels" in notes[0]
    assert load_results(cache_dir / "sp" / "runs" / "an" / "auto")["protocol"]["val_variant"] == "observed"
    ok = invoke("train-linear", "--dataset", "sp", "--loss", "epr,an", "--val", "observed",
                "--run-id", "x", *FAST)
    assert ok.exit_code == 0, ok.output
    document = load_results(cache_dir / "sp" / "runs" / "epr" / "x")
    assert document["selection"]["val_map"] is None and document["selection"]["train_map"] is None
    assert document["selection"]["params"]["k"] > 1.0  # the k recorded by prepare


@pytest.mark.shared_data
def test_real_yeast_full_labels_beat_single_positives_and_the_run_reloads(cache_dir, shared_data):
    imported = invoke("prepare", "features", "--npz", shared_data / "yeast" / "yeast.npz",
                      "--name", "yeast")
    assert imported.exit_code == 0, imported.output
    result = invoke("train-linear", "--dataset", "yeast", "--loss", "bce,an", "--run-id", "r",
                    "--epochs", "8", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots")
    assert result.exit_code == 0, result.output
    runs = cache_dir / "yeast" / "runs"
    full = load_results(runs / "bce" / "r")["selection"]["test_map"]
    single = load_results(runs / "an" / "r")["selection"]["test_map"]
    assert full > single + 1.0, (full, single)
    head = load_head(best_run(runs / "an"))
    assert head["weight"].shape == (14, 103) and head["classes"][0] == "Class1"
    assert "phi" not in head["handoff"] and torch.isfinite(head["weight"]).all()


def test_param_axes_are_in_the_summary_grid_line_and_the_selected_values_in_the_console(toy):
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an-ls", "--run-id", "p",
                    "--param", "eps_neg=0.05,0.2", "--epochs", "1", "--lr", "1e-2", "--bsize", "16",
                    "--quiet", "--no-plots")
    assert result.exit_code == 0, result.output
    directory = run_dir(toy, "an-ls", "p")
    chosen = load_results(directory)["selection"]["params"]["eps_neg"]
    summary = (directory / "summary.md").read_text()
    assert "- grid: lr 0.01 x batch 16 x eps_neg 0.05, 0.2, 1 epoch," in summary
    line = next(x for x in result.output.splitlines() if x.startswith("an-ls: val"))
    assert f"(lr 0.01, batch 16, eps_neg={chosen:g}, epoch 1;" in line


def test_what_the_writer_prepares_while_a_core_is_free_leaves_its_numbers_as_they_were(
        toy, monkeypatch):
    """The search hands ``on_idle`` the writer's preparation (the test rows' bootstrap counts,
    kept); a run written after it records the same intervals and label sets as one written
    without it."""
    import featcache.linear.run as run_module
    import featcache.stats.resample as resample
    from featcache.stats import Resampling

    real = run_module.run_searches
    prepared = []

    def free_core_first(*args, on_idle=None, **kwargs):
        prepared.append(on_idle)
        on_idle()  # as if a core were free before the writing
        return real(*args, **kwargs)

    def run(run_id):
        monkeypatch.setattr(resample, "_KEPT", {})
        assert invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", run_id,
                      *FAST).exit_code == 0
        return load_results(run_dir(toy, "an", run_id))

    monkeypatch.setattr(run_module, "run_searches", free_core_first)
    first = run("prepared")
    assert len(prepared) == 1 and (Resampling(), 60) in resample._KEPT  # 60 test rows
    monkeypatch.setattr(run_module, "run_searches", real)
    second = run("plain")
    for key in ("uncertainty", "label_sets", "selection"):
        assert first[key] == second[key], key
