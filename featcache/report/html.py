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


def command_text(document: dict) -> str:
    """The command that made a run, as typed (``featcache train-linear ...``)."""
    argv = list(document.get("command") or [])
    if not argv:
        return "(not recorded)"
    if Path(argv[0]).name in ("featcache", "__main__.py", "cli.py"):
        argv[0] = "featcache"
    return shlex.join(argv)
