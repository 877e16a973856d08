"""The losses featcache ships, in catalog order, for the tests that check the README's tables.

A loss added as a new module of ``featcache/losses`` is discovered and listed among them (by its
``CATALOG_ORDER``); the tests check every loss they know generically, and these by name.
"""

from __future__ import annotations

SHIPPED_LOSSES = [
    "bce", "bce-ls", "iun", "iu", "an", "an-ls", "n-ls", "wan", "epr", "role", "pr",
    "em", "em-apl", "entmin", "ll-r", "ll-ct", "ll-cp", "ll-r-abs", "ll-ct-abs", "ll-cp-abs",
    "opml", "opml-sp", "zlpr", "focal", "asl", "dw", "l1r", "l2r", "gr", "hill", "splc", "vlpl", "gpr",
    "an+boostlu", "ll-r+boostlu", "ll-ct+boostlu", "ll-cp+boostlu", "ignore",
]


def readme_table_names(text: str, header: list[str]) -> list[str]:
    """The loss names of the table in ``text`` that starts with the lines ``header``, in order."""
    lines = text.splitlines()
    start = next(i for i in range(len(lines)) if lines[i:i + len(header)] == header)
    names = []
    for line in lines[start + len(header):]:
        if not line.startswith("|"):
            break
        names.append(line.split("`")[1] if line.startswith("| `") else line.strip("|").split("|")[0].strip())
    return names
