"""Declared recipes: variables, steps, resume, report."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset
from shipped_losses import SHIPPED_LOSSES

import featcache
from featcache.pipeline import list_recipes, load_recipe, readme_block
from featcache.sections import readme_section

REPO = Path(__file__).resolve().parents[1]

RECIPE = """
name = "toy-table"
description = "two losses on two toy datasets"

[vars]
run_id = "t"
epochs = "1"

[[steps]]
name = "first"
command = ["train-linear", "--dataset", "toy", "--loss", "an,an-ls", "--run-id", "{run_id}",
           "--epochs", "{epochs}", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots"]

[[steps]]
name = "second"
command = ["train-linear", "--dataset", "toy2", "--loss", "an,an-ls", "--run-id", "{run_id}",
           "--epochs", "{epochs}", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots"]

[report]
stage = "linear"
run_id = "{run_id}"
datasets = ["toy", "toy2"]
"""


def test_a_recipe_runs_its_steps_and_writes_one_table(cache_dir, tmp_path):
    synthetic_dataset(cache_dir, "toy")
    synthetic_dataset(cache_dir, "toy2", seed=1)
    recipe = tmp_path / "toy.toml"
    recipe.write_text(RECIPE)
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 0, result.output
    report = cache_dir / "pipelines" / "toy-table"
    rows = json.loads((report / "results.json").read_text())["rows"]
    assert [r["loss"] for r in rows] == ["an", "an-ls"]
    assert all(r["toy"]["mean"] and r["toy2"]["mean"] for r in rows)
    # the report is `featcache table` over the same runs
    table = invoke("table", cache_dir / "toy" / "runs", cache_dir / "toy2" / "runs")
    assert table.exit_code == 0, table.output
    assert table.output.strip() in (report / "results.md").read_text()
    assert (report / "results.tex").read_text().startswith("\\begin{table}")
    again = invoke("pipeline", "run", recipe)  # finished runs are reused
    assert again.exit_code == 0 and again.output.count("reusing") == 4
    # ... unless made under another numerics version: such a run is trained again
    results = cache_dir / "toy2" / "runs" / "an-ls" / "t" / "results.json"
    results.write_text(json.dumps(json.loads(results.read_text()) | {"numerics_version": 0}))
    assert "1 run was made under another numerics version" in invoke(
        "table", cache_dir / "toy2" / "runs").output
    third = invoke("pipeline", "run", recipe)
    assert third.exit_code == 0 and third.output.count("reusing") == 3
    assert "finished with numerics version 0" in third.output
    assert json.loads(results.read_text())["numerics_version"] > 0
    assert "numerics version" not in (report / "results.md").read_text()


def test_variables_can_be_overridden_and_unknown_ones_are_refused(tmp_path):
    recipe = tmp_path / "toy.toml"
    recipe.write_text(RECIPE)
    loaded = load_recipe(recipe, {"epochs": "3"})
    assert loaded.steps[0].command[loaded.steps[0].command.index("--epochs") + 1] == "3"
    result = invoke("pipeline", "run", recipe, "--set", "nope=1", "--dry-run")
    assert result.exit_code != 0 and "has no such variable" in result.output


def test_a_failing_step_names_the_recipe_and_the_step(cache_dir, tmp_path):
    recipe = tmp_path / "toy.toml"
    recipe.write_text(RECIPE)
    result = invoke("pipeline", "run", recipe)  # no toy dataset prepared: refused up front
    assert result.exit_code != 0
    assert "step 1 (first): no dataset 'toy'" in result.output
    assert "step 2 (second): no dataset 'toy2'" in result.output
    for name in ("toy", "toy2"):
        synthetic_dataset(cache_dir, name)
    (cache_dir / "toy" / "features-toy.h5").unlink()  # fails as it runs
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code != 0 and "step 1 (first) failed: " in result.output


@pytest.mark.parametrize("path, description", list_recipes(REPO / "pipelines"))
def test_shipped_recipes_load(path, description):
    recipe = load_recipe(path)
    assert description and recipe.steps
    dry = invoke("pipeline", "run", path, "--dry-run")
    assert dry.exit_code == 0, dry.output
    for step in recipe.steps:
        parse_step(step.command)


SWEEP = """
name = "toy-sweep"
description = "ROLE's test mAP against k"

[vars]
ks = "1.0,1.5,2.0"

[[steps]]
name = "ROLE k = {k}, seed {seed}"
each = {k = "{ks}", seed = ["0", "1"]}
command = ["train-linear", "--dataset", "toy", "--loss", "role", "--param", "k={k}", "--seeds",
           "{seed}", "--run-id", "sweep-{k}-{seed}", "--epochs", "1", "--lr", "1e-2", "--bsize",
           "16", "--quiet", "--no-plots"]

[[steps]]
name = "ROLE at k*"
command = ["train-linear", "--dataset", "toy", "--loss", "role", "--seeds", "0,1", "--run-id",
           "star", "--epochs", "1", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots"]

[report]
kind = "sweep"
stage = "linear"
loss = "role"
param = "k"
run_id = "sweep-*"
reference_run_id = "star"
datasets = ["toy"]
"""


def test_a_sweep_recipe_expands_its_steps_and_plots_the_parameter(cache_dir, tmp_path):
    synthetic_dataset(cache_dir, "toy")
    recipe = tmp_path / "sweep.toml"
    recipe.write_text(SWEEP)
    loaded = load_recipe(recipe)
    assert [s.name for s in loaded.steps][:3] == ["ROLE k = 1.0, seed 0", "ROLE k = 1.0, seed 1",
                                                   "ROLE k = 1.5, seed 0"]
    assert len(loaded.steps) == 7 and "sweep-2.0-1" in loaded.steps[5].command
    assert "k=3" in load_recipe(recipe, {"ks": "3"}).steps[0].command
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 0, result.output
    out = cache_dir / "pipelines" / "toy-sweep"
    rows = json.loads((out / "results.json").read_text())
    assert [(r["k"], r["runs"]) for r in rows] == [(1.0, 2), (1.5, 2), (2.0, 2)]
    star = json.loads((cache_dir / "toy" / "runs" / "role" / "star" / "results.json").read_text())
    scores = [seed["selected"]["test_map"] for seed in star["seeds"]]
    assert rows[0]["reference"] == pytest.approx(sum(scores) / 2)
    for row in rows:
        runs = [json.loads((cache_dir / "toy" / "runs" / "role" / f"sweep-{row['k']}-{s}" /
                            "results.json").read_text())["selection"]["test_map"] for s in (0, 1)]
        assert row["test mAP"] == pytest.approx(sum(runs) / 2)
    assert (out / "sweep.png").stat().st_size > 0


def test_each_is_checked(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('[vars]\nk = "1"\n[[steps]]\ncommand = ["losses"]\neach = {k = "1,2"}\n')
    with pytest.raises(Exception, match="reuses the variable name 'k'"):
        load_recipe(recipe)


def parse_step(arguments: list[str]) -> None:
    """Parse a step's command line with the CLI's own options (no command runs): an unknown
    option, a bad choice or a malformed value fails here."""
    import click

    from featcache.cli import cli

    command, rest, name = cli, list(arguments), "featcache"
    while isinstance(command, click.Group):
        name = rest[0]
        command, rest = command.get_command(click.Context(cli), name), rest[1:]
        assert command is not None, arguments
    command.make_context(name, rest)


@pytest.mark.parametrize("path", sorted((REPO / "pipelines").glob("frozen-*.toml")), ids=lambda p: p.stem)
def test_frozen_backbone_recipes_train_every_loss(path):
    recipe = load_recipe(path)
    linear = [s.command for s in recipe.steps if s.command[0] == "train-linear"]
    assert len(linear) == 4 and all(c[c.index("--loss") + 1] == "all" for c in linear)
    rules = [s.command[s.command.index("--rule") + 1] for s in recipe.steps
             if s.command[0] == "pseudo-label"]
    assert sorted(rules) == ["aevlp"] * 4 + ["vlpl"] * 4  # what vlpl and gpr train on
    crops = [c[c.index("--crops") + 1] for c in (s.command for s in recipe.steps) if "--crops" in c]
    assert crops == ["4x4", "4x4", "4x4", "5x5"]  # AEVLP's grid_size: 5 for CUB


def test_a_step_stopped_by_ctrl_c_stops_the_recipe(tmp_path, monkeypatch):
    """The step's command says what it kept; the recipe does not go on to the next step, and
    the exit status is the signal's (130)."""
    import os
    import signal

    from featcache.commands import losses
    from featcache.interrupt import check_stop

    def interrupted_step(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the handler the command line installed takes it
        check_stop()

    monkeypatch.setattr(losses.command, "callback", interrupted_step)
    recipe = tmp_path / "stop.toml"
    recipe.write_text('[[steps]]\nname = "first"\ncommand = ["losses"]\n'
                      '[[steps]]\nname = "second"\ncommand = ["backbones"]\n')
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 130, result.output
    assert "[1/2] first" in result.output
    assert "[2/2]" not in result.output
    assert "stopped before step 2 (second); run it again" in result.output


def test_real_features_resolves_its_data_from_the_recipe_and_names_the_fix(tmp_path, cache_dir,
                                                                             monkeypatch):
    """A clone anywhere, run from any folder: the default data path comes from the recipe's
    place, a missing input is noticed by a dry run and refused before any step, naming
    --set shared=PATH, and the printed fix works."""
    import shlex

    clone = tmp_path / "elsewhere" / "featcache"
    (clone / "pipelines").mkdir(parents=True)
    shutil.copy(REPO / "pipelines" / "real-features.toml", clone / "pipelines")
    monkeypatch.chdir(tmp_path)
    recipe = clone / "pipelines" / "real-features.toml"
    expected = (clone / "pipelines" / ".." / ".." / "shared" / "data").resolve()
    assert Path(load_recipe(recipe).variables["shared"]).resolve() == expected
    dry = invoke("pipeline", "run", recipe, "--dry-run")
    assert dry.exit_code == 0
    shared = load_recipe(recipe).variables["shared"]
    assert shared == str(expected)  # '../..' resolved (issue 45, item 7)
    assert f"the first: {shared}/scene/scene.npz; " in dry.stderr
    # said once for the five inputs under {shared}, not once a step
    assert dry.stderr.count("--set shared=PATH") == 1 and dry.stderr.count("not exist") == 1
    assert f"`featcache pipeline run {recipe} --set shared=PATH`" in dry.stderr
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 1
    assert "--set shared=PATH" in result.output and "steps 1 (import scene)" in result.output
    assert not (cache_dir / "scene").exists()  # refused before any step
    data = tmp_path / "data"
    for name in ("scene", "yeast", "emotions", "enron", "bibtex"):
        (data / name).mkdir(parents=True)
        np.savez(data / name / f"{name}.npz", X_train=np.ones((2, 2)))
    fix = re.search(r"`(featcache pipeline run [^`]+)`", result.output).group(1)
    words = shlex.split(fix.replace("PATH", str(data)))[1:] + ["--dry-run"]
    again = invoke(*words)
    assert again.exit_code == 0 and "does not exist" not in again.stderr


def test_make_real_features_has_a_variable_for_the_data():
    import subprocess

    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "real-features",
                          "SHARED=/data/shared"], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert "pipeline run pipelines/real-features.toml --set shared=/data/shared" in dry.stdout


def test_a_report_rewrites_its_readme_section_and_nothing_else(cache_dir, tmp_path):
    synthetic_dataset(cache_dir, "toy")
    synthetic_dataset(cache_dir, "toy2", seed=1)
    (tmp_path / "pipelines").mkdir()
    recipe = tmp_path / "pipelines" / "toy.toml"
    recipe.write_text(RECIPE + 'readme = "../README.md"\nrecord = "../docs/toy.json"\n'
                      'versus = "an"\n')
    readme = tmp_path / "README.md"
    before, after = "# Project\n\nintro\n\n", "\n\nmore text\n"
    readme.write_text(before + "<!-- featcache pipeline toy-table: begin -->\nold table\n"
                      "<!-- featcache pipeline toy-table: end -->" + after)
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 0, result.output
    table = (cache_dir / "pipelines" / "toy-table" / "results.md").read_text()
    text = readme.read_text()
    assert text.startswith(before) and text.endswith(after) and "old table" not in text
    section = readme_section(text, "toy-table")
    assert section.splitlines()[0].startswith("| loss ") and section.split("\n\nWritten")[0] in table
    assert "README.md: the toy-table section" in result.output
    # the section is rendered from the record alone: its table, what made it, the comparisons
    record = json.loads((tmp_path / "docs" / "toy.json").read_text())
    assert record == json.loads((cache_dir / "pipelines" / "toy-table" / "results.json").read_text())
    assert section == readme_block(record)
    made = record["provenance"]
    assert made["featcache_versions"] == [featcache.__version__] and made["runs_created"]
    assert f"by featcache {featcache.__version__}" in section
    assert "Differences to `an` that survive Holm's correction" in section
    # the comparisons are what `featcache table DATASET --versus an` prints, dataset by dataset
    for dataset in ("toy", "toy2"):
        printed = invoke("table", cache_dir / dataset / "runs", "--run-id", "t", "--versus", "an",
                         "--format", "json")
        assert printed.exit_code == 0, printed.output
        versus = {row["loss"]: row[dataset]["uncertainty"]["versus"]
                  for row in json.loads(printed.stdout)["rows"] if row["loss"] != "an"}
        recorded = {row["loss"]: row for row in record["comparisons"]["datasets"][dataset]}
        assert set(versus) == set(recorded) == {"an-ls"}
        for loss, row in recorded.items():
            assert row["estimate"] == versus[loss]["estimate"]
            assert row["survives_holm"] == versus[loss]["survives_holm"]
    # `pipeline render` writes the section again from the record, running nothing
    readme.write_text(text.replace(section, "edited by hand"))
    rendered = invoke("pipeline", "render", recipe)
    assert rendered.exit_code == 0, rendered.output
    assert readme.read_text() == text
    readme.write_text("# no markers\n")
    again = invoke("pipeline", "run", recipe)
    assert again.exit_code == 0 and readme.read_text() == "# no markers\n"
    assert "<!-- featcache pipeline toy-table: begin -->" in again.output  # says what is missing


def test_the_readme_real_feature_table_has_every_loss_the_pipeline_trains():
    """The README's table is written by `make real-features` (its [report] readme): it holds
    every shipped loss the pipeline trains; a loss added since the last run is warned about."""
    from featcache.losses import DataFacts
    from featcache.protocol.loss_choice import choose_losses

    recipe = load_recipe(REPO / "pipelines" / "real-features.toml")
    assert recipe.report["readme"] == "../README.md"
    section = readme_section((REPO / "README.md").read_text(), "real-features")
    header, _, *rows = [line for line in section.splitlines() if line.startswith("|")]
    assert [c.strip() for c in header.strip("|").split("|")] == ["loss", *recipe.report["datasets"]]
    imported = DataFacts(dataset="scene", num_classes=6, has_clean_train=True, mean_positives=1.07,
                         positives_histogram=((1, 1124), (2, 86), (3, 1)), backbone="imported")
    trained, _ = choose_losses("all", imported)
    listed = [row.strip("|").split("|")[0].strip() for row in rows]
    assert listed == [name for name in trained if name in listed]  # the pipeline's order
    assert [name for name in trained if name in SHIPPED_LOSSES] == [
        name for name in listed if name in SHIPPED_LOSSES]  # every shipped loss it trains
    assert {"gr", "hill", "splc"} <= set(trained)
    missing = [name for name in trained if name not in listed]
    if missing:  # a loss added as one new module: the table is made again by the pipeline
        warnings.warn(f"README.md's real-feature table lacks {missing}: run `make "
                      "real-features`", stacklevel=1)


CHECKED = """
name = "checked"
[[steps]]
name = "make shapes"
command = ["prepare", "shapes", "--num-train", "10", "--num-test", "10"]
[[steps]]
name = "k of shapes"
command = ["estimate-k", "--dataset", "shapes", "--draws", "10", "--labeled", "5"]
[[steps]]
name = "last"
command = {last}
"""


@pytest.mark.parametrize("last, message", [
    ('["trian-linear", "--dataset", "shapes"]',
     "step 3 (last): unknown command 'trian-linear'; did you mean 'train-linear'?"),
    ('["train-linear", "--dataset", "shapes", "--lrr", "1e-2"]',
     "step 3 (last): featcache train-linear: No such option '--lrr'"),
    ('["train-linear", "--dataset", "shapes", "--epochs", "0"]',
     "step 3 (last): featcache train-linear: Invalid value for '--epochs'"),
    ('["train-linear", "--dataset", "shapes", "--epochs", "1", "--epochs", "2"]',
     "step 3 (last): --epochs is given twice"),
    ('["prepare", "vocc", "--root", "x"]', "step 3 (last): featcache prepare: No such command 'vocc'"),
    ('["train-linear", "--dataset", "shapez"]',
     "step 3 (last): no dataset 'shapez' ({labels} does not exist) and no earlier step "
     "prepares it; did you mean 'shapes'?; prepare it first (`featcache prepare --help` lists "
     "the formats) or add a prepare step before this one"),
])
def test_every_step_is_checked_before_the_first_runs(tmp_path, cache_dir, last, message):
    """Issue 36, item 8: a recipe whose last step could not run ran its first steps first."""
    recipe = tmp_path / "checked.toml"
    recipe.write_text(CHECKED.format(last=last))
    result = invoke("pipeline", "run", recipe)
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1, result.output
    expected = message.format(labels=cache_dir / "shapez" / "labels.h5")
    assert result.output.startswith(f"Error: {recipe}: {expected}"), result.output
    assert result.output.rstrip().endswith("; no step was run")
    assert not (cache_dir / "shapes").exists()  # step 1 did not run
    dry = invoke("pipeline", "run", recipe, "--dry-run")  # a dry run lists the problem
    assert dry.exit_code == 0 and f"note: {expected}" in dry.stderr


def test_a_dataset_an_earlier_step_prepares_passes_and_cache_reaches_each_step(tmp_path):
    """The recipe above with a last step that can run; --cache goes to the steps that take
    it, after their command (`prepare shapes --cache DIR`, not `prepare --cache DIR shapes`)."""
    recipe = tmp_path / "checked.toml"
    recipe.write_text(CHECKED.format(last='["losses", "an"]'))
    cache = tmp_path / "elsewhere"
    result = invoke("pipeline", "run", recipe, "--cache", cache)
    assert result.exit_code == 0, result.output
    assert (cache / "shapes" / "labels.h5").is_file()
    assert "[3/3] last: featcache losses an" in result.output
