"""Two ranks (gloo, CPU): per-example state, weights and metrics stay identical across ranks."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
from helpers_finetune import NAME, PER_GPU, copy_cache, ddp_worker

from featcache.finetune.data import EpochBatches, epoch_order
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.run import run_finetune

pytestmark = pytest.mark.slow  # starts torchrun ranks (`make test-fast` leaves it out)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ranks_share_every_global_batch():
    whole = [b for b in EpochBatches(16, 4, seed=0, rank=0, world=1)]
    parts = [list(EpochBatches(16, 4, seed=0, rank=r, world=2)) for r in range(2)]
    assert [a + b for a, b in zip(*parts, strict=True)] == whole
    assert torch.equal(torch.tensor([[p for p, _ in b] for b in whole]), epoch_order(16, 4, 0, 0))


@pytest.mark.filterwarnings("ignore:the validation split has fewer than 5 positives")  # toy data
def test_two_ranks_stay_identical(tmp_path_factory, tmp_path, monkeypatch):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(ddp_worker, args=(2, _free_port(), str(cache), str(out)), nprocs=2,
                       start_method="spawn")
    for loss in ("role", "ll-cp"):
        rank0 = torch.load(out / f"{loss}-0.pt", weights_only=True)
        rank1 = torch.load(out / f"{loss}-1.pt", weights_only=True)
        assert rank0["val"] == rank1["val"] and rank0["loss"] == rank1["loss"]
        for key, tensor in rank0["state"].items():
            assert torch.equal(tensor, rank1["state"][key]), (loss, key)
        for key, tensor in rank0["model"].items():
            if "running" not in key and "num_batches" not in key:  # BN buffers: rank 0's are kept
                assert torch.equal(tensor, rank1["model"][key]), (loss, key)
    flipped = rank0["state"]["observed"]  # ll-cp: the ranks' corrections were shared
    assert int((flipped == 1).sum()) > 16
    runs = cache / NAME / "finetune" / "role"
    document = json.loads((runs / "ddp" / "results.json").read_text())
    assert document["machine"]["world_size"] == 2
    assert document["machine"]["schedule"]["together"] == ["lr0.001-bs4"]

    # --schedule per-gpu: rank 0 trained two configurations, rank 1 one, at the same time; the
    # run equals a one-process run of the grid (same thread count: oneDNN's sums depend on it)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run_finetune(FinetuneOptions(**PER_GPU, workers=0, device="cpu", cache=str(cache),
                                 run_id="single", plots=False, progress=False))
    spread, single = (json.loads((runs / name / "results.json").read_text())
                      for name in ("per-gpu", "single"))
    assert spread["machine"]["schedule"]["alone"] == ["lr0.001-bs4", "lr0.0001-bs4", "lr0.01-bs4"]
    assert _without_timings(spread) == _without_timings(single)
    best = [torch.load(runs / name / "best.pt", weights_only=True) for name in ("per-gpu", "single")]
    assert best[0]["lr"] == best[1]["lr"]
    for key, tensor in best[0]["model"].items():
        assert torch.equal(tensor, best[1]["model"][key]), key
    assert not list((runs / "per-gpu" / "configs").glob("*/best.pt"))  # only the selected one kept


def _without_timings(document: dict) -> tuple:
    configs = document["configs"]
    for config in configs:
        config.pop("seconds")
        for epoch in config["epochs"]:
            for key in ("train_seconds", "eval_seconds", "images_per_second"):
                epoch.pop(key)
    return configs, document["selection"]
