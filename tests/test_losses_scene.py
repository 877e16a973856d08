"""The losses since 2022 (GR, Hill, SPLC) train and select on the real ``scene`` features."""

from __future__ import annotations

import pytest
from dataset_fixtures import invoke

from featcache.protocol.runs import load_results


@pytest.mark.shared_data
def test_gr_hill_splc_train_and_select_by_validation_map_on_scene(cache_dir, shared_data):
    made = invoke("prepare", "features", "--npz", shared_data / "scene" / "scene.npz",
                  "--name", "scene")
    assert made.exit_code == 0, made.output
    result = invoke("train-linear", "--dataset", "scene", "--loss", "gr,hill,splc", "--run-id", "new",
                    "--epochs", "4", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    an = invoke("train-linear", "--dataset", "scene", "--loss", "an", "--run-id", "new",
                "--epochs", "4", "--lr", "1e-2,1e-3", "--bsize", "16", "--quiet", "--no-plots",
                "--device", "cpu")
    assert an.exit_code == 0, an.output
    baseline = load_results(cache_dir / "scene" / "runs" / "an" / "new")["selection"]["test_map"]
    for loss in ("gr", "hill", "splc"):
        document = load_results(cache_dir / "scene" / "runs" / loss / "new")
        configs = document["seeds"][0]["configs"]
        assert len(configs) == 2 and all(len(c["epochs"]) == 4 for c in configs)
        # selection: the configuration and epoch with the highest validation mAP
        best = max(configs, key=lambda c: c["val_map"])
        selection = document["selection"]
        assert (selection["lr"], selection["val_map"]) == (best["lr"], best["val_map"])
        assert selection["epoch"] == best["best_epoch"]
        # every parameter is recorded; the losses learn (scene: 6 classes, chance mAP ~ 20)
        assert set(selection["params"]) == set(document["grid"]["params"])
        assert selection["test_map"] > 60.0 and abs(selection["test_map"] - baseline) < 10.0, loss
    assert load_results(cache_dir / "scene" / "runs" / "gr" / "new")["selection"]["params"][
        "schedule_epochs"] == 0  # 0: the schedule spans the run's 4 epochs
