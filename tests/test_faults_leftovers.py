"""Leftovers after ``kill -9``: the hidden temporary file a killed writer leaves in a run folder
(``.run.json.tmp-<pid>``) is removed by the next run of that run id, once it holds the folder's
lock, when its process is gone; one whose process still lives is kept. Real processes: the
writer is killed with SIGKILL while its temporary file exists."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from faults import run, start, wait_for
from linear_fixtures import synthetic_dataset

LINEAR = ["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "1", "--lr", "1e-2",
          "--bsize", "16", "--run-id", "r1", "--quiet", "--no-plots", "--device", "cpu"]
#: each file's last step before its rename (fsync of the complete temporary file) waits 60 s,
#: after leaving a marker file
HELD_BEFORE_RENAME = "import featcache.fileio as _fileio\n_slow(_fileio, '_fsync_file', 60.0, mark='fsync')"


@pytest.mark.slow  # kills a run, then runs it again
def test_temporary_files_of_a_killed_run_are_removed_by_the_next_run_of_its_id(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy")
    env = {"FEATCACHE_CACHE": str(cache)}
    run_dir = cache / "toy" / "runs" / "an" / "r1"
    killed = start(LINEAR, tmp_path, HELD_BEFORE_RENAME, env=env)
    wait_for(lambda: (tmp_path / "fsync-1").exists(), killed)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    leftover = run_dir / f".run.json.tmp-{killed.pid}"
    assert leftover.is_file(), sorted(p.name for p in run_dir.iterdir())

    # a temporary file whose process lives (no featcache process would hold it while the run
    # id's lock is free, but a live process's file is never taken away)
    with subprocess.Popen(["sleep", "120"]) as alive:
        kept = run_dir / f".results.json.tmp-{alive.pid}"
        kept.write_text("{}")
        try:
            again = run(LINEAR, tmp_path, env=env)
            assert again.returncode == 0, again.stderr
            assert not leftover.exists() and kept.is_file()
        finally:
            alive.kill()
    assert (run_dir / "results.json").is_file()
    assert sorted(p.name for p in run_dir.glob(".*")) == [kept.name]
