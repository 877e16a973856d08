"""``torchrun --nproc_per_node 2 -m featcache train-linear`` on the CPU (gloo) equals one process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from dataset_fixtures import invoke
from linear_fixtures import synthetic_dataset
from test_features_distributed import free_port

from featcache.linear.workers import balance
from featcache.protocol.runs import load_results

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
    synthetic_dataset(tmp_path / "two")
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
