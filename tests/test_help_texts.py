"""Help texts describe behaviour: no ``--help`` of any command quotes a measured figure.

Rates, times, speed-ups, devices and dates belong in docs/performance.md, where each figure
comes with its benchmark, machine and date; a help text that quotes one goes stale silently.
"""

from __future__ import annotations

import re

import click
import pytest

from featcache.cli import cli

#: what a measurement looks like in prose: a rate, a duration, a speed-up, a share, a device, a date
MEASURED = {
    "a rate": re.compile(r"\d[\d,.]*\s*(?:img|images|it|items|rows|steps|epochs)/s\b|\d[\d,.]*\s*[KMGT]i?B/s\b"),
    "a duration": re.compile(r"\b\d[\d,.]*\s*(?:s|ms|µs|us|ns|sec|secs|seconds?|min|mins|minutes?|"
                             r"h|hours?)\b(?![-'])"),
    "a speed-up": re.compile(r"\b\d+(?:\.\d+)?x\b(?!\d)|\b\d+(?:\.\d+)?\s*(?:x|times)\s+"
                             r"(?:faster|slower|less|more|quicker)\b"),
    "a percentage": re.compile(r"\d+(?:\.\d+)?\s*%"),
    "a device": re.compile(r"\b(?:GH200|[HB][12]00|H800|A100|A10G?|A40|A6000|V100|P100|T4|L4|L40S?|"
                           r"RTX\s?\d{3,4}|GTX\s?\d{3,4}|MI\d{3}X?|TPU\s?v\d|Xeon|EPYC|Ryzen|"
                           r"Apple M\d)\b"),
    "a date": re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|"
                         r"Oct|Nov|Dec)[a-z]*\.? (?:\d{1,2}, )?(?:19|20)\d\d\b"),
    "a measurement": re.compile(r"\b(?:measured|timed|benchmarked) (?:on|at|with|in)\b"),
}
#: figures that are settings, not measurements (a confidence level)
NOT_MEASURED = ("95% bootstrap interval",)


def every_help() -> dict[str, str]:
    """``featcache ... --help`` of the group and every (sub)command, on one line each."""
    found: dict[str, str] = {}

    def walk(command: click.Command, ctx: click.Context) -> None:
        found[ctx.command_path] = " ".join(command.get_help(ctx).split())
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, click.Context(sub, info_name=name, parent=ctx))

    walk(cli, click.Context(cli, info_name="featcache", terminal_width=200, max_content_width=200))
    return found


def measured_figures(text: str) -> list[str]:
    for allowed in NOT_MEASURED:
        text = text.replace(allowed, "")
    return [f"{kind}: {match.group(0)!r}" for kind, pattern in MEASURED.items()
            for match in pattern.finditer(text)]


def test_every_command_is_scanned():
    helps = every_help()
    assert {"featcache", "featcache train-linear", "featcache prepare csv",
            "featcache pipeline run", "featcache features", "featcache finetune"} <= set(helps)
    assert len(helps) >= 20


def test_no_help_quotes_a_measured_figure():
    found = [f"{path}: {figure}" for path, text in every_help().items()
             for figure in measured_figures(text)]
    assert not found, ("help texts describe behaviour; measured figures go to "
                       "docs/performance.md:\n" + "\n".join(found))


@pytest.mark.parametrize("figure", [
    "at 3,296 img/s end to end", "about 59 s on one GPU", "0.30 ms replayed", "1.1x faster",
    "2 times faster", "a 16 % speed-up", "one H200", "on an H100", "(2026-11-26)",
    "2.5 GB/s", "in 4 minutes", "November 2026", "an A100", "a T4", "measured on 1,000,000 rows",
])
def test_the_scan_catches_each_kind_of_figure(figure):
    assert measured_figures(f"Decode images {figure}.")


@pytest.mark.parametrize("setting", [
    "95% bootstrap intervals", "--crops 4x4", "SIZE x SIZE", "14 x 14 x 2048", "448 px",
    "Arroyo et al. 2023", "L48", "e.g. 1GB", "about 128 MB", "(s, s)", "a 3-point drop",
    "the 80/20 split", "seeds 0,1,2", "1/2, 1/4 or 1/8 scale",
    "`make gpu-check` measures both",
])
def test_settings_are_not_measurements(setting):
    assert not measured_figures(f"Use {setting} here.")
