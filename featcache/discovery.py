"""Registries filled by discovery: every module of a package is imported once, on first use, and
each registers what it defines, so that adding a module is all it takes (no list to edit)."""

from __future__ import annotations

import importlib
import pkgutil


def import_modules_of(package: str) -> None:
    """Import every module of ``package`` (a package whose modules register themselves)."""
    found = pkgutil.iter_modules(importlib.import_module(package).__path__)
    for name in sorted(info.name for info in found):
        importlib.import_module(f"{package}.{name}")
