"""``featcache table``: paper tables from results.json in four formats, seeds pooled and
recorded, published numbers beside ours, LaTeX that compiles."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import statistics
import subprocess

import pytest
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.errors import InputError
from featcache.protocol.results_table import ResultsTable
from featcache.protocol.runs import load_results
from featcache.published import published
from featcache.tables import Estimate, Table, latex_escape

FAST = ("--epochs", "2", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots",
        "--device", "cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two datasets ("voc" has published numbers), an and an-ls, seeds 0 and 1 in one run,
    seed 2 of an on voc in a second run."""
    cache = tmp_path_factory.mktemp("tables") / "cache"
    synthetic_dataset(cache, "voc")
    synthetic_dataset(cache, "toy2", seed=1, classes=4)
    for dataset in ("voc", "toy2"):
        result = invoke("train-linear", "--dataset", dataset, "--loss", "an,an-ls", "--seeds",
                        "0,1", "--run-id", "s01", "--cache", cache, *FAST)
        assert result.exit_code == 0, result.output
    result = invoke("train-linear", "--dataset", "voc", "--loss", "an", "--seeds", "2",
                    "--run-id", "s2", "--cache", cache, *FAST)
    assert result.exit_code == 0, result.output
    return cache


def _table(*args):
    result = invoke("table", *map(str, args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_cells_pool_every_seed_and_record_each_selection(runs):
    results = ResultsTable.from_paths([runs / "voc" / "runs", runs / "toy2" / "runs"],
                                      all_runs=True)
    assert results.losses == ["an", "an-ls"] and results.datasets == ["toy2", "voc"]
    cell = results.cells[("an", "voc")]
    tests = [load_results(runs / "voc" / "runs" / "an" / run)["seeds"][i]["selected"]["test_map"]
             for run, i in (("s01", 0), ("s01", 1), ("s2", 0))]
    assert [s.seed for s in cell.seeds] == [0, 1, 2]
    assert cell.estimate == Estimate(statistics.fmean(tests), statistics.stdev(tests), 3)
    assert cell.published == published("linear", "an", "voc") == 84.2
    assert cell.delta == pytest.approx(cell.estimate.mean - 84.2)
    assert results.cells[("an", "toy2")].published is None
    # one run with two seeds: the same mean +- std as its own summary
    summary = load_results(runs / "toy2" / "runs" / "an" / "s01")["summary"]
    two = results.cells[("an", "toy2")].estimate
    assert (two.mean, two.sd, two.n) == pytest.approx(
        (summary["test_map_mean"], summary["test_map_std"], 2))


def test_markdown_has_the_caption_the_best_in_bold_and_each_seeds_configuration(runs):
    text = _table(runs / "voc" / "runs", runs / "toy2" / "runs", "--all-runs")
    header = next(line for line in text.splitlines() if line.startswith("| loss"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "loss", "toy2", "voc", "voc published", "voc delta"]
    assert text.count("**") == 4  # one best per dataset column
    assert "Test mAP (%) of linear heads on cached features (stage two) on toy2, voc" in text
    assert "16-d toy features" in text and "clean validation mAP" in text
    assert "Mean ± sd over seeds 0, 1, 2 (2/3 per cell)" in text
    assert "Cole et al. CVPR 2021, Table 1 (linear)" in text
    assert "Selected configuration of each seed" in text
    configs = [line for line in text.splitlines() if line.startswith("| an ")]
    assert len(configs) == 1 + 3 + 2  # the main row, then voc's 3 seeds and toy2's 2


def test_csv_and_json_keep_full_precision(runs):
    rows = list(csv.DictReader(io.StringIO(_table(runs / "voc" / "runs", "--format", "csv",
                                                  "--all-runs"))))
    cell = ResultsTable.from_paths([runs / "voc" / "runs"], all_runs=True).cells[("an", "voc")]
    an = next(r for r in rows if r["loss"] == "an")
    assert float(an["voc"]) == cell.estimate.mean and float(an["voc sd"]) == cell.estimate.sd
    assert an["voc seeds"] == "3" and float(an["voc published"]) == 84.2
    document = json.loads(_table(runs / "voc" / "runs", runs / "toy2" / "runs", "--format", "json",
                                 "--all-runs"))
    assert document["losses"] == ["an", "an-ls"] and "caption" in document
    voc = document["rows"][0]["voc"]
    assert [s["seed"] for s in voc["selected"]] == [0, 1, 2]
    assert {"lr", "batch_size", "epoch", "params", "val_map", "test_map", "run"} <= set(voc["selected"][0])


def test_latex_is_booktabs_with_the_best_in_bold(runs, tmp_path):
    text = _table(runs / "voc" / "runs", runs / "toy2" / "runs", "--format", "latex")
    table = text.split("\\end{table}")[0]
    assert table.startswith("\\begin{table}[t]")
    assert table.index("\\toprule") < table.index("\\midrule") < table.index("\\bottomrule")
    assert "\\begin{tabular}{lrrrr}" in table and "\\caption{Test mAP (\\%)" in table
    assert table.count("\\textbf{") == 2 and "$\\pm$" in table and "an-ls" in table
    body = table[table.index("\\midrule"):table.index("\\bottomrule")]
    assert all(line.rstrip().endswith("\\\\") and line.count("&") == 4
               for line in body.splitlines()[1:] if line.strip())
    assert text.count("{") == text.count("}")
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed: the structure was checked, not compiled")
    document = ("\\documentclass{article}\\usepackage{booktabs}\\usepackage[utf8]{inputenc}"
                "\\begin{document}\n" + text + "\\end{document}\n")
    (tmp_path / "t.tex").write_text(document)
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "t.pdf").stat().st_size > 1000


def test_per_class_tables(runs):
    text = _table(runs / "toy2" / "runs", "--per-class")
    assert "Per-class test AP (%) of linear heads on cached features (stage two) on toy2" in text
    assert "Best loss per class in bold" in text
    lines = [line for line in text.splitlines() if re.match(r"\| c\d", line)]
    assert [line.split("|")[1].strip() for line in lines] == ["c0", "c1", "c2", "c3"]
    document = load_results(runs / "toy2" / "runs" / "an" / "s01")
    per_seed = [s["selected"]["test_ap_per_class"]["c0"] for s in document["seeds"]]
    results = ResultsTable.from_paths([runs / "toy2" / "runs"])
    assert results.cells[("an", "toy2")].per_class()[0]["c0"].mean == pytest.approx(
        statistics.fmean(per_seed))
    flat = list(csv.DictReader(io.StringIO(_table(runs / "toy2" / "runs", "--per-class",
                                                  "--format", "csv"))))
    assert len(flat) == 4 * 2 and flat[0]["dataset"] == "toy2"
    latex = _table(runs / "toy2" / "runs", "--per-class", "--format", "latex")
    assert latex.count("\\begin{table}") == 1


def test_runs_that_cannot_share_a_cell_are_refused(runs, tmp_path):
    other = tmp_path / "cache"
    shutil.copytree(runs / "voc", other / "voc")
    result = invoke("train-linear", "--dataset", "voc", "--loss", "an", "--seeds", "0",
                    "--run-id", "e3", "--cache", other, "--epochs", "3", "--lr", "1e-2",
                    "--bsize", "16", "--quiet", "--no-plots", "--device", "cpu")
    assert result.exit_code == 0, result.output
    with pytest.raises(InputError, match="different settings .*epochs: 2 -> 3"):
        ResultsTable.from_paths([other / "voc" / "runs" / "an" / "s2",
                                 other / "voc" / "runs" / "an" / "e3"])
    named_twice = ResultsTable.from_paths([other / "voc" / "runs" / "an" / "s01",
                                           other / "voc" / "runs" / "an" / "s01" / "results.json",
                                           other / "voc" / "runs" / "an" / ".." / "an" / "s01"])
    assert [s.seed for s in named_twice.cells[("an", "voc")].seeds] == [0, 1]
    shutil.copytree(other / "voc" / "runs" / "an" / "s01", other / "voc" / "runs" / "an" / "copy")
    with pytest.raises(InputError, match="seed 0 of an on voc appears in both"):
        ResultsTable.from_paths([other / "voc" / "runs" / "an" / "s01",
                                 other / "voc" / "runs" / "an" / "copy"])
    missing = invoke("table", tmp_path / "nothing")
    assert missing.exit_code != 0 and "neither a run folder nor a folder of runs" in missing.output


def test_the_console_and_the_run_table_show_each_seeds_selection(runs):
    result = invoke("train-linear", "--dataset", "voc", "--loss", "an,an-ls", "--seeds", "0,1",
                    "--run-id", "s01", "--cache", runs, *FAST)  # reused: prints the same lines
    assert result.exit_code == 0, result.output
    line = next(li for li in result.stdout.splitlines() if li.startswith("an:"))
    document = load_results(runs / "voc" / "runs" / "an" / "s01")
    summary = document["summary"]
    assert f"test {summary['test_map_mean']:.2f} +- {summary['test_map_std']:.2f} over 2 seeds" in line
    for seed in document["seeds"]:
        chosen = seed["selected"]
        assert (f"seed {seed['seed']}: lr {chosen['lr']:g}, batch {chosen['batch_size']}, "
                f"epoch {chosen['best_epoch']}") in line
    table = (runs / "voc" / "runs" / "table-s01.md").read_text()
    row = next(li for li in table.splitlines() if li.startswith("| an "))
    epochs = "/".join(str(s["selected"]["best_epoch"]) for s in document["seeds"])
    assert re.search(rf"\|\s*{re.escape(epochs)}\s*\|", row)


def test_latex_escaping_and_estimates():
    assert latex_escape("ours_1 & 5% #x {y} ~^\\") == (
        "ours\\_1 \\& 5\\% \\#x \\{y\\} \\textasciitilde{}\\textasciicircum{}\\textbackslash{}")
    table = Table(["loss", "voc"], caption="c")
    table.add("an", Estimate(84.2, 0.5, 3))
    table.add("role", Estimate(86.5))
    table.bold.add((1, 1))
    assert "| an   | 84.20 ± 0.50 |" in table.markdown() and "**86.50**" in table.markdown()
    assert "role & \\textbf{86.50} \\\\" in table.latex()
    assert table.records()[0]["voc"] == {"mean": 84.2, "sd": 0.5, "n": 3}


def test_a_folder_of_runs_takes_the_latest_run_of_each_loss_and_says_which(runs):
    """The README's first example, `featcache table cache/<ds>/runs`, with two runs of a loss."""
    result = invoke("table", runs / "voc" / "runs")
    assert result.exit_code == 0, result.output
    assert ("note: an on voc: the latest of 2 runs, s2 (not s01; --run-id ID takes another, "
            "--all-runs pools them)") in result.stderr
    latest = ResultsTable.from_paths([runs / "voc" / "runs"])
    assert [s.seed for s in latest.cells[("an", "voc")].seeds] == [2]
    assert [s.seed for s in latest.cells[("an-ls", "voc")].seeds] == [0, 1]
    by_id = ResultsTable.from_paths([runs / "voc" / "runs"], run_id="s01")
    assert [s.seed for s in by_id.cells[("an", "voc")].seeds] == [0, 1] and not by_id.chosen
    assert invoke("table", runs / "voc" / "runs", "--run-id", "s01").exit_code == 0
    missing = invoke("table", runs / "voc" / "runs", "--run-id", "s9")
    assert missing.exit_code == 1 and "run ids there: s01, s2" in missing.output
    both = invoke("table", runs / "voc" / "runs", "--run-id", "s01", "--all-runs")
    assert both.exit_code == 1 and "give one" in both.output
