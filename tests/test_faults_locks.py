"""Two processes writing the same output: the second is refused in one line naming the holder
(pid, host, since when, command) and what to do; the first finishes with its own settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from dataset_fixtures import invoke
from faults import group_gone, start, wait_for
from linear_fixtures import synthetic_dataset

from featcache.errors import LockedError
from featcache.locks import OutputLock, describe_holder, lock_path

FAST = ("--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots", "--device", "cpu")


def _hold(target) -> subprocess.Popen:
    """Another process holding the lock of ``target`` until killed."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.argv = ["featcache", "finetune", "--dataset", "toy", "--run-id", "same"]
        from featcache.locks import OutputLock
        lock = OutputLock({str(target)!r}, "wait").acquire()
        print("locked", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_train_linear_on_the_same_run_is_refused_and_the_first_keeps_its_settings(
        cache_dir, tmp_path):
    synthetic_dataset(cache_dir, name="toy")
    slow = "from featcache.linear.engine.trainer import GroupTrainer\n_slow(GroupTrainer, 'train_epoch', 3.0)"
    first = start(["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "4",
                   "--run-id", "same", *FAST], tmp_path, slow)
    run_dir = cache_dir / "toy" / "runs" / "an" / "same"
    wait_for(lambda: (run_dir / "run.json").exists(), first)
    second = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "2",
                    "--run-id", "same", *FAST)
    assert second.exit_code == 1
    error = second.output.strip().splitlines()[-1]
    assert error.startswith(f"Error: {run_dir} is being written by another featcache process "
                            f"(pid {first.pid} on ")
    assert "running `featcache train-linear --dataset toy --loss an --epochs 4" in error
    assert error.endswith("; wait for it to finish, or choose another --run-id")
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    document = json.loads((run_dir / "results.json").read_text())
    assert document["protocol"]["epochs"] == 4  # the first run's settings, nothing mixed in
    assert len(document["seeds"][0]["configs"][0]["epochs"]) == 4
    again = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "4",
                   "--run-id", "same", *FAST)
    assert again.exit_code == 0 and "reusing it" in again.output  # the lock died with its holder


def test_finetune_and_features_on_a_locked_output_name_the_holder(tmp_path_factory, tmp_path):
    from helpers_finetune import NAME, copy_cache, finetune

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    run_dir = cache / NAME / "finetune" / "role" / "same"
    holder = _hold(run_dir)
    try:
        refused = finetune(cache, "--loss", "role", "--epochs", "1", "--lr", "1e-3", "--bsize",
                           "4", "--run-id", "same")
        assert refused.exit_code == 1
        error = refused.output.strip().splitlines()[-1]
        assert f"{run_dir} is being written by another featcache process (pid {holder.pid}" in error
        assert "running `featcache finetune --dataset toy --run-id same`" in error
        assert error.endswith("wait for it to finish, stop it (Ctrl-C; it can be resumed), or "
                              "choose another --run-id")
        assert not run_dir.exists()  # nothing was touched
    finally:
        holder.kill()
        holder.wait()

    final = cache / NAME / "features-resnet50-random.h5"
    holder = _hold(final)
    try:
        refused = invoke("features", "--dataset", NAME, "--cache", cache, "--weights", "random",
                         "--image-size", "32", "--device", "cpu", "--workers", "0", "--overwrite")
        assert refused.exit_code == 1
        assert f"{final} is being written by another featcache process (pid {holder.pid}" in refused.output
        assert "its finished chunks are kept for the next run" in refused.output
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_file_records_its_holder_and_nests(tmp_path):
    lock = OutputLock(tmp_path / "out" / "run", "wait")
    with lock:
        with lock:  # re-entering the same object nests
            record = json.loads(lock_path(tmp_path / "out" / "run").read_text())
            described = describe_holder(lock.path)
        assert lock.held
    assert not lock.held
    assert record["pid"] > 0 and record["host"] and record["since"] and record["command"]
    assert described.startswith(f"pid {record['pid']} on {record['host']} since ")
    assert not (tmp_path / "out").exists()  # the lock file and the folder it made are gone
    with OutputLock(tmp_path / "out" / "run", "wait"):  # released: free for the next writer
        pass


def test_an_unreadable_holder_record_still_gives_one_clear_line(tmp_path):
    holder = _hold(tmp_path / "stray")
    try:
        lock_path(tmp_path / "stray").write_text("garbage")
        with pytest.raises(LockedError, match=r"another featcache process \(a process that did "
                                              r"not say who it is\); wait$"):
            OutputLock(tmp_path / "stray", "wait").acquire()
    finally:
        holder.kill()
        holder.wait()


def test_train_linear_with_worker_processes_holds_its_lock_and_kill_9_frees_it(cache_dir, tmp_path):
    """Forked workers (--jobs 2, two groups) neither keep the lock nor outlive a killed run."""
    synthetic_dataset(cache_dir, name="toy")
    args = ["train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "2", "--run-id",
            "same", "--jobs", "2", "--lr", "1e-2,1e-3", "--bsize", "8,16", "--quiet",
            "--no-plots", "--device", "cpu"]
    slow = ("from featcache.linear.engine.trainer import GroupTrainer\n"
            "_slow(GroupTrainer, 'train_step', 0.5, mark='step')")
    first = start(args, tmp_path, slow)
    run_dir = cache_dir / "toy" / "runs" / "an" / "same"
    wait_for(lambda: (tmp_path / "step-1").exists(), first)  # the workers are training
    second = invoke(*args)
    assert second.exit_code == 1
    assert f"is being written by another featcache process (pid {first.pid} on " in second.output
    os.kill(first.pid, signal.SIGKILL)  # the main process only: its workers are orphaned
    first.communicate(timeout=30)
    deadline = time.monotonic() + 5
    while not group_gone(first) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_gone(first)  # the workers died with their parent
    again = invoke(*args)
    assert again.exit_code == 0, again.output  # the lock died with its holder
    assert (run_dir / "results.json").is_file()
