"""Exceptions that reach the user as one clear message (the CLI prints them without a traceback),
and the "did you mean" helper their messages use."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class FeatcacheError(Exception):
    """Base class: the message says what is wrong and what to do about it."""


class InputError(FeatcacheError, ValueError):
    """Bad input data: a missing, corrupt or malformed file, or values that break the protocol."""


class OptionError(FeatcacheError, ValueError):
    """A command-line option or parameter that cannot be used as given."""


class OutputExistsError(FeatcacheError, FileExistsError):
    """An output that already exists and would be overwritten."""


class LossNeedError(OptionError):
    """A loss asks for something the training data does not offer (full labels, negatives, k)."""


class DiskFullError(FeatcacheError, OSError):
    """No room to write an output: the device is full (ENOSPC), a quota is exhausted (EDQUOT)
    or a file-size limit is hit (EFBIG, ``ulimit -f``). The partial file is removed; finished
    work is kept."""


class LockedError(FeatcacheError):
    """An output (a run folder, a features or labels file) is being written by another process."""


class Interrupted(FeatcacheError):
    """The user asked the work to stop (Ctrl-C, SIGTERM); what was finished is kept.

    ``exit_code`` is the shell's convention for the signal (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):  # keeps the exit code across processes (stage two's workers)
        return type(self), (str(self), self.exit_code)

    def adding(self, detail: str) -> Interrupted:
        """The same interruption with ``detail`` (what was kept, how to resume) appended."""
        return Interrupted(f"{self}; {detail}" if str(self) else detail, self.exit_code)


class LossStateError(FeatcacheError, KeyError):
    """A loss with per-example state was called without the state its ``init_state`` made."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FeatcacheWarning(UserWarning):
    """Something the user should know that does not stop the work (the CLI prints one line)."""


#: how many names a message lists before "and N more"
LISTED = 8


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 row``, ``2 rows``, ``0 rows``: a count and its noun, for every message that counts.
    ``plural_form`` for the other nouns (``plural(n, "entry is", "entries are")``); without it
    the last word takes an ``s`` (``plural(n, "training image")``)."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def name_list(names: Sequence[str], limit: int = LISTED) -> str:
    """``a, b, c`` or ``a, b, ... and 7 more``."""
    names = [str(n) for n in names]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def did_you_mean(name: str, choices: Iterable[str], what: str = "") -> str:
    """``"; did you mean 'an-ls'?"`` for the closest choices, or ``""`` when none is close."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.6)
    if not close and len(str(name)) <= 3:  # 'nn' for 'an': one letter of two is a large share
        short = [c for c in choices if len(c) <= len(str(name)) + 1]
        close = difflib.get_close_matches(str(name), short, n=3, cutoff=0.5)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[str(name).lower()]] if str(name).lower() in lowered else []
    if not close:
        return ""
    quoted = " or ".join(repr(c) for c in close)
    return f"; did you mean {quoted}{' ' + what if what else ''}?"


def unknown_name(kind: str, name: str, choices: Iterable[str], plural: str = "",
                 listing: str = "") -> str:
    """One line for an unknown name: the closest valid names (else all of them) and ``listing``,
    e.g. ``unknown loss 'an_ls'; did you mean 'an-ls'? (`featcache losses` describes each)``."""
    choices = list(choices)
    message = f"unknown {kind} {name!r}" + did_you_mean(name, choices)
    if "did you mean" not in message:
        message += f"; valid {plural or kind + 's'}: {', '.join(choices) or 'none'}"
    return message + (f" ({listing})" if listing else "")
