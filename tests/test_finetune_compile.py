"""``--compile``: graphs are captured once per batch shape and reused by later configurations."""

from __future__ import annotations

import pytest
import torch
from helpers_finetune import NAME, SIZE, base_cache
from torch._dynamo.utils import counters

from featcache.finetune import loop
from featcache.finetune.data import load_finetune_data
from featcache.finetune.loop import ConfigTrainer
from featcache.finetune.options import FinetuneOptions
from featcache.finetune.plan import FinetunePlan
from featcache.finetune.start import resolve_start
from featcache.protocol.grid import GridPoint
from featcache.runtime import Ranks

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)

CPU = Ranks(0, 1, 0, 1, torch.device("cpu"))


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_a_second_configuration_compiles_nothing_new(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(loop, "COMPILE_BACKEND", "eager")  # dynamo's capture, without codegen
    cache = base_cache(tmp_path_factory.getbasetemp())
    data = load_finetune_data(cache / NAME / "labels.h5")
    start = resolve_start(FinetuneOptions(init="none", loss="an", dataset=NAME, weights="random",
                                          backbone="resnet18", image_size=SIZE), data, CPU)
    settings = FinetunePlan(loss="an", params={}, epochs=1, compile=True, progress=False,
                        eval_batch_size=8)
    torch._dynamo.reset()
    counters.clear()
    seen = []
    for lr in (1e-3, 1e-4):  # two configurations of one batch size, as in the grid
        trainer = ConfigTrainer(GridPoint(lr, 4), settings, start, data, CPU)
        trainer.train_epoch(0)
        trainer.predict(data.val)
        seen.append(_graphs())
    assert seen[0] >= 2  # training and evaluation graphs
    assert seen[1] == seen[0], f"the second configuration compiled {seen[1] - seen[0]} new graphs"
    torch._dynamo.reset()
