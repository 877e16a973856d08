"""How fast ``train-linear --loss all`` could be on this machine: the floor of its kernels.

``--loss all`` trains the stacked groups that :func:`featcache.linear.engine.search.stacked_plan`
makes of every loss the data can serve (VOC-sized features, the default 8 x 25 search). Any
implementation that keeps the protocol's numbers must, for every group, every epoch and every
training step, compute the batch's logits for all the group's heads and the weight gradient
(two matmuls), and update every weight with Adam (every weight moves each step: Adam's moments
are dense even where the gradient is low-rank); and every epoch it must score the validation
and test rows with every head (every epoch's validation mAP picks the epoch, and every epoch's
test mAP is recorded). Nothing else is timed here: no loss terms, no bookkeeping, no Python per
loss, no I/O, no process start, no plots. So the figures are a lower bound for the whole command:

- **kernels**: each of those operations timed at the group's real shape, the fastest of two
  layouts (per-head batched matmuls, as the trainer runs them, and one wide matmul over all
  heads, whatever its bits), Adam as one fused call over the whole group (one learning rate:
  fewer calls than the trainer may make). Timed on every usable core at once, one thread each
  (as the search's workers run), so the cores share the memory bus and cache as they do in a
  run; the floor assumes a perfect split of the groups over the cores.
- **arithmetic**: the same matmuls' floating-point operations at this machine's sgemm peak
  (a 2048 x 2048 float32 matmul on every core at once): the bound with perfect kernels and
  no optimizer at all.

``--command`` also runs the whole ``featcache train-linear --loss all`` as a user does
(``benchmarks.linear``'s ``--all-losses`` row), so floor and command are measured in one run;
``--target`` (default 120 s: issue 35's 2-core CPU target) is printed beside them.

    python -m benchmarks.linear_floor                  # about 2 minutes on 2 cores
    python -m benchmarks.linear_floor --command        # + the whole command (about 12 min)
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from benchmarks import record
from benchmarks._common import Busy, describe, machine, save
from benchmarks.linear import measure_all_losses, results_table, sgemm_peak, synthetic_dataset
from benchmarks.linear_kernels import per_call_us
from featcache.errors import plural
from featcache.linear.data import load_linear_data
from featcache.linear.engine.search import SearchSpec, stacked_plan
from featcache.protocol.loss_choice import choose_losses
from featcache.runtime import usable_cpus
from featcache.tables import Table


@dataclass(frozen=True)
class GroupShape:
    """One stacked group of the plan, as its kernels see it."""

    losses: int
    heads: int
    batch_size: int
    steps: int  # training steps per epoch
    epochs: int
    eval_rows: int  # validation and test rows scored each epoch


def plan_shapes(data, loss: str = "all") -> tuple[list[str], list[GroupShape]]:
    """The losses ``--loss LOSS`` (default all) trains on ``data`` and the shape of each of its
    groups."""
    losses, _ = choose_losses(loss, data.facts)
    groups = stacked_plan(data, [SearchSpec(loss=name) for name in losses])
    return losses, [GroupShape(len(g.members), g.heads, g.batch_size,
                               len(g.data.train) // g.batch_size, g.epochs,
                               len(g.data.val) + len(g.data.test)) for g in groups]


def step_kernels(train: torch.Tensor, heads: int, batch: int, classes: int, calls: int,
                 repeats: int) -> dict[str, float]:
    """Microseconds of each kernel of one training step of ``heads`` heads at ``batch``."""
    dim = train.shape[1]
    generator = torch.Generator().manual_seed(0)
    index = torch.randperm(train.shape[0], generator=generator)[:batch]
    x = train.index_select(0, index)
    weight = torch.randn(heads, dim, classes, generator=generator) * 0.01
    wide = weight.permute(1, 0, 2).reshape(dim, heads * classes).contiguous()
    grad_out = torch.randn(heads, batch, classes, generator=generator)
    grad_wide = grad_out.permute(1, 0, 2).reshape(batch, heads * classes).contiguous()
    params = [weight, torch.zeros(heads, 1, classes)]
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    moments = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    count = torch.zeros(())

    def adam() -> None:
        count.add_(1.0)
        torch._fused_adam_(params, grads, moments[0], moments[1], [], [count, count], lr=1e-3,
                           beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                           maximize=False)

    out = {
        "gather": per_call_us(lambda: train.index_select(0, index), calls, repeats),
        "forward, per-head bmm": per_call_us(
            lambda: torch.bmm(x.expand(heads, -1, -1), weight), calls, repeats),
        "forward, one wide mm": per_call_us(lambda: x @ wide, calls, repeats),
        "gradient, per-head bmm": per_call_us(
            lambda: torch.bmm(x.t().expand(heads, -1, -1), grad_out), calls, repeats),
        "gradient, one wide mm": per_call_us(lambda: x.t() @ grad_wide, calls, repeats),
        "adam, one fused call": per_call_us(adam, calls, repeats),
    }
    out["step"] = (out["gather"] + min(out["forward, per-head bmm"], out["forward, one wide mm"])
                   + min(out["gradient, per-head bmm"], out["gradient, one wide mm"])
                   + out["adam, one fused call"])
    return out


def scoring_us(rows: torch.Tensor, heads: int, classes: int, repeats: int) -> float:
    """Microseconds to score ``rows`` with ``heads`` heads (one wide matmul)."""
    wide = torch.randn(rows.shape[1], heads * classes) * 0.01
    return per_call_us(lambda: rows @ wide, 1, repeats)


def _measure(job: tuple) -> dict:
    """One core's timings of every distinct shape (run on every core at once)."""
    labels_path, features_path, shapes, calls, repeats = job
    torch.set_num_threads(1)  # as each of the search's worker processes
    data = load_linear_data(labels_path, features_path)
    train = data.train.features
    rows = torch.cat([data.val.features, data.test.features])
    steps = {(h, b): step_kernels(train, h, b, data.num_classes, calls, repeats)
             for h, b in sorted({(s.heads, s.batch_size) for s in shapes})}
    scores = {h: scoring_us(rows, h, data.num_classes, repeats)
              for h in sorted({s.heads for s in shapes})}
    return {"steps": steps, "scores": scores, "sgemm_gflops": sgemm_peak(repeat=6)}


def measure(labels_path, features_path, shapes: Sequence[GroupShape], cores: int, calls: int,
            repeats: int) -> list[dict]:
    """Each core's timings, all cores timing at once (so they share the memory bus); one core
    times here."""
    job = (labels_path, features_path, list(shapes), calls, repeats)
    if cores == 1:
        threads = torch.get_num_threads()
        try:
            return [_measure(job)]
        finally:
            torch.set_num_threads(threads)
    with multiprocessing.get_context("spawn").Pool(cores) as pool:
        return pool.map(_measure, [job] * cores)


def floors(shapes: Sequence[GroupShape], timings: list[dict], cores: int,
           classes: int, dim: int) -> dict:
    """The kernel floor and the arithmetic floor of the plan, in seconds on ``cores`` cores."""
    def mean(pick: Callable[[dict], float]) -> float:
        return statistics.fmean(pick(t) for t in timings)

    kernel_cpu = training_flop = scoring_flop = 0.0
    per_group = []
    for s in shapes:
        step = mean(lambda t, s=s: t["steps"][(s.heads, s.batch_size)]["step"])
        score = mean(lambda t, s=s: t["scores"][s.heads])
        cpu = s.epochs * (s.steps * step + score) / 1e6
        kernel_cpu += cpu
        training_flop += s.epochs * s.steps * 2 * (2 * s.batch_size * dim * classes * s.heads)
        scoring_flop += s.epochs * 2 * s.eval_rows * dim * classes * s.heads
        per_group.append({**asdict(s), "step_us": step, "scoring_us": score, "cpu_seconds": cpu})
    peak = sum(t["sgemm_gflops"] for t in timings) / len(timings) * cores
    return {"groups": per_group, "kernel_cpu_seconds": kernel_cpu,
            "kernel_floor_seconds": kernel_cpu / cores,
            "training_gflop": training_flop / 1e9, "scoring_gflop": scoring_flop / 1e9,
            "peak_gflops": peak,
            "arithmetic_floor_seconds": (training_flop + scoring_flop) / peak / 1e9}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="calls per timing of a step kernel")
    parser.add_argument("--repeats", type=int, default=3, help="timings per kernel (median)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="cores timed at once and shared by the floor (default: all usable)")
    parser.add_argument("--target", type=float, default=120.0,
                        help="the target for --loss all, in seconds (printed beside the floors)")
    parser.add_argument("--command", action="store_true",
                        help="also run the whole `featcache train-linear --loss all` (minutes)")
    parser.add_argument("--loss", default="all",
                        help="the losses of the floor and of the command (default all; e.g. an)")
    args = parser.parse_args(argv)
    cores = args.jobs or usable_cpus()
    info = machine("cpu")
    labels_path, features_path, source = synthetic_dataset("voc")
    data = load_linear_data(labels_path, features_path)
    losses, shapes = plan_shapes(data, args.loss)
    print(f"machine: {describe(info)}; data: voc-sized ({source}); --loss {args.loss}: {len(losses)} "
          f"losses in {len(shapes)} groups, {sum(s.heads for s in shapes)} heads", flush=True)
    with Busy() as busy:
        timings = measure(labels_path, features_path, shapes, cores, args.calls, args.repeats)
    found = floors(shapes, timings, cores, data.num_classes, data.feature_dim)
    one_core = timings[0]["steps"]  # (heads, batch) -> microseconds of each kernel
    print(f"  timed in {busy.seconds:.0f} s; {busy.note()}", flush=True)
    on = plural(cores, "core")
    table = Table(["what", "seconds"], formats={"seconds": "{:.0f}"})
    if args.loss == "all":
        table.add(f"target for --loss all ({on})", args.target)
    table.add(f"arithmetic floor: {found['training_gflop'] + found['scoring_gflop']:,.0f} GFLOP "
              f"of matmuls at the sgemm peak ({found['peak_gflops']:.0f} GFLOP/s, {on})",
              found["arithmetic_floor_seconds"])
    table.add(f"kernel floor: forward, gradient, fused Adam, scoring, nothing else ({on}, "
              f"{found['kernel_cpu_seconds']:.0f} CPU-s)", found["kernel_floor_seconds"])
    document = {"benchmark": "linear_floor", "command": record.command_line("linear_floor", argv),
                "machine": info, "labels": source,
                "loss": args.loss, "losses": losses, "cores": cores,
                "target_seconds": args.target,
                "timing_busy": busy.record(), **found,
                "kernels": [{"heads": h, "batch_size": b, **v} for (h, b), v in one_core.items()]}
    if args.command:
        command_args = argparse.Namespace(device="cpu", jobs=args.jobs, command_baseline=None)
        whole = measure_all_losses(command_args, "cpu", labels_path, results_table(), args.loss)
        document["whole_command"] = whole
        cpu = whole["versions"]["this checkout"]["cpu_seconds"]
        table.add(f"the whole command, featcache train-linear --loss {args.loss} ({on}, "
                  f"{cpu:.0f} CPU-s)", whole["all_losses_seconds"])
        document["times_kernel_floor"] = whole["all_losses_seconds"] / found["kernel_floor_seconds"]
        print(f"  the whole command: {document['times_kernel_floor']:.2f}x the kernel floor; "
              f"{cpu / found['kernel_cpu_seconds']:.2f}x in CPU-seconds", flush=True)
    kernels = Table(["heads", "batch", *next(iter(one_core.values()))], float_format="{:.0f}")
    for (heads, batch), values in one_core.items():
        kernels.add(heads, batch, *values.values())
    print("microseconds per call, one core's timings:")
    print(kernels.markdown())
    print(table.markdown())
    document["table"] = table.records()
    path = save("linear-floor-cpu", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
