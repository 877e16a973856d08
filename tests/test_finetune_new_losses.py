"""Stage three with the losses since 2022: GR's schedule spans the fine-tuning epochs (the loop
calls begin_epoch), and ``--param k=estimate:M`` is resolved and recorded."""

from __future__ import annotations

import json

import pytest
from helpers_finetune import NAME, SIZE, base_cache, copy_cache, finetune

pytestmark = pytest.mark.slow  # fine-tunes a network (`make test-fast` leaves it out)


def test_gr_fine_tunes_with_its_schedule_over_the_run(tmp_path_factory, tmp_path):
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    result = finetune(cache, "--loss", "gr", "--init", "none", "--weights", "random",
                      "--image-size", str(SIZE), "--epochs", "2", "--lr", "1e-3", "--bsize", "8",
                      "--run-id", "new")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "gr" / "new" / "results.json").read_text())
    epochs = document["configs"][0]["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2] and all(e["train_loss"] > 0 for e in epochs)
    # schedule_epochs = 0 (the run's length) cannot run without begin_epoch: the loop calls it
    assert document["selection"]["params"]["schedule_epochs"] == 0


def test_finetune_records_an_estimated_k(tmp_path_factory, tmp_path):
    base_cache(tmp_path_factory.getbasetemp())
    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    result = finetune(cache, "--loss", "role", "--param", "k=estimate:4:9", "--epochs", "1",
                      "--lr", "1e-3", "--bsize", "4", "--run-id", "est")
    assert result.exit_code == 0, result.output
    document = json.loads((cache / NAME / "finetune" / "role" / "est" / "results.json").read_text())
    record = document["selection"]["params_estimates"]["k"][0]
    assert (record["labeled"], record["seed"]) == (4, 9)
    assert document["selection"]["params"]["k"] == record["value"]
