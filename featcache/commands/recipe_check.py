"""Every step of a recipe checked before any step runs (``featcache pipeline run``).

A step's command line is parsed by the command line's own commands, as running it would
(command names, options and their values, required options, an option given twice), without
running anything; a step's ``--dataset`` must be prepared already or be prepared by an earlier
step (``featcache prepare ...``). A step whose ``skip_if_exists`` output exists is not run,
so it is not checked; what it prepared is there.
"""

from __future__ import annotations

from pathlib import Path

import click

from featcache.errors import FeatcacheError, did_you_mean
from featcache.paths import labels_path, prepared_datasets


def step_problems(recipe, command_line: click.Group, cache: str | None = None) -> list[str]:
    """One line for each step of ``recipe`` that cannot run as written by ``command_line``
    (the ``featcache`` group)."""

    problems: list[str] = []
    made: dict[Path, str] = {}  # the labels files earlier steps prepare, with their names
    for number, step in enumerate(recipe.steps, start=1):
        where = f"step {number} ({step.name})"
        skipped = bool(step.skip_if_exists) and Path(step.skip_if_exists).exists()
        if skipped:
            continue
        try:
            path, ctx, _ = parse_step(command_line, step.command, cache)
        except click.exceptions.Exit:
            continue  # --help or --version: nothing to check
        except click.ClickException as exc:
            failed = getattr(exc, "ctx", None)
            within = (f"{failed.command_path}: " if failed is not None and failed.parent is not None
                      else "")
            problems.append(f"{where}: {within}{exc.format_message()}")
            continue
        except FeatcacheError as exc:
            problems.append(f"{where}: {exc}")
            continue
        step_cache = ctx.params.get("cache") or cache
        if path[0] == "prepare":
            name = ctx.params.get("name") or path[-1]
            made[labels_path(name, step_cache)] = name
            continue
        dataset = ctx.params.get("dataset")
        if not dataset:
            continue
        labels = labels_path(dataset, step_cache)
        if labels in made or labels.is_file():
            continue
        known = sorted({*prepared_datasets(step_cache), *made.values()})
        problems.append(f"{where}: no dataset {dataset!r} ({labels} does not exist) and no "
                        f"earlier step prepares it{did_you_mean(dataset, known)}; prepare it "
                        "first (`featcache prepare --help` lists the formats) or add a prepare "
                        "step before this one")
    return problems


def parse_step(command_line: click.Group, arguments: list[str], cache: str | None = None
               ) -> tuple[list[str], click.Context, list[str]]:
    """Parse a step's command line as ``command_line`` (``featcache``) would parse ARGUMENTS
    (nothing runs): the command
    path (``["prepare", "csv"]``), the parsed context, and the arguments to run (with
    ``--cache CACHE`` after the command path when ``cache`` is given, the command takes
    ``--cache`` and the step gives none). click's or featcache's error when it would not parse."""
    parent = click.Context(command_line, info_name="featcache")
    path: list[str] = []
    group: click.Group = command_line
    words = list(arguments)
    while True:
        name, command, rest = group.resolve_command(parent, words)
        if command is None or name is None:
            raise click.UsageError("no command given", parent)
        path.append(name)
        if not isinstance(command, click.Group):
            break
        ctx = command.make_context(name, list(rest), parent=parent)
        words = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not words:
            raise click.UsageError(f"`featcache {' '.join(path)}` needs a subcommand "
                                   f"(`featcache {' '.join(path)} --help` lists them)", ctx)
        group, parent = command, ctx
    rest = list(rest)
    takes_cache = any(param.name == "cache" for param in command.params)
    if cache is not None and takes_cache and not any(
            word == "--cache" or word.startswith("--cache=") for word in rest):
        rest[:0] = ["--cache", cache]
    ctx = command.make_context(name, list(rest), parent=parent)
    return path, ctx, [*path, *rest]
