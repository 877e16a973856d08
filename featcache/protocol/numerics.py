"""The numerics version: which arithmetic made a run's numbers.

Every ``results.json`` records ``numerics_version`` beside ``featcache_version``. The number
moves with every change of featcache that moves a number a run reports (a loss's formula, the
sampler, the order of a reduction, an optimizer's arithmetic), and only then: a speed-up that
keeps every bit keeps it. ``tests/test_golden_numbers.py`` records the version its numbers were
made under, so a change that moves them fails there until the version is bumped here and the
numbers are recorded again.

What follows from it:

- stage two reuses a finished run with the same settings only when it was made under this
  version; a run of another version (or of none: made before featcache recorded it) is trained
  again, saying so, so that ``featcache pipeline run`` never mixes numbers of two versions;
- ``featcache table`` and ``featcache report`` name, in one note, the runs they show that were
  made under another version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: bump when a change moves any number a run reports; say why in HISTORY
NUMERICS_VERSION = 1

#: what each version changed (newest last)
HISTORY = {
    1: "the first recorded version: the numbers of featcache at 1a69886 (2026-11-27), every "
       "loss equal to its authors' code; runs made before it record no version",
}

KEY = "numerics_version"


def recorded_version(document: Mapping) -> int | None:
    """The numerics version a results document was made under (None: made before featcache
    recorded it)."""
    version = document.get(KEY)
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def is_current(document: Mapping) -> bool:
    """Whether a results document's numbers are what this featcache computes."""
    return recorded_version(document) == NUMERICS_VERSION


def describe_version(version: int | None) -> str:
    """``numerics version 1`` or ``no numerics version (made before featcache recorded one)``."""
    return ("no numerics version (made before featcache recorded one)" if version is None
            else f"numerics version {version}")


def outdated_note(runs: Iterable[tuple[str, Mapping]], limit: int = 6) -> str | None:
    """One line naming the runs (label, results document) made under another numerics version
    than this featcache's, or None when there is none."""
    outdated = [(label, recorded_version(document)) for label, document in runs
                if not is_current(document)]
    if not outdated:
        return None
    versions = sorted({describe_version(v) for _, v in outdated})
    names = [label for label, _ in outdated]
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit
                                        else "")
    many = len(outdated) > 1
    return (f"{len(outdated)} run{'s were' if many else ' was'} made under another numerics "
            f"version than this featcache's ({NUMERICS_VERSION}): {shown} "
            f"({'; '.join(versions)}); {'their' if many else 'its'} numbers may differ from "
            "what featcache computes now: train again (train-linear or pipeline run retrain "
            "such runs; finetune with --overwrite)")
