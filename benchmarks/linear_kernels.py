"""Stage two's per-step kernels, and the alternatives that would give the same bits.

A stage-two training step at batch size B moves a group's H heads (H, D, L) through two
batched matmuls (the logits, then the weight gradient) and Adam; an epoch's evaluation
scores the validation and test rows with every head. This times each kernel as the trainer
runs it (``featcache.heads``, ``featcache.linear.engine.optimizer``) next to alternatives, and
checks whether an alternative gives exactly the trainer's bits (``torch.equal`` over several
batches of the benchmark's VOC-sized features: a BLAS kernel's summation order depends on the shapes, not the values).
An alternative that is faster *and* gives the same bits could replace the trainer's kernel
without moving any number; one that is faster with other bits could not.

- forward: ``bmm(x expanded, W (H, D, L))`` against one ``mm`` of ``x`` with the heads stored
  (H, L, D) (``nn.Linear``'s layout, one (H L, D) matrix, transposed view);
- weight gradient: ``bmm(x^T expanded, g (H, B, L))`` against the (H, L, D) layout's ``mm`` and
  ``bmm`` (the layout Adam would then update);
- Adam: one fused call per head (as the trainer makes them; timing only, for scale);
- scoring: the test rows against one epoch's heads (D, H L), and against 4 epochs' at once;
- a whole group of the default search trained (25 epochs, no evaluation) alone on one thread:
  what a worker spends on it, per step.

    python -m benchmarks.linear_kernels            # figures in cache/bench/linear-kernels-cpu.json
    python -m benchmarks.linear_kernels --repeats 3 --steps 200   # quicker, noisier
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks._common import describe, machine, save
from benchmarks.linear import synthetic_dataset
from featcache.linear.data import load_linear_data
from featcache.linear.engine.member import Member
from featcache.linear.engine.search import SearchSpec
from featcache.linear.engine.trainer import GroupTrainer
from featcache.losses import loss_class
from featcache.tables import Table

HEADS = 4
LEARNING_RATES = (1e-2, 1e-3, 1e-4, 1e-5)


def per_call_us(work: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean microseconds per call of ``calls`` calls."""
    for _ in range(max(1, calls // 10)):
        work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            work()
        times.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(times)


def same_bits(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return all(torch.equal(a, b) for a, b in pairs)


def step_kernels(features: torch.Tensor, classes: int, batch: int, steps: int,
                 repeats: int) -> list[dict]:
    """Forward, weight gradient and Adam at batch size ``batch``: one row per variant, each
    timed as it is checked (from a batch's rows and the loss's (H, B, L) gradient)."""
    rows, dim = features.shape
    generator = torch.Generator().manual_seed(batch)
    weight = torch.randn(HEADS, dim, classes, generator=generator) * dim ** -0.5
    wide = weight.transpose(1, 2).contiguous().view(HEADS * classes, dim)  # heads (H, L, D)
    batches = [features.index_select(0, torch.randint(0, rows, (batch,), generator=generator))
               for _ in range(8)]
    grads = [torch.randn(HEADS, batch, classes, generator=generator) * 1e-3 for _ in batches]

    def forward_now(x, g):
        return torch.bmm(x.expand(HEADS, -1, -1), weight)

    def forward_mm(x, g):
        return (x @ wide.t()).view(batch, HEADS, classes).permute(1, 0, 2)

    def grad_now(x, g):
        return torch.bmm(x.expand(HEADS, -1, -1).transpose(1, 2), g)

    def grad_mm(x, g):
        return torch.mm(g.transpose(1, 2).reshape(HEADS * classes, batch), x).view(
            HEADS, classes, dim).transpose(1, 2)

    def grad_bmm(x, g):
        return torch.bmm(g.transpose(1, 2), x.expand(HEADS, -1, -1)).transpose(1, 2)

    variants = [("forward", "bmm, heads (H, D, L)", forward_now, None),
                ("forward", "mm, heads (H, L, D)", forward_mm, forward_now),
                ("weight gradient", "bmm, heads (H, D, L)", grad_now, None),
                ("weight gradient", "mm, heads (H, L, D)", grad_mm, grad_now),
                ("weight gradient", "bmm, heads (H, L, D)", grad_bmm, grad_now)]
    x, g = batches[0], grads[0]
    out = []
    for kernel, variant, run, trainers in variants:
        same = None if trainers is None else same_bits(
            [(trainers(b, d), run(b, d)) for b, d in zip(batches, grads, strict=True)])
        out.append(_row(batch, kernel, variant, per_call_us(lambda run=run: run(x, g), steps, repeats),
                        same))
    params = [torch.zeros(dim, classes) for _ in range(HEADS)]
    moments = [[torch.zeros(dim, classes) for _ in range(HEADS)] for _ in range(2)]
    gradient = grad_now(x, g).unbind(0)
    step = torch.ones(())

    def adam():
        for h, lr in enumerate(LEARNING_RATES):
            torch._fused_adam_([params[h]], [gradient[h]], [moments[0][h]], [moments[1][h]], [],
                               [step], lr=lr, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                               amsgrad=False, maximize=False)

    out.append(_row(batch, "Adam", f"fused, one call per head ({HEADS})",
                    per_call_us(adam, steps, repeats), None))
    return out


def scoring_kernels(features: torch.Tensor, classes: int, repeats: int) -> list[dict]:
    """Scoring the test rows with one epoch's heads, and with 4 epochs' at once."""
    dim = features.shape[1]
    generator = torch.Generator().manual_seed(0)
    one = torch.randn(dim, HEADS * classes, generator=generator) * dim ** -0.5
    four = torch.cat([one] + [torch.randn(dim, HEADS * classes, generator=generator) * dim ** -0.5
                              for _ in range(3)], dim=1)
    same = torch.equal((features @ four)[:, :HEADS * classes], features @ one)
    rows = features.shape[0]
    return [
        _row(rows, "scoring", "(N, D) x (D, H L), one epoch",
             per_call_us(lambda: features @ one, 3, repeats), None),
        _row(rows, "scoring", "(N, D) x (D, 4 H L), per epoch",
             per_call_us(lambda: features @ four, 3, repeats) / 4, same),
    ]


def group_training(data, batch: int, loss: str = "an") -> list[dict]:
    """A whole group of the default search (``loss``'s 4 learning rates at ``batch``, 25
    epochs) trained without its evaluation (each epoch's steps and end,
    ``GroupTrainer.train_and_finish``), alone on one thread: the group's wall time, per
    training step."""
    spec = SearchSpec(loss=loss)
    data = loss_class(loss).fit_data(data)
    spec = spec.resolved(data.facts)
    configs = [c for c in spec.configs(spec.seeds[0]) if c.batch_size == batch]
    trainer = GroupTrainer(data, [Member(loss, tuple(configs))], spec.epochs, spec.val_variant,
                           spec.early_stop, torch.device("cpu"))
    started = time.perf_counter()
    for epoch in range(spec.epochs):
        trainer.train_and_finish(epoch)
    seconds = time.perf_counter() - started
    steps = trainer.steps * spec.epochs
    return [_row(batch, f"group training, {len(configs)} heads x {spec.epochs} epochs",
                 f"{steps} steps: {seconds:.2f} s", seconds / steps * 1e6, None)]


def _row(size: int, kernel: str, variant: str, us: float, same: bool | None) -> dict:
    return {"rows": size, "kernel": kernel, "variant": variant, "microseconds": us,
            "same_bits_as_trainer": same}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per kernel (median)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in each of the search's worker processes
    info = machine("cpu")
    labels_path, features_path, source = synthetic_dataset("voc")
    data = load_linear_data(labels_path, features_path)
    print(f"machine: {describe(info)}; data: voc-sized ({source}); one thread", flush=True)
    found = []
    for batch in args.batch_sizes:
        found += step_kernels(data.train.features, data.num_classes, batch, args.steps,
                              args.repeats)
    found += scoring_kernels(data.test.features, data.num_classes, args.repeats)
    for batch in args.batch_sizes:
        found += group_training(data, batch)
    table = Table(["rows", "kernel", "variant", "microseconds", "same bits as the trainer"],
                  formats={"microseconds": "{:.1f}"})
    for row in found:
        same = row["same_bits_as_trainer"]
        table.add(row["rows"], row["kernel"], row["variant"], row["microseconds"],
                  "(the trainer's)" if same is None else ("yes" if same else "no"))
    print(table.markdown())
    document = {"benchmark": "linear_kernels", "machine": info, "heads": HEADS,
                "kernels": found, "table": table.records()}
    path = save("linear-kernels-cpu", document)
    print(f"figures written to {path}")
    return document


if __name__ == "__main__":
    main()
