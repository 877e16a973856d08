"""An option given more than once on one command line.

click keeps the last value without a word (``--lr 1e-3 --lr 1e-2`` trained 1e-2 only). Here, for
every command at once (``cli.LazyGroup`` calls :func:`join_repeated_options` before a
subcommand parses its arguments): the values of a list option (:class:`ListOption`, a
comma-separated list such as ``--lr``) are joined into one list; any other option given twice
with different values is refused, naming it. Options declared ``multiple=True`` (``--param``,
``--run``) take every value already; the same value given twice is harmless and kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from featcache.errors import OptionError

#: what joins the values of a list option given several times
LIST_SEPARATOR = ","


class ListOption(click.Option):
    """An option whose value is a comma-separated list (``--lr 1e-2,1e-3``): given several
    times, its values are joined (``--lr 1e-3 --lr 1e-2`` is ``--lr 1e-3,1e-2``)."""


@dataclass
class _Occurrence:
    option: click.Option
    start: int  # index of the option's name in the arguments
    stop: int  # one past its value
    spelled: str  # the name as typed
    value: str  # the value (for a flag: the name as typed)


def join_repeated_options(command: click.Command, name: str, args: list[str],
                          parent: click.Context) -> list[str]:
    """``args`` of ``command`` with every repeated list option joined into one; OptionError
    naming an option that takes one value and is given twice with different values.

    A group's own options are checked, then its subcommand's, and so on down."""
    ctx = click.Context(command, info_name=name, parent=parent)
    occurrences, subcommand_at = _scan(command, ctx, args)
    by_option: dict[click.Option, list[_Occurrence]] = {}
    for occurrence in occurrences:
        by_option.setdefault(occurrence.option, []).append(occurrence)
    drop: set[int] = set()
    replace: dict[int, list[str]] = {}
    for option, found in by_option.items():
        if len(found) < 2:
            continue
        if isinstance(option, ListOption):
            joined = LIST_SEPARATOR.join(o.value for o in found)
            replace[found[0].start] = [found[0].spelled, joined]
            drop.update(i for o in found for i in range(o.start, o.stop))
        elif len({o.value for o in found}) > 1:
            raise OptionError(_refusal(option, found, args))
    head = args if subcommand_at is None else args[:subcommand_at]
    out: list[str] = []
    for index, word in enumerate(head):
        out.extend(replace.get(index, []))
        if index not in drop:
            out.append(word)
    if subcommand_at is None or not isinstance(command, click.Group):
        return out
    sub_name = args[subcommand_at]
    sub = command.get_command(ctx, sub_name)
    rest = args[subcommand_at + 1:]
    if sub is not None:
        rest = join_repeated_options(sub, sub_name, rest, ctx)
    return [*out, sub_name, *rest]


def _refusal(option: click.Option, found: list[_Occurrence], args: list[str]) -> str:
    """One line naming an option given several times with different values."""
    times = "twice" if len(found) == 2 else f"{len(found)} times"
    if option.is_flag:
        spelled = " and ".join(sorted({o.spelled for o in found}))
        return f"{spelled} are both given: give one of them"
    given = ", then ".join(" ".join(args[o.start:o.stop]) for o in found)
    return (f"{found[0].spelled} is given {times} ({given}) but takes one value: give it once")


def _scan(command: click.Command, ctx: click.Context,
          args: list[str]) -> tuple[list[_Occurrence], int | None]:
    """Every option occurrence in ``args`` (up to ``--``, and for a group up to its
    subcommand, whose index is returned second)."""
    names: dict[str, click.Option] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option) and not param.multiple and not param.count:
            for spelled in (*param.opts, *param.secondary_opts):
                names[spelled] = param
    takes_value = {param: not param.is_flag and param.nargs > 0 for param in names.values()}
    occurrences: list[_Occurrence] = []
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            break
        spelled, _, inline = word.partition("=")
        option = names.get(word) or (names.get(spelled) if word.startswith("--") else None)
        if option is None:
            if isinstance(command, click.Group) and not word.startswith("-"):
                return occurrences, index
            index += 1
            continue
        if not takes_value[option]:
            occurrences.append(_Occurrence(option, index, index + 1, word, word))
            index += 1
        elif word in names:  # --lr VALUE
            value = " ".join(args[index + 1:index + 1 + option.nargs])
            occurrences.append(_Occurrence(option, index, index + 1 + option.nargs, word, value))
            index += 1 + option.nargs
        else:  # --lr=VALUE
            occurrences.append(_Occurrence(option, index, index + 1, spelled, inline))
            index += 1
    return occurrences, None


def named_losses(value: str) -> str:
    """A ``--loss`` list that names at least one loss (``--loss ','`` names none: refused, where
    it used to train nothing and exit 0)."""
    if not any(name.strip() for name in str(value).split(LIST_SEPARATOR)):
        raise click.BadParameter(f"{value!r} names no loss: give a loss, a comma-separated list "
                                 "or 'all' (`featcache losses` lists them)", param_hint="--loss")
    return value
