"""The one command that validates featcache's GPU paths: ``make gpu-check``.

    PYTHONPATH=. python -m benchmarks.gpu_check [--out DIR]      (= make gpu-check)

On a CUDA machine, offline, in under 8 minutes on one H100 or H200, it

1. builds generated data: the ``shapes`` dataset and VOC-sized photo-like JPEGs;
2. extraction: fp32 and bf16 features agree within :data:`TOL_BF16`; ``--gpu-decode`` inputs
   and features agree with PIL's within :data:`TOL_DECODE_PIXELS` / :data:`TOL_DECODE`; a run
   killed with SIGKILL mid-way resumes to a file identical to an uninterrupted run's (both with
   the default decoder: JPEGs on the device on CUDA);
3. stage two on the GPU equals stage two on the CPU within :data:`TOL_LINEAR_MAP` points;
   CUDA graphs (many steps each, several groups at once) equal eager steps and a stacked pass
   equals each loss alone; a capture that fails falls back, once, on the run's device; CPU
   workers run in a process that trained on CUDA (:mod:`benchmarks.gpu_check_linear`);
4. fine-tuning: LinearInit's first evaluation equals the linear head on the cached features
   (:data:`TOL_LINEARINIT`); one epoch of bf16 autocast; ``--compile`` (two configurations:
   the second must compile nothing new; the compile time is reported); a ``--deterministic``
   run killed with SIGKILL and resumed equals an uninterrupted one; ``torchrun
   --nproc_per_node 1`` (equal to the plain run) and, with two GPUs, 2 (ddp and per-gpu);
   the test scores a linear and a fine-tuned run keep (``test-scores.h5``) give their recorded
   per-class test AP (:data:`TOL_SCORES`);
5. the two benchmarks in honest windows (:mod:`benchmarks.window`): ``benchmarks.extract
   --gpu-decode`` at 224 px and at 448 px (with the plain loop), ``benchmarks.finetune``, a
   table of images/s against their plain-loop baselines, and the decoder choice they imply
   (:mod:`benchmarks.decoder_choice`: PIL or ``--gpu-decode`` by default, and whether 224 px
   reached its target, or what limits it); ``benchmarks.linear --all-losses`` on CUDA
   beside the stage-two targets;
6. writes ``gpu-check.json`` and ``gpu-check.md`` in ``--out`` (default ``cache/gpu-check``)
   and exits non-zero if any check failed.

Without CUDA (or with ``--cpu-only``) it says so in one line and runs the parts that need
none, at tiny sizes on the CPU with ResNet-18: data, the extraction comparisons, both SIGKILL
resumes, LinearInit's first evaluation, the kept test scores. ``tests/test_gpu_check.py`` runs
that in CI (about half a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks import gpu_check_linear as linear_checks
from benchmarks import record

REPO = Path(__file__).resolve().parents[1]

#: bf16 autocast vs fp32 features: largest relative L2 error of a row, ||bf16 - fp32|| / ||fp32||
TOL_BF16 = 0.05
#: --gpu-decode vs PIL: mean absolute difference of the resized uint8 inputs, in grey levels
TOL_DECODE_PIXELS = 2.0
#: --gpu-decode vs PIL features (both fp32): largest relative L2 error of a row
TOL_DECODE = 0.08
#: stage two, GPU vs CPU: largest difference of the selected val and test mAP, in points
TOL_LINEAR_MAP = 0.05
#: test-scores.h5 against the recorded per-class test AP: largest difference, in points
TOL_SCORES = 1e-6
#: LinearInit: largest absolute difference between the network's first probabilities and the
#: linear head's on the cached features (both fp32)
TOL_LINEARINIT = 1e-4


#: the checks that every --only selection runs (what the others start from)
ALWAYS = ("data", "linear run for LinearInit")


class CheckFailed(Exception):
    """A check ran and its result is wrong (the message says how)."""


@dataclass
class Result:
    name: str
    status: str  # pass, fail, skip
    detail: str = ""
    numbers: dict = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Sizes:
    """How big each part is: tiny on the CPU (CI), realistic on a GPU."""

    shapes_train: int
    shapes_test: int
    photos: int
    image_size: int
    batch_size: int
    chunk_rows: int
    workers: int
    finetune_batch: int
    backbone: str

    @classmethod
    def for_device(cls, cuda: bool) -> Sizes:
        if cuda:
            return cls(400, 100, 1024, 224, 128, 256, 2, 16, "resnet50")
        # the CPU runs the same code paths on the smallest backbone and inputs
        return cls(20, 10, 16, 32, 4, 8, 0, 4, "resnet18")

    @property
    def features_tag(self) -> str:
        return f"{self.backbone}-random"


class GpuCheck:
    """Runs the checks in order and keeps their results."""

    def __init__(self, out: Path, cuda: bool, say: Callable[[str], None] = print,
                 budget: float = math.inf, on_result: Callable[[], None] = lambda: None,
                 only: tuple[str, ...] = ()):
        self.out = out
        self.budget = budget
        self.only = only
        self.on_result = on_result
        self.cuda = cuda
        self.device = "cuda" if cuda else "cpu"
        self.sizes = Sizes.for_device(cuda)
        self.cache = out / "cache"
        self.say = say
        self.results: list[Result] = []
        self.kept: dict = {}
        self.started = time.perf_counter()
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            FEATCACHE_OFFLINE="1")

    # ------------------------------------------------------------------ running
    def run(self, name: str, check: Callable[[], tuple[str, dict]], needs_cuda: bool = False,
            needs: tuple[str, ...] = (), takes: float = 0.0) -> None:
        """Run one check (``takes``: seconds it may need; not started when the budget is short)."""
        failed = [n for n in needs if not self.passed(n)]
        elapsed = time.perf_counter() - self.started
        if self.only and name not in ALWAYS and not name.startswith(self.only):
            self.results.append(Result(name, "skip", "not selected (--only)"))
        elif needs_cuda and not self.cuda:
            self.results.append(Result(name, "skip", "needs CUDA"))
        elif failed:
            self.results.append(Result(name, "skip", f"needs {', '.join(failed)}"))
        elif elapsed + takes > self.budget:
            self.results.append(Result(name, "fail", f"not run: {elapsed:.0f} s spent, it may take "
                                                     f"{takes:.0f} s, the budget is {self.budget:.0f} s"))
        else:
            self.say(f"[{time.perf_counter() - self.started:6.1f} s] {name} ...")
            started = time.perf_counter()
            self.kept = {}
            try:
                detail, numbers = check()
                result = Result(name, "pass", detail, numbers)
            except CheckFailed as exc:
                result = Result(name, "fail", str(exc), self.kept)
            except Exception as exc:  # an unexpected error is a failed check, with its trace
                trace = traceback.format_exc(limit=6)
                result = Result(name, "fail", f"{type(exc).__name__}: {exc}",
                                {**self.kept, "trace": trace})
            result.seconds = time.perf_counter() - started
            self.results.append(result)
        last = self.results[-1]
        self.say(f"    {last.status.upper()}: {last.detail}")
        self.on_result()  # the report so far is on disk: a killed check loses nothing else

    def remaining(self) -> float:
        """Seconds of the budget left."""
        return self.budget - (time.perf_counter() - self.started)

    def keep_numbers(self, numbers: dict) -> None:
        """What the running check measured: kept in its result even if it then fails."""
        self.kept = dict(numbers)

    def passed(self, name: str) -> bool:
        return any(r.name == name and r.status == "pass" for r in self.results)

    def numbers(self, name: str) -> dict:
        return next(r.numbers for r in self.results if r.name == name)

    # ------------------------------------------------------------------ helpers
    def cli(self, *args) -> None:
        """``featcache <args> --cache <cache>`` in this process (errors raise)."""
        from featcache.cli import cli

        cli.main([str(a) for a in args] + ["--cache", str(self.cache)], prog_name="featcache",
                 standalone_mode=False)

    def command(self, *args) -> list[str]:
        return [sys.executable, "-m", "featcache", *[str(a) for a in args], "--cache",
                str(self.cache)]

    def subprocess(self, argv: list[str], timeout: float = 300, extra_env: dict | None = None):
        done = subprocess.run(argv, env=dict(self.env, **(extra_env or {})), cwd=self.out,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise CheckFailed(f"`{' '.join(argv[2:])}` exited with {done.returncode}: "
                              f"{done.stderr.strip()[-1500:]}")
        return done

    def kill_when(self, argv: list[str], ready: Callable[[], bool], timeout: float = 300,
                  extra_env: dict | None = None) -> None:
        """Start ``argv``; SIGKILL it as soon as ``ready()`` holds (fail if it ends first)."""
        process = subprocess.Popen(argv, env=dict(self.env, **(extra_env or {})), cwd=self.out,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                if process.poll() is not None:
                    raise CheckFailed(f"`{' '.join(argv[2:])}` ended (exit {process.returncode}) "
                                      "before it could be killed mid-run: "
                                      f"{process.stderr.read().strip()[-800:]}")
                if time.monotonic() > deadline:
                    raise CheckFailed(f"`{' '.join(argv[2:])}` did not reach the kill point in "
                                      f"{timeout:.0f} s")
                time.sleep(0.01)
            process.send_signal(signal.SIGKILL)
            process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stderr.close()

    # ------------------------------------------------------------------ 1. data
    def make_data(self) -> tuple[str, dict]:
        from benchmarks.photos import image_dataset
        from featcache.runtime import usable_cpus

        s = self.sizes
        if not (self.cache / "shapes" / "labels.h5").is_file():
            self.cli("prepare", "shapes", "--num-train", s.shapes_train, "--num-test", s.shapes_test)
        labels, _, _, mean_kb = image_dataset(s.photos, usable_cpus(), root=self.out / "photos")
        target = self.cache / "photos"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(labels, target / "labels.h5")
        return (f"shapes {s.shapes_train}+{s.shapes_test} images, {s.photos} VOC-sized JPEGs of "
                f"{mean_kb:.0f} kB", {"mean_jpeg_kB": mean_kb})

    # ------------------------------------------------------------------ 2. extraction
    def extract(self, dataset: str, say: Callable[[str], None] = lambda _: None, **options):
        """Features of ``dataset`` extracted in this process with the check's sizes."""
        from featcache.features.extract import ExtractOptions, extract_features

        s = self.sizes
        settings = dict(backbone=s.backbone, weights="random", image_size=s.image_size,
                        batch_size=s.batch_size, chunk_rows=s.chunk_rows, workers=s.workers,
                        device=self.device, cache=str(self.cache), overwrite=True)
        settings.update(options)
        result = extract_features(dataset, ExtractOptions(**settings), say=say)
        return read_features(result.path)

    def bf16_vs_fp32(self) -> tuple[str, dict]:
        fp32 = self.extract("photos", precision="fp32")
        bf16 = self.extract("photos", precision="bf16")
        error = relative_errors(fp32, bf16)
        numbers = {"max_relative_error": float(error.max()),
                   "median_relative_error": float(np.median(error)), "tolerance": TOL_BF16}
        if not error.max() <= TOL_BF16:
            raise CheckFailed(f"bf16 features differ from fp32 by up to {error.max():.4f} "
                              f"(relative L2 of a row; tolerance {TOL_BF16})")
        return (f"bf16 vs fp32: relative error max {error.max():.4f}, median "
                f"{np.median(error):.4f} (tolerance {TOL_BF16})", numbers)

    def gpu_decode_vs_pil(self) -> tuple[str, dict]:
        from featcache.backbones import inputs
        from featcache.backbones.transforms import resize_transform
        from featcache.data.images import load_rgb
        from featcache.data.labelfile import load_labels

        labels = load_labels(self.cache / "photos" / "labels.h5")
        root = Path(labels.image_root)
        names = list(labels.train.images[:16])
        rows = inputs.JpegBytesRows(root, names, self.sizes.image_size)
        batch = inputs.collate_jpeg_rows([rows[i] for i in range(len(names))])
        device_images, decoded = inputs.decode_on_device(batch, self.sizes.image_size,
                                                         torch.device(self.device))
        pil = torch.stack([resize_transform(self.sizes.image_size)(load_rgb(root / n)) for n in names])
        pixels = float((device_images.cpu().float() - pil.float()).abs().mean())
        fp32 = self.extract("photos", precision="fp32", gpu_decode=False)  # PIL, not auto's
        device = self.extract("photos", precision="fp32", gpu_decode=True)
        error = relative_errors(fp32, device)
        numbers = {"pixel_mean_abs_difference": pixels, "pixel_tolerance": TOL_DECODE_PIXELS,
                   "max_relative_error": float(error.max()),
                   "median_relative_error": float(np.median(error)), "tolerance": TOL_DECODE,
                   "all_decoded": bool(decoded.all())}
        if not decoded.all() or not pixels <= TOL_DECODE_PIXELS or not error.max() <= TOL_DECODE:
            raise CheckFailed(f"device decode vs PIL: pixels differ by {pixels:.3f} levels on "
                              f"average (tolerance {TOL_DECODE_PIXELS}), features by up to "
                              f"{error.max():.4f} (tolerance {TOL_DECODE}); all decoded: "
                              f"{bool(decoded.all())}")
        return (f"inputs differ by {pixels:.3f} grey levels on average (tolerance "
                f"{TOL_DECODE_PIXELS}); features: relative error max {error.max():.4f}, median "
                f"{np.median(error):.4f} (tolerance {TOL_DECODE})", numbers)

    def extraction_resume(self) -> tuple[str, dict]:
        from featcache.features.shards import parts_dir

        s = self.sizes
        reference = self.extract("photos", precision="bf16" if self.cuda else "fp32")
        cache = self.out / "resume-cache"
        shutil.rmtree(cache, ignore_errors=True)
        (cache / "photos").mkdir(parents=True)
        shutil.copyfile(self.cache / "photos" / "labels.h5", cache / "photos" / "labels.h5")
        final = cache / "photos" / f"features-{s.features_tag}.h5"
        argv = [sys.executable, "-m", "featcache", "features", "--dataset", "photos", "--backbone",
                s.backbone, "--weights", "random", "--image-size", s.image_size, "--batch-size", s.batch_size,
                "--chunk-rows", s.chunk_rows, "--workers", s.workers, "--device", self.device,
                "--precision", "bf16" if self.cuda else "fp32", "--cache", cache]
        argv = [str(a) for a in argv]
        chunks = parts_dir(final)
        self.kill_when(argv, lambda: len(list(chunks.glob("chunk-*.npz"))) >= 1)
        done_before = len(list(chunks.glob("chunk-*.npz")))
        if final.exists():
            raise CheckFailed("the features file exists although the run was killed mid-way")
        messages: list[str] = []  # the same command again, here (nothing of the killed one lives)
        again = self.extract("photos", say=messages.append, cache=str(cache), overwrite=False,
                             precision="bf16" if self.cuda else "fp32")
        if not any("resuming" in m for m in messages):
            raise CheckFailed(f"the second run did not resume: {messages}")
        same = all(np.array_equal(reference[k], again[k], equal_nan=True) for k in reference)
        if not same:
            diff = max(float(np.abs(reference[k] - again[k]).max()) for k in reference)
            raise CheckFailed(f"the resumed file differs from an uninterrupted run's (max "
                              f"difference {diff:g})")
        return (f"killed with SIGKILL after {done_before} chunk(s); resumed file identical to an "
                "uninterrupted run's", {"chunks_before_kill": done_before})

    # ------------------------------------------------------------------ 3. stage two
    def linear_gpu_vs_cpu(self) -> tuple[str, dict]:
        selections = {}
        for side, device in (("gpu", self.device), ("cpu", "cpu")):
            self.cli("train-linear", "--dataset", "shapes", "--loss", "role", "--lr", "1e-3,1e-4",
                     "--bsize", "8,16", "--epochs", "5", "--quiet", "--no-plots", "--device",
                     device, "--run-id", f"linear-{side}", "--backbone", self.sizes.features_tag,
                     "--overwrite")
            results = self.cache / "shapes" / "runs" / "role" / f"linear-{side}" / "results.json"
            selections[side] = json.loads(results.read_text())["selection"]
        gpu, cpu = selections["gpu"], selections["cpu"]
        diffs = {k: abs(float(gpu[k]) - float(cpu[k])) for k in ("val_map", "test_map")}
        numbers = {"gpu": {k: gpu[k] for k in ("lr", "batch_size", "val_map", "test_map")},
                   "cpu": {k: cpu[k] for k in ("lr", "batch_size", "val_map", "test_map")},
                   "difference": diffs, "tolerance": TOL_LINEAR_MAP}
        if (gpu["lr"], gpu["batch_size"]) != (cpu["lr"], cpu["batch_size"]) or max(diffs.values()) > TOL_LINEAR_MAP:
            raise CheckFailed(f"stage two on the GPU selected lr {gpu['lr']} bs {gpu['batch_size']} "
                              f"(val {gpu['val_map']:.3f}, test {gpu['test_map']:.3f}); on the CPU lr "
                              f"{cpu['lr']} bs {cpu['batch_size']} (val {cpu['val_map']:.3f}, test "
                              f"{cpu['test_map']:.3f}); tolerance {TOL_LINEAR_MAP} points")
        return (f"same selection; val/test mAP differ by {diffs['val_map']:.4f} / "
                f"{diffs['test_map']:.4f} points (tolerance {TOL_LINEAR_MAP})", numbers)

    # ------------------------------------------------------------------ 4. fine-tuning
    def shapes_linear_run(self) -> tuple[str, dict]:
        """Features of shapes (fp32, PIL) and a linear ROLE run: what LinearInit starts from.
        PIL, as fine-tuning decodes: LinearInit's first evaluation must equal the head's."""
        self.extract("shapes", precision="fp32", gpu_decode=False)
        self.cli("train-linear", "--dataset", "shapes", "--loss", "role", "--lr", "1e-3",
                 "--bsize", "8", "--epochs", "3", "--quiet", "--no-plots", "--device", "cpu",
                 "--run-id", "linear", "--backbone", self.sizes.features_tag, "--overwrite")
        return "shapes features (fp32) and a linear role run", {}

    def linearinit_first_eval(self) -> tuple[str, dict]:
        from featcache.finetune.data import load_finetune_data
        from featcache.finetune.loop import ConfigTrainer
        from featcache.finetune.options import FinetuneOptions
        from featcache.finetune.plan import FinetunePlan
        from featcache.finetune.run import loss_params
        from featcache.finetune.start import resolve_start
        from featcache.metrics import mean_average_precision
        from featcache.protocol.grid import GridPoint
        from featcache.runtime import backend_flags, single_process

        job = single_process(torch.device(self.device))
        data = load_finetune_data(self.cache / "shapes" / "labels.h5")
        start = resolve_start(FinetuneOptions(dataset="shapes", loss="role", init="best",
                                              cache=str(self.cache)), data, job)
        settings = FinetunePlan(loss="role", params=loss_params("role", start.params, data), epochs=1,
                            precision="fp32", workers=self.sizes.workers, progress=False,
                            eval_batch_size=self.sizes.batch_size)
        trainer = ConfigTrainer(GridPoint(1e-4, self.sizes.finetune_batch), settings, start, data,
                                job)
        with backend_flags(job.device, "fp32"):
            network = trainer.predict(data.val).cpu()
        features = read_features(self.cache / "shapes" / f"features-{self.sizes.features_tag}.h5")
        features = features["train"]
        val_features = torch.from_numpy(features[data.labels.val_index]).float()
        head = torch.sigmoid(val_features @ start.head_weight.t() + start.head_bias)
        gap = float((network - head).abs().max())
        targets = data.val.clean
        maps = (float(mean_average_precision(network, targets)),
                float(mean_average_precision(head, targets)))
        numbers = {"max_abs_probability_difference": gap, "tolerance": TOL_LINEARINIT,
                   "val_map_network": maps[0], "val_map_linear_head": maps[1]}
        if not gap <= TOL_LINEARINIT:
            raise CheckFailed(f"LinearInit's first evaluation differs from the linear head by up "
                              f"to {gap:.2e} in probability (tolerance {TOL_LINEARINIT}); val mAP "
                              f"{maps[0]:.4f} vs {maps[1]:.4f}")
        return (f"first evaluation = linear head: max |dp| {gap:.2e} (tolerance "
                f"{TOL_LINEARINIT}), val mAP {maps[0]:.4f} vs {maps[1]:.4f}", numbers)

    def finetune_args(self, run_id: str, *extra) -> list[str]:
        return ["finetune", "--dataset", "shapes", "--loss", "role", "--init", "best",
                "--epochs", "1", "--lr", "1e-4", "--bsize", str(self.sizes.finetune_batch),
                "--workers", str(self.sizes.workers), "--device", self.device, "--quiet",
                "--no-plots", "--run-id", run_id, "--overwrite", *extra]

    def results_of(self, run_id: str) -> dict:
        path = self.cache / "shapes" / "finetune" / "role" / run_id / "results.json"
        return json.loads(path.read_text())

    def finetune_bf16(self) -> tuple[str, dict]:
        self.cli(*self.finetune_args("bf16", "--precision", "bf16"))
        document = self.results_of("bf16")
        epoch = document["configs"][0]["epochs"][0]
        if not math.isfinite(epoch["train_loss"]) or document["machine"]["precision"] != "bf16":
            raise CheckFailed(f"bf16 epoch: loss {epoch['train_loss']}, precision "
                              f"{document['machine']['precision']}")
        return (f"one bf16 epoch: loss {epoch['train_loss']:.4f}, val {epoch['val_map']:.2f}, "
                f"{epoch['images_per_second']:.0f} train images/s",
                {"images_per_second": epoch["images_per_second"], "train_loss": epoch["train_loss"]})

    def finetune_compile(self) -> tuple[str, dict]:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        args = self.finetune_args("compiled", "--compile")
        args[args.index("--lr") + 1] = "1e-4,1e-5"
        self.cli(*args)
        configs = self.results_of("compiled")["configs"]
        seconds = [c["epochs"][0]["train_seconds"] + c["epochs"][0]["eval_seconds"] for c in configs]
        graphs = int(counters["stats"]["unique_graphs"])
        numbers = {"epoch_seconds": seconds, "compile_seconds_estimate": seconds[0] - seconds[1],
                   "unique_graphs": graphs}
        if not all(math.isfinite(c["epochs"][0]["train_loss"]) for c in configs):
            raise CheckFailed("a compiled epoch gave a non-finite loss")
        if seconds[1] > 0.5 * seconds[0] and seconds[0] > 30:
            raise CheckFailed(f"the second configuration took {seconds[1]:.0f} s against the "
                              f"first's {seconds[0]:.0f} s: it seems to have compiled again")
        return (f"two configurations: first epoch {seconds[0]:.1f} s (with compiling), second "
                f"{seconds[1]:.1f} s; compile cost about {seconds[0] - seconds[1]:.0f} s once; "
                f"{graphs} graphs in all", numbers)

    def finetune_resume(self) -> tuple[str, dict]:
        args = self.finetune_args("whole", "--deterministic")
        args[args.index("--epochs") + 1] = "2"
        if self.cuda:  # a process of its own: cuBLAS must start with CUBLAS_WORKSPACE_CONFIG set
            self.subprocess(self.command(*args), timeout=400)
        else:
            self.cli(*args)
        cut = list(args)
        cut[cut.index("--run-id") + 1] = "cut"
        checkpoint = (self.cache / "shapes" / "finetune" / "role" / "cut" / "configs" /
                      f"lr0.0001-bs{self.sizes.finetune_batch}" / "checkpoint.pt")
        shutil.rmtree(checkpoint.parents[2], ignore_errors=True)
        self.kill_when(self.command(*cut), checkpoint.is_file, timeout=400)
        resumed = [a for a in cut if a != "--overwrite"] + ["--resume"]
        if self.cuda:
            self.subprocess(self.command(*resumed), timeout=400)
        else:
            self.cli(*resumed)
        whole, again = (strip_timings(self.results_of(r)) for r in ("whole", "cut"))
        if whole != again:
            raise CheckFailed(f"the resumed run differs from the uninterrupted one: "
                              f"{json.dumps(again)[:300]} vs {json.dumps(whole)[:300]}")
        models = [torch.load(self.cache / "shapes" / "finetune" / "role" / r / "best.pt",
                             weights_only=True)["model"] for r in ("whole", "cut")]
        different = [k for k, v in models[0].items() if not torch.equal(v, models[1][k])]
        if different:
            raise CheckFailed(f"best.pt weights differ after resuming: {different[:5]}")
        return "killed with SIGKILL after epoch 1, resumed: results and weights identical", {}

    def test_scores_kept(self) -> tuple[str, dict]:
        """The test scores a run keeps (test-scores.h5, on the device it ran on) give its
        recorded per-class test AP, and its results.json holds the interval."""
        from featcache.metrics import average_precision

        runs = {"linear": self.cache / "shapes" / "runs" / "role" / "linear",
                "fine-tuned": self.cache / "shapes" / "finetune" / "role" / "whole"}
        if self.passed("stage two: GPU vs CPU"):
            runs["linear on the GPU"] = self.cache / "shapes" / "runs" / "role" / "linear-gpu"
        numbers = {}
        for name, folder in runs.items():
            document = json.loads((folder / "results.json").read_text())
            with h5py.File(folder / "test-scores.h5", "r") as h5:
                seeds, scores = h5["seeds"][()].tolist(), h5["scores"][()]
                targets = torch.from_numpy(h5["targets"][()].astype(np.float32))
            best = scores[seeds.index(document["selection"].get("seed", seeds[0]))]
            ap = average_precision(torch.from_numpy(best), targets).numpy() * 100
            recorded = np.array(list(document["selection"]["test_ap_per_class"].values()))
            gap = float(np.abs(ap - recorded).max())
            interval = (document.get("uncertainty") or {}).get("test_map")
            numbers[name] = {"max_per_class_ap_gap": gap, "interval": interval,
                             "notes": [n for n in document["notes"] if "test-scores" in n]}
            if not gap <= TOL_SCORES or interval is None:
                raise CheckFailed(f"{name}: its test-scores.h5 gives per-class test AP up to "
                                  f"{gap:.2e} points from the recorded one (tolerance "
                                  f"{TOL_SCORES}), interval {interval}")
        return ("test-scores.h5 gives the recorded per-class test AP: " + ", ".join(
            f"{name} {n['max_per_class_ap_gap']:.1e}" for name, n in numbers.items()), numbers)

    def finetune_torchrun(self) -> tuple[str, dict]:
        gpus = torch.cuda.device_count()
        checked = {}
        for nproc in ([1, 2] if gpus >= 2 else [1]):
            run_id = f"torchrun{nproc}"
            args = self.finetune_args(run_id, "--deterministic")
            args[args.index("--epochs") + 1] = "2"
            if nproc == 2:
                args[args.index("--lr") + 1] = "1e-4,1e-5"
                args += ["--schedule", "per-gpu"]
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", str(nproc), "-m", "featcache", *args, "--cache",
                    str(self.cache)]
            self.subprocess(argv, timeout=400)
            document = self.results_of(run_id)
            if document["machine"]["world_size"] != nproc:
                raise CheckFailed(f"torchrun {nproc}: world size {document['machine']['world_size']}")
            checked[nproc] = document["selection"]["val_map"]
        if strip_timings(self.results_of("torchrun1")) != strip_timings(self.results_of("whole")):
            raise CheckFailed("torchrun --nproc_per_node 1 differs from the plain run")
        if 2 in checked:
            first = strip_timings(self.results_of("torchrun2"))[0][0]
            if first != strip_timings(self.results_of("whole"))[0][0]:
                raise CheckFailed("torchrun 2, per-gpu: the lr 1e-4 configuration differs from "
                                  "the one-process run")
        return (f"torchrun --nproc_per_node {', '.join(map(str, checked))}: finished; 1 rank = "
                "the plain run" + ("; 2 ranks per-gpu = one-process configurations" if 2 in checked
                                   else f" ({gpus} GPU visible: 2 ranks not run)"), checked)

    # ------------------------------------------------------------------ 5. benchmarks
    def bench_extract(self, size: int) -> tuple[str, dict]:
        """``benchmarks.extract --gpu-decode`` at ``size`` px in its honest windows (3 batches
        per worker, a drained queue); the plain loop at 448 px only."""
        from benchmarks import extract

        argv = ["--device", self.device, "--gpu-decode", "--image-size", str(size), "--out",
                str(self.out / f"bench-extract-{size}.json"), "--data-root", str(self.out / "bench")]
        document = extract.main(argv + ([] if size == 448 else ["--skip-baseline"]))
        ratios = dict(document["ratio"], **{"end to end, baseline": 1.0})
        rows = [[what, figure["images_per_s"], ratios.get(what)]
                for what, figure in document["figures"].items()]
        windows = {what: figure.get("window") for what, figure in document["figures"].items()}
        return "; ".join(f"{what} {rate:.0f} img/s" for what, rate, _ in rows), {
            "rows": rows, "settings": document["settings"], "windows": windows,
            "timed_batches": document["timed_batches"]}

    def decoder_choice(self) -> tuple[str, dict]:
        """The default decoder from the two extraction benchmarks (benchmarks.decoder_choice)."""
        from benchmarks.decoder_choice import decide

        def rates(name: str) -> dict[str, float] | None:
            if not self.passed(name):
                return None
            return {what: rate for what, rate, _ in self.numbers(name)["rows"]}

        at224 = rates("benchmark: extraction 224 px")
        assert at224 is not None  # run() checks its needs
        decision = decide(at224, rates("benchmark: extraction 448 px"),
                          self.passed("extraction: --gpu-decode vs PIL"))
        return f"{decision['line']}. {decision['target']['line']}", decision

    def bench_finetune(self) -> tuple[str, dict]:
        from benchmarks import finetune

        document = finetune.main(["--device", self.device, "--bsize", "16,64", "--warmup", "5",
                                  "--out", str(self.out / "bench-finetune.json"),
                                  "--data-root", str(self.out / "bench")])
        rows = []
        for figure in document["figures"]:
            batch = f"batch {figure['batch_size']}"
            for what, result in figure["ours"].items():
                rows.append([f"{batch}, {what}, ours", result["images_per_s"],
                             figure["ratio"] if what == "end to end" else None])
            if figure["baseline"]:
                rows.append([f"{batch}, end to end, baseline", figure["baseline"]["images_per_s"], 1.0])
        first = document["figures"][0]["ours"]["compute only"]["first_step_seconds"]
        return "; ".join(f"{what} {rate:.0f} img/s" for what, rate, _ in rows), {
            "rows": rows, "first_step_seconds": first, "settings": document["settings"]}

    # ------------------------------------------------------------------ all
    def run_all(self) -> None:
        self.run("data", self.make_data)
        self.run("extraction: bf16 vs fp32", self.bf16_vs_fp32, needs=("data",))
        self.run("extraction: --gpu-decode vs PIL", self.gpu_decode_vs_pil, needs=("data",))
        self.run("extraction: SIGKILL and resume", self.extraction_resume, needs=("data",))
        self.run("linear run for LinearInit", self.shapes_linear_run, needs=("data",))
        self.run("stage two: GPU vs CPU", self.linear_gpu_vs_cpu, needs_cuda=True,
                 needs=("linear run for LinearInit",))
        self.run("stage two: CUDA graphs vs eager", lambda: linear_checks.graphs_vs_eager(self),
                 needs_cuda=True, needs=("linear run for LinearInit",), takes=40)
        self.run("stage two: stacked vs alone", lambda: linear_checks.stacked_vs_alone(self),
                 needs_cuda=True, needs=("linear run for LinearInit",), takes=60)
        self.run("stage two: capture failure and device",
                 lambda: linear_checks.capture_failure_and_device(self), needs_cuda=True,
                 needs=("linear run for LinearInit",), takes=20)
        self.run("stage two: CPU workers after CUDA", lambda: linear_checks.cpu_after_cuda(self),
                 needs_cuda=True, needs=("linear run for LinearInit",), takes=30)
        self.run("fine-tune: LinearInit first eval", self.linearinit_first_eval,
                 needs=("linear run for LinearInit",))
        self.run("fine-tune: bf16 epoch", self.finetune_bf16, needs_cuda=True,
                 needs=("linear run for LinearInit",))
        self.run("fine-tune: SIGKILL and resume", self.finetune_resume,
                 needs=("linear run for LinearInit",))
        self.run("test scores kept", self.test_scores_kept,
                 needs=("linear run for LinearInit", "fine-tune: SIGKILL and resume"))
        self.run("fine-tune: torchrun", self.finetune_torchrun, needs_cuda=True,
                 needs=("fine-tune: SIGKILL and resume",))
        self.run("fine-tune: --compile", self.finetune_compile, needs_cuda=True,
                 needs=("linear run for LinearInit",), takes=150)
        # the benchmarks last, in honest windows (H200, 2026-11-26: --compile took 70 s)
        self.run("benchmark: extraction 224 px", lambda: self.bench_extract(224), needs_cuda=True,
                 takes=60)
        self.run("benchmark: extraction 448 px", lambda: self.bench_extract(448), needs_cuda=True,
                 takes=90)
        self.run("decoder choice", self.decoder_choice, needs_cuda=True,
                 needs=("benchmark: extraction 224 px",))
        self.run("benchmark: fine-tuning", self.bench_finetune, needs_cuda=True, takes=80)
        self.run("benchmark: stage two", lambda: linear_checks.timing_rows(self), needs_cuda=True,
                 takes=linear_checks.TIMING_LEAST)

    def report(self) -> dict:
        from benchmarks._common import machine

        failed = [r.name for r in self.results if r.status == "fail"]
        return {
            "check": "gpu-check", "cuda": self.cuda, "machine": machine(self.device),
            "seconds": time.perf_counter() - self.started, "passed": not failed, "failed": failed,
            "tolerances": {"bf16_vs_fp32": TOL_BF16, "decode_pixels": TOL_DECODE_PIXELS,
                           "decode_features": TOL_DECODE, "linear_map_points": TOL_LINEAR_MAP,
                           "linearinit_probability": TOL_LINEARINIT},
            "sizes": self.sizes.__dict__,
            "results": [r.__dict__ for r in self.results],
        }


def read_features(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as h5:
        return {split: h5[f"{split}/features"][()] for split in ("train", "test")}


def relative_errors(a: dict, b: dict) -> np.ndarray:
    """Per row, ||b - a|| / ||a|| over every split."""
    x = np.concatenate([a["train"], a["test"]]).astype(np.float64)
    y = np.concatenate([b["train"], b["test"]]).astype(np.float64)
    return np.linalg.norm(y - x, axis=1) / np.maximum(np.linalg.norm(x, axis=1), 1e-12)


def strip_timings(document: dict) -> tuple:
    """(per-configuration records without timings, selection): what must match exactly."""
    configs = json.loads(json.dumps(document["configs"]))
    for config in configs:
        config.pop("seconds", None)
        for epoch in config["epochs"]:
            for key in ("train_seconds", "eval_seconds", "images_per_second"):
                epoch.pop(key, None)
    return configs, document["selection"]


def markdown(report: dict) -> str:
    """The summary: one line per check, then the benchmark table."""
    from featcache.tables import Table

    machine = report["machine"]
    lines = [f"# gpu-check: {'PASSED' if report['passed'] else 'FAILED'}", "",
             f"{machine.get('gpu', 'no GPU (CPU-able parts only)')}, torch {machine['torch']}, "
             f"{machine['date']}, {report['seconds']:.0f} s; {machine['load']}", ""]
    table = Table(["check", "status", "seconds", "detail"])
    for r in report["results"]:
        table.add(r["name"], r["status"], r["seconds"], r["detail"])
    lines += [table.markdown(), ""]
    bench = Table(["benchmark", "what", "images/s", "vs baseline"],
                  title="Images/s against the plain-loop baselines (same run)")
    for r in report["results"]:
        if r["name"].startswith("benchmark") and r["status"] == "pass":
            for what, rate, ratio in r["numbers"]["rows"]:
                bench.add(r["name"].split(": ")[1], what, rate, ratio)
    if bench.rows:
        lines += [bench.markdown(), ""]
    lines += [f"Decoder choice: {r['detail']}" for r in report["results"]
              if r["name"] == "decoder choice" and r["status"] == "pass"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="cache/gpu-check", help="report folder (default cache/gpu-check)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data and runs")
    parser.add_argument("--cpu-only", action="store_true",
                        help="run only the parts that need no GPU, even on a GPU machine (CI)")
    parser.add_argument("--only", action="append", default=[], metavar="PREFIX",
                        help="run only the checks whose names start with PREFIX (repeatable; "
                             "the data and the linear run they start from always run), e.g. "
                             "--only 'stage two'")
    parser.add_argument("--budget", type=float, default=450,
                        help="seconds: a long check is not started when it could overrun them "
                             "(it is reported as failed, not run); default 450: the whole "
                             "command stays under 8 minutes")
    args = parser.parse_args(argv)
    # the benchmarks it runs append no rows of their own: the whole folder's are added at the
    # end, under this command (benchmarks.record)
    record_to = os.environ.pop(record.RECORD_ENV, None)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.cpu_only
    if not cuda:
        why = "--cpu-only" if args.cpu_only else "no CUDA GPU on this machine"
        print(f"gpu-check: {why}; running only the parts that need none (tiny sizes on the CPU)",
              flush=True)
    from featcache.fileio import write_json_atomic, write_text_atomic

    def write_report() -> dict:
        report = {**check.report(), "command": record.command_line("gpu_check", argv)}
        write_json_atomic(out / "gpu-check.json", report)
        write_text_atomic(out / "gpu-check.md", markdown(report))
        return report

    check = GpuCheck(out, cuda, say=lambda line: print(line, flush=True), budget=args.budget,
                     on_result=write_report, only=tuple(args.only))
    try:
        check.run_all()
    finally:
        report = write_report()
        if not args.keep:
            for leftover in ("cache", "resume-cache", "photos", "bench"):
                shutil.rmtree(out / leftover, ignore_errors=True)
    print(markdown(report), flush=True)
    print(f"report: {out / 'gpu-check.json'}, {out / 'gpu-check.md'}", flush=True)
    if record_to:
        os.environ[record.RECORD_ENV] = record_to
        record.keep_folder(out, report["command"])
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
