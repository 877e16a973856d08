"""Paths and locks (issue 45, class 4): a cache root below a regular file, a lock path that is a
folder or a loop of symbolic links, and a cache this user may not write (permission denied, not
a read-only mount: a cache shared by another user), each for real in its own process. A
finished run is read from such a cache, ``report --out`` and ``predict --out`` write elsewhere,
and whatever would write into the cache says so in one line; no file in the cache changes."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from dataset_fixtures import invoke
from faults import digests, one_error_line, run_many
from linear_fixtures import synthetic_dataset

LINEAR = ["train-linear", "--dataset", "toy", "--epochs", "1", "--lr", "1e-2", "--bsize", "8",
          "--quiet", "--no-plots", "--device", "cpu"]
NOBODY = 65534



@pytest.fixture(scope="module")
def shared():
    """A folder under /tmp that every user may read (not pytest's, which only root may enter)
    holding a cache with a finished run ``r1`` of two losses (so that its table is written)."""
    root = Path(tempfile.mkdtemp(prefix="featcache-shared-"))
    os.chmod(root, 0o755)
    cache = root / "cache"
    synthetic_dataset(cache, name="toy", classes=4, n_train=40, n_test=20)
    made = invoke(*LINEAR, "--loss", "an,role", "--cache", cache, "--run-id", "r1")  # in-process
    assert made.exit_code == 0, made.output
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_cache_below_a_file_and_lock_paths_that_are_no_lock_files_are_refused(shared, tmp_path):
    cache = shutil.copytree(shared / "cache", tmp_path / "cache")
    runs = cache / "toy" / "runs" / "an"
    (runs / ".r2.lock").mkdir()
    (runs / ".r3.lock").symlink_to(".r3.lock")
    (tmp_path / "file").write_text("not a folder")
    before = digests(cache)
    results = run_many([(["prepare", "shapes"], {"FEATCACHE_CACHE": str(tmp_path / "file" / "c")}),
                        [*LINEAR, "--loss", "an", "--cache", str(cache), "--run-id", "r2"],
                        [*LINEAR, "--loss", "an", "--cache", str(cache), "--run-id", "r3"]],
                       tmp_path, prelude="import torch")
    lines = [one_error_line(result) for result in results]
    assert lines[0] == (f"$FEATCACHE_CACHE {tmp_path}/file/c is below {tmp_path}/file, a file, "
                        "not a folder: no folder can be made there; give the folder featcache "
                        "keeps its outputs in")
    for line, (run_id, what, remove) in zip(lines[1:], [("r2", "is a folder", "rmdir"),
                                                         ("r3", "is a loop of symbolic links",
                                                          "rm")], strict=True):
        assert line == (f"{runs}/.{run_id}.lock, the lock file of {runs}/{run_id}, {what} (made "
                        f"by hand, or by another tool): remove it (`{remove} "
                        f"{runs}/.{run_id}.lock`) and run the command again")
    assert digests(cache) == before and not (tmp_path / "file" / "c").exists()

    subprocess.run(shlex.split(lines[1].rsplit("`", 2)[-2]), check=True)  # the advice, pasted
    again = invoke(*LINEAR, "--loss", "an", "--cache", cache, "--run-id", "r2")
    assert again.exit_code == 0, again.output


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a command as another user")
def test_a_cache_this_user_may_not_write_is_read_and_outputs_go_elsewhere(shared):
    cache = shared / "cache"
    for path in [cache, *cache.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    mine = shared / "mine"
    mine.mkdir()
    os.chmod(mine, 0o777)
    before = digests(cache)
    run = cache / "toy" / "runs" / "an" / "r1"
    env = {"FEATCACHE_CACHE": str(cache), "HOME": str(mine), "FEATCACHE_STATE_DIR": str(mine)}
    results = run_many([
            [*LINEAR, "--loss", "an,role", "--run-id", "r1"],  # finished: shown, nothing written
            ["table", str(cache / "toy" / "runs")],
            ["report", str(cache / "toy"), "--out", str(mine / "report.html")],
            ["predict", "--run", str(run), "--features", str(cache / "toy" / "features-toy.h5"),
             "--out", str(mine / "p.csv")],
            ["report", str(cache / "toy")],
            [*LINEAR, "--loss", "an", "--run-id", "new"],
        ], mine, prelude="import torch", env=env, user=NOBODY)
    for result in results[:4]:
        assert result.returncode == 0, (result.args, result.stderr)
    assert "an: run r1 already finished with these settings; reusing it" in results[0].stderr
    assert (mine / "report.html").stat().st_size > 0 and (mine / "p.csv").stat().st_size > 0
    assert one_error_line(results[4]) == (
        f"cannot write {cache}/toy/report.html: the cache {cache} is not writable by this "
        "user; write it elsewhere with --out FILE")
    assert one_error_line(results[5]) == (
        f"cannot write {cache}/toy/runs/an/new: the cache {cache} is not writable by this "
        "user; put the outputs in a writable cache with --cache DIR (or FEATCACHE_CACHE=DIR), "
        f"the dataset's files linked there first: `cp -rs {cache}/toy DIR/`")
    assert digests(cache) == before
