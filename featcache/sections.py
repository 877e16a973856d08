"""Generated sections of documents: the text between ``<!-- featcache KIND NAME: begin -->``
and ``<!-- featcache KIND NAME: end -->`` in a README or a docs page, owned by the command that
renders it (a pipeline's report, ``python -m benchmarks.record render``) and re-rendered by a
test, so that every figure a document shows is one featcache reproduces."""

from __future__ import annotations

import warnings
from pathlib import Path

from featcache.errors import FeatcacheWarning, InputError
from featcache.fileio import write_text_atomic


def section_markers(name: str, kind: str = "pipeline") -> tuple[str, str]:
    """The comments around the part of a document that a recipe's report (``kind``
    "pipeline") or another generator owns."""
    return (f"<!-- featcache {kind} {name}: begin -->",
            f"<!-- featcache {kind} {name}: end -->")


def readme_section(text: str, name: str, kind: str = "pipeline") -> str:
    """The text between ``name``'s markers (InputError when they are missing)."""
    begin, end = section_markers(name, kind)
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise InputError(f"no section between {begin} and {end}")
    return text[start + len(begin):stop].strip("\n")


def replace_section(text: str, name: str, content: str, kind: str = "pipeline") -> str:
    """``text`` with the part between ``name``'s markers replaced by ``content``
    (InputError when the markers are missing)."""
    readme_section(text, name, kind)
    begin, end = section_markers(name, kind)
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{content.strip()}\n{end}{tail}"


def publish_section(path: Path, name: str, content: str, kind: str = "pipeline") -> bool:
    """Replace the text between ``name``'s markers in ``path`` (a report's ``readme``) with
    ``content``, so a document's table is always the last run's; True when it now holds it.
    Without the markers the document is left alone and a warning says what to add."""
    text = path.read_text() if path.is_file() else ""
    try:
        updated = replace_section(text, name, content, kind)
    except InputError:
        begin, end = section_markers(name, kind)
        warnings.warn(f"{path} has no {begin} ... {end} section: its table was not updated "
                      "(add the two lines where the table belongs)", FeatcacheWarning,
                      stacklevel=2)
        return False
    if updated != text:
        write_text_atomic(path, updated)
    return True
