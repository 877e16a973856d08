"""``--tensorboard DIR`` of train-linear and finetune: every configuration's per-epoch scalars
and the selected configuration's hyper-parameters, read back with tensorboard's reader."""

from __future__ import annotations

import importlib.util

import pytest
from dataset_fixtures import invoke
from helpers_finetune import NAME, ROLE_TWO_CONFIGS, shared_run
from linear_fixtures import synthetic_dataset

from featcache.errors import OptionError
from featcache.protocol.configurations import configurations, varying_params
from featcache.protocol.runs import load_results
from featcache.protocol.tensorboard_log import SCALARS, require_tensorboard

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed "
                                           "(pip install 'featcache[tensorboard]')")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

FAST = ("--epochs", "3", "--lr", "1e-2,1e-3", "--bsize", "8,16", "--quiet", "--no-plots",
        "--device", "cpu")


def read(folder):
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def check_logged(folder, document) -> None:
    """Every configuration of ``document`` has its own folder whose scalars are the per-epoch
    records (float32), and each selected one its hyper-parameters."""
    configs = configurations(document)
    varying = varying_params(configs)
    assert sorted(p.name for p in folder.iterdir()) == sorted(c.name(varying) for c in configs)
    for config in configs:
        events = read(folder / config.name(varying))
        tags = events.Tags()["scalars"]
        for field, tag in SCALARS.items():
            expected = [(r["epoch"], r[field]) for r in config.epochs if r.get(field) is not None]
            if not expected:
                assert tag not in tags
                continue
            got = [(e.step, e.value) for e in events.Scalars(tag)]
            assert [s for s, _ in got] == [s for s, _ in expected]
            assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)
        hparams = "hparam/test_mAP" in tags
        assert hparams == config.selected
        if config.selected:
            assert events.Scalars("hparam/test_mAP")[0].value == pytest.approx(config.test_map)
            assert events.Scalars("hparam/val_mAP")[0].value == pytest.approx(config.val_map)
            plugins = events.PluginTagToContent("hparams")
            assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(plugins)
            start = plugins["_hparams_/session_start_info"]
            assert b"lr" in start and b"batch_size" in start and document["loss"].encode() in start
            assert document["fingerprint"] in events.Tensors("run/text_summary")[0] \
                .tensor_proto.string_val[0].decode()


def test_train_linear_logs_every_configuration(tmp_path):
    cache, logs = tmp_path / "cache", tmp_path / "tb"
    synthetic_dataset(cache, "toy")
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an,role", "--seeds", "0,1",
                    "--run-id", "r1", "--cache", cache, "--tensorboard", logs, *FAST)
    assert result.exit_code == 0, result.output
    assert f"tensorboard --logdir {logs}" in result.output
    for loss in ("an", "role"):
        document = load_results(cache / "toy" / "runs" / loss / "r1")
        folder = logs / "toy" / loss / "linear-r1"
        check_logged(folder, document)
        assert len(list(folder.iterdir())) == 2 * 2 * 2  # lr x batch x seed

    # running it again reuses the runs and adds no second copy of their curves
    before = sorted(p.name for p in logs.rglob("events.out.tfevents.*"))
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an,role", "--seeds", "0,1",
                    "--run-id", "r1", "--cache", cache, "--tensorboard", logs, *FAST)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in logs.rglob("events.out.tfevents.*")) == before


def test_a_parameter_axis_names_the_configurations(tmp_path, monkeypatch):
    cache, logs = tmp_path / "cache", tmp_path / "tb"
    synthetic_dataset(cache, "toy")
    monkeypatch.setenv("FEATCACHE_TENSORBOARD", str(logs))  # the default of --tensorboard
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an-ls", "--param",
                    "eps_pos=0.1,0.2", "--run-id", "p", "--cache", cache, "--epochs", "2",
                    "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots", "--device", "cpu")
    assert result.exit_code == 0, result.output
    folder = logs / "toy" / "an-ls" / "linear-p"
    assert sorted(p.name for p in folder.iterdir()) == ["0.01-8-0-eps_pos=0.1",
                                                        "0.01-8-0-eps_pos=0.2"]
    check_logged(folder, load_results(cache / "toy" / "runs" / "an-ls" / "p"))


@pytest.mark.slow  # fine-tunes a network
def test_finetune_logs_its_configurations(tmp_path_factory):
    # ``finetune --init best --loss role`` (two configurations) with ``--tensorboard``, trained once
    # per session: test_finetune_resume compares a resumed run with the same run
    run = shared_run(tmp_path_factory.getbasetemp(), "whole", *ROLE_TWO_CONFIGS)
    assert run.logs is not None
    document = load_results(run.run_dir)
    folder = run.logs / NAME / "role" / "finetune-whole"
    assert sorted(p.name for p in folder.iterdir()) == ["0.0001-4-0", "0.001-4-0"]
    check_logged(folder, document)


def test_missing_tensorboard_is_one_clear_line_before_any_training(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, "toy")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(OptionError, match=r"pip install 'featcache\[tensorboard\]'"):
        require_tensorboard()
    result = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--run-id", "x",
                    "--cache", cache, "--tensorboard", tmp_path / "tb", *FAST)
    assert result.exit_code != 0
    assert "--tensorboard needs the tensorboard package" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (cache / "toy" / "runs").exists()
