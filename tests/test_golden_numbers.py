"""Same seed, same numbers: stage two on the real ``scene`` set against numbers recorded before
the protocol-layer refactor (featcache a6a756c). Every epoch's validation and test mAP of every
configuration must match; a change that moves them is a change of behaviour, not of speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dataset_fixtures import invoke

from featcache.protocol.runs import load_results

GOLDEN = json.loads((Path(__file__).parent / "golden" / "scene-linear.json").read_text())
#: float rounding only (the recorded runs and these agree bit for bit on this machine)
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def scene_cache(tmp_path_factory, shared_data):
    cache = tmp_path_factory.mktemp("golden") / "cache"
    result = invoke("prepare", "features", "--npz", shared_data / "scene" / "scene.npz",
                    "--name", "scene", "--cache", cache)
    assert result.exit_code == 0, result.output
    return cache


@pytest.mark.shared_data
@pytest.mark.parametrize("loss", sorted(GOLDEN["losses"]))
def test_stage_two_gives_the_recorded_numbers(scene_cache, loss):
    result = invoke("train-linear", "--dataset", "scene", "--loss", loss, "--run-id", "golden",
                    "--quiet", "--no-plots", "--device", "cpu", "--cache", scene_cache)
    assert result.exit_code == 0, result.output
    document = load_results(scene_cache / "scene" / "runs" / loss / "golden")
    expected = GOLDEN["losses"][loss]
    selection = document["selection"]
    for key, value in expected["selection"].items():
        assert selection[key] == pytest.approx(value, abs=TOLERANCE), key
    configs = document["seeds"][0]["configs"]
    assert len(configs) == len(expected["configs"])
    for got, want in zip(configs, expected["configs"], strict=True):
        assert (got["lr"], got["batch_size"]) == (want["lr"], want["batch_size"])
        assert [e["val_map"] for e in got["epochs"]] == pytest.approx(want["val_map"], abs=TOLERANCE)
        assert [e["test_map"] for e in got["epochs"]] == pytest.approx(want["test_map"], abs=TOLERANCE)
