"""``torchrun --nproc_per_node 2 -m featcache train-linear`` on the CPU (gloo) equals one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from dataset_fixtures import invoke
from faults import group_gone, interrupt, wait_for
from linear_fixtures import synthetic_dataset
from test_features_distributed import free_port

from featcache.linear.engine.workers import balance
from featcache.protocol.runs import load_results

pytestmark = pytest.mark.slow  # starts torchrun ranks (`make test-fast` leaves it out)

ARGS = ("--dataset", "toy", "--loss", "role,an", "--epochs", "3", "--lr", "1e-2,1e-3",
        "--bsize", "8,16", "--seeds", "0,1", "--quiet", "--no-plots", "--device", "cpu")


def test_groups_are_balanced_by_cost_and_deterministically():
    assert balance([5, 1, 4, 2], 2) == [[0, 1], [2, 3]]
    assert balance([3, 3, 3], 2) == [[0, 2], [1]]
    assert balance([1, 2], 4) == [[1], [0], [], []]


@pytest.mark.slow
def test_two_ranks_write_the_same_runs_as_one_process(tmp_path, monkeypatch):
    # torchrun gives each rank one thread, as the search gives each group
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    synthetic_dataset(tmp_path / "one")
    # one copy of the same files: files written in another second hash differently (their
    # `created` attribute), and the fingerprint includes the files' sha256
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    single = invoke("train-linear", *ARGS, "--run-id", "r", "--cache", tmp_path / "one")
    assert single.exit_code == 0, single.output
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-m", "featcache", "train-linear", *ARGS, "--run-id", "r",
               "--cache", str(tmp_path / "two")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("role: val") == 1 and done.stdout.count("an: val") == 1  # rank 0
    for loss in ("role", "an"):
        one = load_results(tmp_path / "one" / "toy" / "runs" / loss / "r")
        two = load_results(tmp_path / "two" / "toy" / "runs" / loss / "r")
        assert two["fingerprint"] == one["fingerprint"]
        assert two["seeds"] == one["seeds"]  # every epoch of every configuration, bit for bit
        assert two["selection"] == one["selection"]
        assert "2 ranks" in two["machine"]["device"]
        head_one = torch.load(tmp_path / "one" / "toy" / "runs" / loss / "r" / "best.pt")
        head_two = torch.load(tmp_path / "two" / "toy" / "runs" / loss / "r" / "best.pt")
        assert torch.equal(head_one["weight"], head_two["weight"])
        for name, value in head_one["handoff"].items():
            assert torch.equal(value, head_two["handoff"][name])


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_at_its_next_step_and_leaves_nothing_behind(tmp_path):
    """torchrun passes Ctrl-C on to its ranks: each stops at its next step, they agree on the
    stop (no rank waits in a collective for one that stopped), and no process or file is left."""
    synthetic_dataset(tmp_path / "cache")
    entry = tmp_path / "entry.py"  # featcache with every training step slowed to 0.2 s
    entry.write_text(textwrap.dedent("""
        import os, sys, time
        from featcache.linear.engine.trainer import GroupTrainer
        original = GroupTrainer.train_step
        def slowed(*args, **kwargs):
            marks = os.environ["STEP_MARKS"]  # a file per rank as its steps begin
            open(os.path.join(marks, f"step-rank{os.environ['RANK']}"), "w").close()
            time.sleep(0.2)
            return original(*args, **kwargs)
        GroupTrainer.train_step = slowed
        from featcache.cli import main
        sys.argv = ["featcache", *sys.argv[1:]]
        main()
    """))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(entry),
               "train-linear", *ARGS, "--run-id", "r", "--cache", str(tmp_path / "cache")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                         "STEP_MARKS": str(tmp_path)})
    runs = tmp_path / "cache" / "toy" / "runs"
    wait_for(lambda: (runs / "role" / "r" / "run.json").exists()
             and all((tmp_path / f"step-rank{rank}").exists() for rank in (0, 1)), process)
    seconds, out, err = interrupt(process)
    assert seconds < 15.0, err
    assert err.count("featcache: interrupted: stopped by Ctrl-C; no loss had finished (run id "
                     "r); run the same command again to train them from the start") == 2, err
    assert "another rank failed" not in err and "terminate called" not in err
    time.sleep(0.5)
    assert group_gone(process)
    assert not list((tmp_path / "cache").rglob(".*tmp-*"))
    assert not list((tmp_path / "cache").rglob("*.lock"))
