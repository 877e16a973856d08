"""``featcache pipeline``: run the declared experiment recipes of ``pipelines/``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from featcache.commands.common import cache_option

if TYPE_CHECKING:  # featcache.pipeline imports numpy: loaded when a recipe runs, not for --help
    from featcache.pipeline import Recipe


@click.group("pipeline")
def command() -> None:
    """Run a declared experiment recipe (pipelines/*.toml): steps, then one results table."""


@command.command("run")
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--set", "assignments", multiple=True, metavar="NAME=VALUE",
              help="Override a variable of the recipe's [vars] (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the steps without running them.")
@cache_option
@click.pass_context
def run(ctx: click.Context, recipe, assignments, dry_run, cache):
    """Run RECIPE's steps in order (finished work is reused), then write its report.

    Every step is checked before the first runs (its inputs, command, options and dataset);
    a step that cannot run is named and nothing runs.

    The report goes to <cache>/pipelines/<name>/results.md, .csv, .tex and .json (the
    table `featcache table` builds from the same runs). A [report] with record and readme
    also copies results.json to its record and writes the table's block in that document
    from it (what `featcache pipeline render` writes again).
    """
    from featcache.pipeline import load_recipe

    overrides = {}
    for item in assignments:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--set")
        name, value = item.split("=", 1)
        overrides[name.strip()] = value
    root = ctx.find_root().command
    assert isinstance(root, click.Group)  # featcache's group runs every subcommand
    run_recipe(load_recipe(recipe, overrides, cache), root, cache=cache, dry_run=dry_run)


def run_recipe(recipe: Recipe, command_line: click.Group, cache: str | None = None,
               dry_run: bool = False) -> None:
    """Run every step of ``recipe`` through ``command_line`` (the ``featcache`` group that runs
    this command), then write its report."""
    from featcache.commands.recipe_check import parse_step, step_problems
    from featcache.errors import FeatcacheError, Interrupted
    from featcache.interrupt import check_stop
    from featcache.pipeline import missing_inputs, write_report

    # every step is checked before the first runs: its inputs, command, options and dataset
    problems = missing_inputs(recipe) + step_problems(recipe, command_line, cache)
    if problems and not dry_run:
        raise FeatcacheError(f"{recipe.path}: " + "; ".join(problems) + "; no step was run")
    for line in problems:
        click.echo(f"note: {line}", err=True)
    def stop_before(what: str) -> None:
        """A Ctrl-C during the last step (which said what it kept) or between steps ends the
        recipe too; running it again reuses what is finished."""
        try:
            check_stop()
        except Interrupted as exc:
            raise exc.adding(f"{recipe.path} stopped before {what}; run it again to go on, "
                             "finished runs are reused") from None

    for number, step in enumerate(recipe.steps, start=1):
        stop_before(f"step {number} ({step.name})")
        line = "featcache " + shlex.join(step.command)
        if step.skip_if_exists and Path(step.skip_if_exists).exists():
            click.echo(f"[{number}/{len(recipe.steps)}] {step.name}: done already "
                       f"({step.skip_if_exists})", err=not dry_run)
            continue
        # the steps are a dry run's result (stdout); otherwise progress (stderr)
        click.echo(f"[{number}/{len(recipe.steps)}] {step.name}: {line}", err=not dry_run)
        if dry_run:
            continue
        try:
            arguments = parse_step(command_line, step.command, cache)[2]  # --cache where it applies
            command_line.main(args=arguments, prog_name="featcache", standalone_mode=False)
        except (FeatcacheError, click.ClickException) as exc:
            message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            raise FeatcacheError(f"{recipe.path} step {number} ({step.name}) failed: {message}\n"
                                 f"  the step was: {line}") from exc
    stop_before("its report" if recipe.report else "its end")  # the last step was stopped
    if dry_run or not recipe.report:
        return
    table, out = write_report(recipe, cache)
    click.echo("")
    click.echo(table.markdown())
    click.echo(f"\nreport written to {out.parent}/results.md / .csv / .tex / .json")


@command.command("render")
@click.argument("recipe", type=click.Path(dir_okay=False))
def render(recipe):
    """Write RECIPE's README section again from its recorded results, running nothing.

    \b
    The recipe's [report] names the document (readme) and the copy of results.json kept
    beside it (record); `featcache pipeline run` writes both. The section is rebuilt from
    the record alone, so the same record always gives the same section (a test checks the
    README against its record).
    """
    from featcache.pipeline import load_recipe, render_report

    path = render_report(load_recipe(recipe))
    click.echo(f"{path}: rendered from its record")


@command.command("list")
@click.option("--folder", default="pipelines", show_default=True, type=click.Path(file_okay=False))
def list_(folder):
    """List the recipes in FOLDER with their descriptions."""
    from featcache.pipeline import list_recipes

    recipes = list_recipes(folder)
    if not recipes:
        click.echo(f"no recipes in {folder}")
    for path, description in recipes:
        click.echo(f"{path}: {description}")
