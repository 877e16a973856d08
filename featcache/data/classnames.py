"""Class names as every dataset must give them: one line of text each, told apart by more than
case or spaces (``prepare`` checks them whatever the format)."""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Sequence

from featcache.errors import FeatcacheWarning, InputError, plural

#: Unicode categories that break a line or are invisible controls (newline, tab, NUL, ...)
LINE_BREAKING = ("Cc", "Zl", "Zp")


def check_class_names(classes: Sequence[str], where: str) -> None:
    """Refuse fewer than 2 classes, an empty name or one holding a control character (a newline would break every
    table row naming it); warn about names that differ only in case or spaces (``cat``,
    ``Cat``, ``cat  ``), which become separate classes. ``where`` names the source."""
    if len(classes) < 2:
        raise InputError(f"{where}: names only {plural(len(classes), 'class', 'classes')} "
                         f"({', '.join(map(repr, classes)) or 'none'}): every image kept has it "
                         "(images without a positive label are dropped), so every AP would be "
                         "100 by construction; a multi-label dataset needs at least 2 classes")
    for number, name in enumerate(classes, start=1):
        if not str(name).strip():
            raise InputError(f"{where}: class {number} has an empty name; give every class a name")
        controls = [c for c in str(name) if unicodedata.category(c) in LINE_BREAKING]
        if controls:
            raise InputError(f"{where}: class {number} ({name!r}) holds the control character "
                             f"{controls[0]!r}: a class name is one line of text; rename it")
    same = same_text(classes)
    if same is not None:
        first, second = same
        raise InputError(f"{where}: class names {first!r} ({code_points(first)}) and {second!r} "
                         f"({code_points(second)}) are the same text in two Unicode spellings "
                         "(NFC and NFD, say): every table would show two classes of one name; "
                         "write them alike and prepare again")
    alike: dict[str, list[str]] = {}
    for name in classes:
        key = unicodedata.normalize("NFKC", " ".join(str(name).split())).casefold()
        alike.setdefault(key, []).append(str(name))
    groups = [names for names in alike.values() if len(names) > 1]
    if groups:
        shown = "; ".join(" and ".join(repr(n) for n in names) for names in groups[:5])
        warnings.warn(f"{where}: {plural(len(groups), 'set')} of class names differ only in case "
                      f"or spaces ({shown}) and are kept as separate classes; if each set is one "
                      "class, write its names alike and prepare again with --overwrite",
                      FeatcacheWarning, stacklevel=3)


def same_text(names: Sequence[str]) -> tuple[str, str] | None:
    """The first two names that differ but are equal once put in Unicode's composed form (NFC:
    ``café`` written with U+00E9 and with ``e`` + U+0301), or None."""
    seen: dict[str, str] = {}
    for name in names:
        text = str(name)
        key = unicodedata.normalize("NFC", text)
        if key in seen and seen[key] != text:
            return seen[key], text
        seen.setdefault(key, text)
    return None


def code_points(text: str) -> str:
    """``U+0063 U+0061 U+0066 U+00E9`` (the first 12 code points)."""
    shown = " ".join(f"U+{ord(c):04X}" for c in text[:12])
    return shown + (" ..." if len(text) > 12 else "")
