"""The runtime layer: device choice says when it falls back, backend flags are restored."""

from __future__ import annotations

import warnings

import pytest
import torch

from featcache.errors import FeatcacheWarning
from featcache.runtime import backend_flags, intraop_threads, pick_device, resolve_precision


def test_auto_falls_back_to_the_cpu_and_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(FeatcacheWarning, match="--device auto runs on the CPU"):
        assert pick_device("auto") == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pick_device("cpu") == torch.device("cpu")  # asked for: no warning


def test_backend_flags_are_set_for_the_block_and_restored(monkeypatch):
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (cudnn.benchmark, cudnn.conv.fp32_precision, matmul.fp32_precision)
    with backend_flags(torch.device("cuda"), "fp32", cudnn_benchmark=True):
        assert cudnn.benchmark is True
        assert (cudnn.conv.fp32_precision, matmul.fp32_precision) == ("ieee", "ieee")
    assert (cudnn.benchmark, cudnn.conv.fp32_precision, matmul.fp32_precision) == before
    with backend_flags(torch.device("cuda"), "bf16"):  # bf16 leaves the fp32 settings alone
        assert (cudnn.conv.fp32_precision, matmul.fp32_precision) == before[1:]
    with pytest.raises(RuntimeError), backend_flags(torch.device("cuda"), "fp32", cudnn_benchmark=True):
        raise RuntimeError("the work failed")
    with backend_flags(torch.device("cuda"), "bf16", cudnn_benchmark=True, deterministic=True):
        assert cudnn.benchmark is False and cudnn.deterministic is True
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled() and cudnn.deterministic is False
    assert (cudnn.benchmark, cudnn.conv.fp32_precision, matmul.fp32_precision) == before
    threads = torch.get_num_threads()
    with backend_flags(torch.device("cpu"), threads=1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    with intraop_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads


@pytest.mark.slow  # fine-tunes a network
def test_finetuning_leaves_no_flag_behind(tmp_path_factory, tmp_path):
    from helpers_finetune import copy_cache, finetune

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, torch.get_num_threads())
    result = finetune(cache, "--loss", "an", "--init", "none", "--weights", "random",
                      "--image-size", "32", "--epochs", "1", "--lr", "1e-3", "--batch-size", "8")
    assert result.exit_code == 0, result.output
    assert (cudnn.benchmark, torch.get_num_threads()) == before


def test_precision_choices():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="--precision 'fp8'"):
        resolve_precision("fp8", cpu)


def test_backend_flags_fall_back_to_the_legacy_tf32_flags_on_an_older_torch(monkeypatch):
    """A PyTorch without the fp32_precision API (before 2.9) gets the allow_tf32 flags only."""
    from types import SimpleNamespace

    from featcache import runtime

    cudnn = SimpleNamespace(benchmark=False, allow_tf32=True, deterministic=False)
    matmul = SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(runtime.torch, "backends", SimpleNamespace(
        cudnn=cudnn, cuda=SimpleNamespace(matmul=matmul)))
    assert runtime.fp32_modes() == ("tf32", "tf32")
    with backend_flags(torch.device("cuda"), "fp32", cudnn_benchmark=True):
        assert (cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32) == (True, False, False)
    assert (cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32) == (False, True, True)
    assert not hasattr(cudnn, "conv")  # nothing of the new API was set


def test_the_cpu_fallback_is_said_once_per_machine_and_never_ahead_of_an_error(
        cache_dir, monkeypatch, tmp_path):
    from dataset_fixtures import invoke
    from linear_fixtures import synthetic_dataset

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("FEATCACHE_STATE_DIR", str(tmp_path / "state"))
    synthetic_dataset(cache_dir)
    refused = invoke("train-linear", "--dataset", "toy", "--loss", "an", "--lr", "nope")
    assert refused.exit_code != 0 and "no CUDA GPU" not in refused.output
    missing = invoke("train-linear", "--dataset", "nosuch", "--loss", "an")
    assert missing.exit_code != 0 and "no CUDA GPU" not in missing.output
    assert "no dataset 'nosuch'" in missing.output
    args = ("train-linear", "--dataset", "toy", "--loss", "an", "--epochs", "1", "--lr", "1e-2",
            "--bsize", "16", "--quiet", "--no-plots")
    first = invoke(*args, "--run-id", "a")
    assert first.exit_code == 0, first.output
    assert first.output.count("no CUDA GPU is available") == 1
    assert first.output.rstrip().splitlines()[-1].startswith("featcache: warning: no CUDA GPU")
    second = invoke(*args, "--run-id", "b")
    assert second.exit_code == 0 and "no CUDA GPU" not in second.output
