"""Registries filled by discovery: every module of a package is imported once, on first use, and
each registers what it defines, so that adding a module is all it takes (no list to edit)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def import_modules_of(package: str, suffix: str = "") -> list[ModuleType]:
    """Import every module of ``package`` whose name ends with ``suffix`` (a package whose
    modules register themselves), in the order of their names; the modules."""
    found = pkgutil.iter_modules(importlib.import_module(package).__path__)
    return [importlib.import_module(f"{package}.{name}")
            for name in sorted(info.name for info in found) if name.endswith(suffix)]
