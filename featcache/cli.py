"""The ``featcache`` command line: a click group whose subcommands load on first use.

Each subcommand lives in ``featcache/commands/<module>.py`` and exposes a click command named
``command``; importing them lazily keeps ``featcache --help`` fast (no torch import).
"""

from __future__ import annotations

import importlib
import signal
import sys
import warnings
from pathlib import Path

import click

from featcache import __version__
from featcache.environment import TRACEBACK, check_environment
from featcache.errors import FeatcacheError, FeatcacheWarning, Interrupted, unknown_name
from featcache.interrupt import SignalStop, exit_on_signals, stop_signals
from featcache.notices import said_after_command
from featcache.process import claim, freeze

#: set to 1 to see the traceback of an unexpected error instead of its one-line summary
TRACEBACK_ENV = "FEATCACHE_TRACEBACK"

#: subcommand name -> (module, one-line help shown by ``featcache --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("featcache.commands.prepare", "Stage zero: turn a dataset into cache/<dataset>/labels.h5."),
    "info": ("featcache.commands.info", "Show what a labels or features file holds."),
    "features": ("featcache.commands.features", "Stage one: extract backbone features once into HDF5."),
    "backbones": ("featcache.commands.backbones", "List every backbone with its weights, width and preprocessing."),
    "pseudo-label": ("featcache.commands.pseudolabel", "Pseudo-labels from cached vision-language similarities."),
    "losses": ("featcache.commands.losses", "List every loss with its paper, needs and parameters."),
    "estimate-k": ("featcache.commands.estimate_k", "Estimate k (positives per image) from M fully labelled images."),
    "train-linear": ("featcache.commands.linear", "Stage two: train linear heads with any loss on cached features."),
    "finetune": ("featcache.commands.finetune", "Stage three: fine-tune end to end (LinearInit or fresh head)."),
    "predict": ("featcache.commands.predict", "Probabilities of a trained run for images or features."),
    "cam": ("featcache.commands.cam", "Class activation maps of trained runs on an image (PNG)."),
    "table": ("featcache.commands.table", "A paper table (md, csv, LaTeX, json) from finished runs."),
    "report": ("featcache.commands.report", "One self-contained HTML page of a dataset's runs."),
    "pipeline": ("featcache.commands.pipeline", "Run a declared experiment recipe from pipelines/."),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] not in COMMANDS and not args[0].startswith("-"):
            ctx.fail(unknown_name("command", args[0], COMMANDS, listing="featcache --help"))
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and name is not None and not ctx.resilient_parsing:
            from featcache.commands.repeated import join_repeated_options

            rest = join_repeated_options(command, name, rest, ctx)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            check_environment()  # before any work: a variable read late must not end a long job
        except FeatcacheError as exc:
            raise click.ClickException(str(exc)) from exc
        with warnings.catch_warnings(), stop_signals():
            warnings.showwarning = _show_warning
            try:
                with said_after_command():
                    return super().invoke(ctx)
            except (Interrupted, SignalStop) as exc:
                # nothing may keep the exception (its traceback holds the frames of the work,
                # DataLoader iterators included, whose workers end when they are collected)
                said = exc.interrupted() if isinstance(exc, SignalStop) else exc
                message, code = str(said), said.exit_code
                del said
                click.echo(f"featcache: interrupted: {message}", err=True)
                ctx.exit(code)
            except FeatcacheError as exc:
                raise click.ClickException(str(exc)) from exc
            except UnicodeEncodeError as exc:
                if not _writing_stdout(exc):
                    raise
                shown = exc.object[exc.start:exc.end]
                raise click.ClickException(
                    f"the output encoding {exc.encoding} (PYTHONIOENCODING or the locale) cannot "
                    f"write {shown!r}, part of what this command prints: run it again with "
                    "PYTHONIOENCODING=utf-8 (or a UTF-8 locale, e.g. LC_ALL=C.UTF-8)") from exc
            except (OSError, RuntimeError) as exc:
                from featcache.fileio import (
                    disk_full_message,
                    is_disk_full,
                    is_read_only,
                    read_only_message,
                    unreadable,
                )

                if is_read_only(exc):
                    raise click.ClickException(read_only_message(exc, self._out_option(ctx))) from exc
                denied = unreadable(exc)
                if denied is not None:
                    raise click.ClickException(
                        f"cannot read {denied}: permission denied (this user may not read it); "
                        "ask its owner to make it readable (chmod a+r), or copy it where you "
                        "may") from exc
                if not is_disk_full(exc):
                    raise
                where = getattr(exc, "filename", None)
                raise click.ClickException(
                    disk_full_message(exc, Path(where) if where else None)) from exc


    def _out_option(self, ctx: click.Context) -> str | None:
        """``--out FILE`` when the command being run has it (else outputs go to the cache)."""
        name = ctx.invoked_subcommand
        command = self.get_command(ctx, name) if name else None
        params = command.params if command is not None else []
        return "--out FILE" if any(p.name == "out" for p in params) else None


_default_showwarning = warnings.showwarning


def _writing_stdout(exc: UnicodeEncodeError) -> bool:
    """Whether ``exc`` came from printing to stdout in an encoding that lacks a character (a
    class name in a latin-1 terminal), not from featcache's own encoding of text."""
    import codecs

    try:
        return codecs.lookup(exc.encoding).name == codecs.lookup(sys.stdout.encoding or "").name
    except LookupError:
        return False


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """featcache's own warnings as one line on stderr; others as Python shows them."""
    if issubclass(category, FeatcacheWarning):
        click.echo(f"featcache: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="featcache")
def cli() -> None:
    """Single-positive multi-label learning on cached ResNet-50 features.

    \b
    Typical flow:
      featcache prepare voc --root data/voc          # stage zero: labels
      featcache features --dataset voc               # stage one: features, once
      featcache train-linear --dataset voc --loss an-ls   # stage two
      featcache finetune --dataset voc --loss role --init best   # stage three
    """


def _traceback_wanted() -> bool:
    """``$FEATCACHE_TRACEBACK`` (a value it does not take counts as set: an error is already
    being reported)."""
    try:
        return bool(TRACEBACK.value(False))
    except FeatcacheError:
        return True


def main() -> None:
    """Console-script entry point: expected failures print one line (click does that for
    FeatcacheError and option errors); an unexpected exception prints one line too, unless
    ``$FEATCACHE_TRACEBACK`` asks for the traceback.

    A write past the shell's file-size limit (``ulimit -f``) then fails with EFBIG, reported like
    a full disk, instead of killing the process with SIGXFSZ.
    """
    claim()  # this process is the command's (featcache.process)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    exit_on_signals()  # each command handles Ctrl-C itself (stop_signals); before and after: exit
    try:
        cli.main(prog_name="featcache")
    except SignalStop as exc:  # landed outside a command's own handling (click's last steps)
        click.echo(f"featcache: interrupted: {exc.interrupted()}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # anything click did not already turn into a one-line error
        if _traceback_wanted():
            raise
        click.echo(f"Error: unexpected {type(exc).__name__}: {exc}\n(this may be a bug in "
                   f"featcache: run again with {TRACEBACK_ENV}=1 to see where it happened, and "
                   "please report it)", err=True)
        sys.exit(1)
    finally:
        freeze()  # the process ends: its last collections need not walk what it made
