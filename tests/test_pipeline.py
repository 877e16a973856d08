"""Declared recipes: variables, steps, resume, report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset

from featcache.pipeline import list_recipes, load_recipe

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
    rows = json.loads((cache_dir / "pipelines" / "toy-table" / "results.json").read_text())
    assert [r["loss"] for r in rows] == ["an", "an-ls"]
    assert all(r["toy"] and r["toy2"] for r in rows)
    again = invoke("pipeline", "run", recipe)  # finished runs are reused
    assert again.exit_code == 0 and again.output.count("reusing") == 4


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
    result = invoke("pipeline", "run", recipe)  # no toy dataset prepared
    assert result.exit_code != 0
    assert "step 1 (first) failed" in result.output and "no dataset 'toy'" in result.output


@pytest.mark.parametrize("path, description", list_recipes(REPO / "pipelines"))
def test_shipped_recipes_load(path, description):
    recipe = load_recipe(path)
    assert description and recipe.steps
    dry = invoke("pipeline", "run", path, "--dry-run")
    assert dry.exit_code == 0, dry.output
