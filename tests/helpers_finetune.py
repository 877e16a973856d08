"""A small image dataset with features and a linear ROLE run, built once per test session.

``base_cache(tmp_root)`` makes generated images, a labels file (dataset ``toy``: 20 official
train images, 16 train / 4 val, 8 test, 3 classes), stage one's features with random ResNet-50
weights at 32 x 32, and a finished linear ``role`` run; ``copy_cache`` gives a test its own
copy of the cache (the images are shared, read-only). ``shared_run`` fine-tunes once per session
what several tests only read (the run an interrupted one must end like, the run whose logs are
checked), instead of each test training it again.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import NamedTuple

from dataset_fixtures import invoke
from helpers_images import make_dataset

from featcache.features.extract import ExtractOptions, extract_features

SIZE = 32
NAME = "toy"
_BUILT: dict[str, Path] = {}


def base_cache(tmp_root: Path) -> Path:
    """The session's base cache (built on first use)."""
    if "cache" not in _BUILT:
        base = Path(tmp_root) / "finetune-base"
        make_dataset(base, num_train=20, num_test=8, name=NAME, num_classes=3)
        cache = base / "cache"
        extract_features(NAME, ExtractOptions(weights="random", image_size=SIZE, device="cpu",
                                              workers=0, cache=str(cache)), say=lambda _: None)
        result = invoke("train-linear", "--dataset", NAME, "--loss", "role", "--lr", "1e-2",
                        "--bsize", "4", "--epochs", "3", "--quiet", "--no-plots", "--cache", cache,
                        "--run-id", "linear-role")
        assert result.exit_code == 0, result.output
        _BUILT["cache"] = cache
    return _BUILT["cache"]


def fresh_setup(tmp_root: Path):
    """(FinetuneData, a fresh-head StartPoint) of the base cache, on the CPU: what tests of
    single training steps start from."""
    import torch

    from featcache.finetune.data import load_finetune_data
    from featcache.finetune.options import FinetuneOptions
    from featcache.finetune.start import resolve_start
    from featcache.runtime import single_process

    data = load_finetune_data(base_cache(tmp_root) / NAME / "labels.h5")
    start = resolve_start(FinetuneOptions(init="none", loss="an", dataset=NAME, weights="random",
                                          image_size=SIZE), data, single_process(torch.device("cpu")))
    return data, start


def config_trainer(cache: Path, init: str = "best", loss: str = "role", **start_kw):
    """(ConfigTrainer of one configuration (lr 1e-3, batch 4, 1 epoch) on the CPU, its data),
    started as ``featcache finetune --init INIT`` would start it."""
    import torch

    from featcache.finetune.data import load_finetune_data
    from featcache.finetune.loop import ConfigTrainer
    from featcache.finetune.options import FinetuneOptions
    from featcache.finetune.plan import FinetunePlan
    from featcache.finetune.run import loss_params
    from featcache.finetune.start import resolve_start
    from featcache.protocol.grid import GridPoint
    from featcache.runtime import Ranks

    cpu = Ranks(0, 1, 0, 1, torch.device("cpu"))
    data = load_finetune_data(cache / NAME / "labels.h5")
    start = resolve_start(FinetuneOptions(init=init, loss=loss, dataset=NAME, cache=str(cache),
                                          progress=False, **start_kw), data, cpu)
    settings = FinetunePlan(loss=loss, params=loss_params(loss, start.params, data), epochs=1,
                        progress=False, eval_batch_size=8)
    return ConfigTrainer(GridPoint(1e-3, 4), settings, start, data, cpu), data


def copy_cache(tmp_root: Path, target: Path) -> Path:
    """A private copy of the base cache at ``target``."""
    shutil.copytree(base_cache(tmp_root), target)
    return target


#: the base cache's pooled features file and the spatial file :func:`write_spatial` adds
POOLED = "features-resnet50-random.h5"
SPATIAL = "spatial-resnet50-random.h5"


def write_spatial(cache: Path) -> None:
    """The spatial file of the base cache's random ResNet-50 at 32 x 32: its last feature map
    is 1 x 1, so each image's map is exactly its pooled feature."""
    from featcache.data.featurefile import load_features, read_feature_attrs
    from featcache.data.featurewrite import write_features
    from featcache.data.labelfile import load_labels

    labels = load_labels(cache / NAME / "labels.h5")
    pooled = load_features(cache / NAME / POOLED)
    attrs = {k: v for k, v in read_feature_attrs(cache / NAME / POOLED).items()
             if k in ("backbone", "weights", "weights_sha256", "weights_seed", "image_size",
                      "transform", "preprocess", "pooling")}
    write_features(cache / NAME / SPATIAL, labels, {"train": pooled.train, "test": pooled.test},
                   {**attrs, "layout": "spatial", "spatial_shape": [1, 1, pooled.train.shape[1]]})


def linear_run(cache: Path) -> Path:
    return cache / NAME / "runs" / "role" / "linear-role"


def finetune(cache: Path, *args: str):
    """``featcache finetune --dataset toy ...`` in-process, quiet, small and fast (``args`` may
    name another --dataset: an option is given once)."""
    dataset = () if "--dataset" in args else ("--dataset", NAME)
    return invoke("finetune", *dataset, "--cache", cache, "--quiet", "--no-plots",
                  "--workers", "0", "--device", "cpu", *args)


#: ROLE fine-tuned from the linear run for 2 epochs at batch 4: one configuration (lr 1e-3), and two
ROLE_ONE_CONFIG = ("--loss", "role", "--epochs", "2", "--lr", "1e-3", "--bsize", "4")
ROLE_TWO_CONFIGS = ("--loss", "role", "--epochs", "2", "--lr", "1e-3,1e-4", "--bsize", "4")


class SharedRun(NamedTuple):
    args: tuple[str, ...]
    run_dir: Path  # the finished run's folder: read it, never write to it
    output: str  # what the command printed
    logs: Path | None  # its --tensorboard folder (None without the tensorboard extra)


_RUNS: dict[str, SharedRun] = {}


def shared_run(tmp_root: Path, run_id: str, *args: str) -> SharedRun:
    """``featcache finetune ARGS --run-id RUN_ID`` (in-process, as :func:`finetune`) on the
    session's own copy of the base cache, with ``--tensorboard`` when the extra is installed;
    trained on first use, then shared by every test that asks for the same run (tests must only
    read it; asking for the same id with other arguments is an error)."""
    if run_id not in _RUNS:
        root = Path(tmp_root) / f"finetune-shared-{run_id}"
        cache = copy_cache(tmp_root, root / "cache")
        logs = root / "tb" if importlib.util.find_spec("tensorboard") is not None else None
        result = finetune(cache, *args, "--run-id", run_id,
                          *(("--tensorboard", str(logs)) if logs is not None else ()))
        assert result.exit_code == 0, result.output
        loss = args[args.index("--loss") + 1]
        _RUNS[run_id] = SharedRun(args, cache / NAME / "finetune" / loss / run_id, result.output,
                                  logs)
    assert _RUNS[run_id].args == args, f"shared run {run_id} was trained with other arguments"
    return _RUNS[run_id]


def ddp_worker(rank: int, world: int, port: int, cache: str, out: str) -> None:
    """One rank of the two-process gloo test (``torch.multiprocessing`` entry point).

    Trains an epoch of ROLE from the linear run and one of LL-Cp (acting: delta_rel 50) with
    the trainer, saving what must agree between ranks; then runs the whole command for one epoch
    with DDP, and a grid of three configurations with ``--schedule per-gpu``.
    """
    import os

    import torch

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    from featcache.finetune.data import load_finetune_data
    from featcache.finetune.loop import ConfigTrainer
    from featcache.finetune.options import FinetuneOptions
    from featcache.finetune.plan import FinetunePlan
    from featcache.finetune.run import loss_params, run_finetune
    from featcache.finetune.start import resolve_start
    from featcache.protocol.grid import GridPoint
    from featcache.runtime import ranks

    with ranks("cpu") as job:
        data = load_finetune_data(Path(cache) / NAME / "labels.h5")
        # ROLE's first epoch; LL-Cp's second (it corrects nothing in the first)
        for loss, init, given, epochs in (("role", "best", {}, [0]),
                                          ("ll-cp", "none", {"delta_rel": 50.0}, [1])):
            start = resolve_start(FinetuneOptions(init=init, loss=loss, dataset=NAME, cache=cache,
                                               weights=None if init == "best" else "random",
                                               image_size=SIZE, progress=False), data, job)
            settings = FinetunePlan(loss=loss, params=loss_params(loss, {**start.params, **given}, data),
                                epochs=2, progress=False, eval_batch_size=8)
            trainer = ConfigTrainer(GridPoint(1e-3, 4), settings, start, data, job)
            records = [trainer.run_epoch(epoch)[0] for epoch in epochs]
            torch.save({"state": {k: v.detach() for k, v in trainer.state.items()},
                        "model": trainer.net.state_dict(),
                        "val": [r.val_map for r in records], "loss": [r.train_loss for r in records]},
                       Path(out) / f"{loss}-{rank}.pt")
        line = run_finetune(FinetuneOptions(dataset=NAME, loss="role", epochs=1, learning_rates=[1e-3],
                                            batch_sizes=[4], workers=0, device="cpu", cache=cache,
                                            run_id="ddp", plots=False, progress=False,
                                            schedule="ddp"))
        assert (line is None) == (rank != 0)
        # The grid with one configuration per rank, trained at the same time
        run_finetune(FinetuneOptions(**PER_GPU, workers=0, device="cpu", cache=cache,
                                     run_id="per-gpu", plots=False, progress=False))


#: the run the per-gpu schedule test makes on two ranks and in one process
PER_GPU = {"dataset": NAME, "loss": "role", "epochs": 2, "learning_rates": [1e-3, 1e-4, 1e-2],
           "batch_sizes": [4], "schedule": "per-gpu"}
