"""The command line's own process (:mod:`featcache.process`): what it freezes for the garbage
collector, and that a library call (the Python API, these tests) freezes nothing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from featcache import process


@pytest.fixture
def unfrozen(monkeypatch):
    monkeypatch.setattr(process, "_OWNED", [False])  # whatever ran in this process before
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_process_featcache_does_not_own_is_left_alone(unfrozen):
    assert not process.owned()
    process.freeze()
    assert gc.get_freeze_count() == 0


class _Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_in_its_own_process_the_imports_are_frozen_and_so_is_everything_at_the_end(unfrozen):
    """What existed when the imports were done is left alone by the collector; what the
    command makes after is collected as usual."""
    import weakref

    before = _Cycle()
    was = weakref.ref(before)
    process.claim()
    process.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    after = _Cycle()
    made_later = weakref.ref(after)
    del before, after
    gc.collect()
    assert was() is not None and made_later() is None
    process.freeze()  # at the end: what the command made too
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    assert was() is None


def test_the_console_entry_point_claims_its_process():
    """``featcache`` (``featcache.cli:main``) owns its process: a command's exit code and
    output are what they were, and the process ends with the command."""
    code = ("import sys\nfrom featcache import process\nfrom featcache.cli import main\n"
            "sys.argv = ['featcache', 'losses']\n"
            "try:\n    main()\nexcept SystemExit as exc:\n"
            "    print('owned', process.owned(), 'code', exc.code, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "owned True code 0" in done.stderr and "an" in done.stdout
