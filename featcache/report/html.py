"""HTML text shared by the report page's sections: escaping, numbers, commands, stage titles."""

from __future__ import annotations

import shlex
from html import escape
from pathlib import Path

STAGE_TITLES = {"linear": "Stage two: linear heads on cached features",
                "finetune": "Stage three: fine-tuned end to end"}


def esc(value) -> str:
    """HTML-escaped text that holds no URL (a path or note that quotes one stays text)."""
    return escape(str(value)).replace("://", "&#58;//")


def number(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


#: what argv[0] of a recorded command may be when it was ``featcache``
FEATCACHE_ENTRY_POINTS = ("featcache", "__main__.py", "cli.py")


def typed_command(document: dict) -> list[str]:
    """The command that made a run as typed (``featcache train-linear ...``); [] when the
    results document does not record it."""
    argv = [str(word) for word in document.get("command") or []]
    if argv and Path(argv[0]).name in FEATCACHE_ENTRY_POINTS:
        argv[0] = "featcache"
    return argv


def command_text(document: dict) -> str:
    """The command that made a run, as typed (``featcache train-linear ...``)."""
    argv = typed_command(document)
    return shlex.join(argv) if argv else "(not recorded)"


def setting(value: float | None) -> str:
    """A selected setting, or "-" where a run has none (zero-shot), as ``table`` shows it."""
    return "-" if value is None else f"{value:g}"
