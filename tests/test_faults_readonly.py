"""A read-only cache (a shared, mounted or archived one, common on clusters), for real: the cache
is bind-mounted read-only in a private mount namespace (``unshare``), so even root gets EROFS.
Reading a finished run needs no lock; writing says in one line that the cache is read-only and
which option puts the outputs elsewhere, and the advice works as printed; ``report`` fails
cleanly (it once failed again in the clean-up of its temporary file)."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from dataset_fixtures import invoke
from faults import can_mount_read_only, run
from linear_fixtures import synthetic_dataset

LINEAR = ["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "2", "--lr", "1e-2",
          "--bsize", "16", "--quiet", "--no-plots", "--device", "cpu"]


@pytest.fixture
def cache(tmp_path):
    """A cache with a finished linear run ``done``, after checking that a read-only mount works."""
    why = can_mount_read_only(tmp_path / "probe")
    if why:
        pytest.skip(why)
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy")
    finished = invoke(*LINEAR, "--run-id", "done", "--cache", cache)  # setting up: in-process
    assert finished.exit_code == 0, finished.output
    return cache


def _error(result) -> str:
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "unexpected" not in lines[0], result.stderr
    return lines[0]


def test_a_finished_run_is_shown_from_a_read_only_cache_without_a_lock(cache, tmp_path):
    before = sorted(p.name for p in cache.rglob("*"))
    shown = run([*LINEAR, "--run-id", "done"], tmp_path, env={"FEATCACHE_CACHE": str(cache)},
                read_only=cache)
    assert shown.returncode == 0, shown.stderr
    assert "an: run done already finished with these settings; reusing it" in shown.stderr
    assert "val " in shown.stdout and f"{cache}/toy/runs/an/done" in shown.stdout, shown.stdout
    table = run(["table", str(cache / "toy" / "runs")], tmp_path, read_only=cache)
    assert table.returncode == 0 and "| an " in table.stdout, table.stderr
    assert sorted(p.name for p in cache.rglob("*")) == before


def test_a_new_run_on_a_read_only_cache_says_so_and_the_advice_works(cache, tmp_path):
    refused = run([*LINEAR, "--run-id", "new"], tmp_path, env={"FEATCACHE_CACHE": str(cache)},
                  read_only=cache)
    line = _error(refused)
    assert line == (f"Error: cannot write {cache}/toy/runs/an/new: the cache {cache} is read-only; "
                    "put the outputs in a writable cache with --cache DIR (or FEATCACHE_CACHE=DIR), "
                    f"the dataset's files linked there first: `cp -rs {cache}/toy DIR/`")
    assert not (cache / "toy" / "runs" / "an" / "new").exists()

    writable = tmp_path / "mine"
    writable.mkdir()
    link = line.rsplit("`", 2)[-2].replace("DIR", shlex.quote(str(writable)))
    subprocess.run(link, shell=True, check=True, cwd=tmp_path)  # the advice as printed
    moved = run([*LINEAR, "--run-id", "new", "--cache", str(writable)], tmp_path,
                read_only=cache)
    assert moved.returncode == 0, moved.stderr
    assert (writable / "toy" / "runs" / "an" / "new" / "results.json").is_file()


def test_report_on_a_read_only_cache_fails_in_one_line_and_writes_elsewhere(cache, tmp_path):
    dataset = cache / "toy"
    refused = run(["report", str(dataset)], tmp_path, read_only=cache)
    assert _error(refused) == (f"Error: cannot write {dataset}/report.html: the cache {cache} is "
                               "read-only; write it elsewhere with --out FILE")
    elsewhere = run(["report", str(dataset), "--out", str(tmp_path / "report.html")], tmp_path,
                    read_only=cache)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert (tmp_path / "report.html").stat().st_size > 0
