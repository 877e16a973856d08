"""benchmarks.commands: each row is a fresh process whose CPU time, import time and torch
import are read back (no speed is asserted)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.commands import ROOT, export_revision, run_once


def test_a_command_row_reads_cpu_imports_and_whether_torch_was_imported():
    plain = run_once(["--help"], str(ROOT))
    assert plain["wall"] > 0 and plain["cpu"] > 0 and plain["torch"] is False
    timed = run_once(["losses", "an"], str(ROOT), importtime=True)
    assert timed["import_seconds"] > 0 and timed["torch"] is False


def test_the_baseline_is_the_code_at_a_revision(tmp_path: Path):
    exported = export_revision("HEAD", tmp_path)
    assert (exported / "featcache" / "cli.py").exists()
    assert run_once(["--help"], str(exported))["torch"] is False
