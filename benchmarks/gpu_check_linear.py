"""``make gpu-check``'s stage-two checks (:mod:`benchmarks.gpu_check` runs them).

- graphs vs eager: the same searches on CUDA with the steps replayed as CUDA graphs (many steps
  per graph, several groups at once, each loss's terms a branch of the step) and run step by
  step, one group at a time (``FEATCACHE_CUDA_GRAPHS=0``, ``FEATCACHE_CUDA_GROUPS=1``): the
  same selections, every epoch's mAP within :data:`TOL_STACKED_MAP`; and what the graphs did,
  per group: a graph captured once for every epoch (again each epoch for a scheduled loss),
  opml-sp's group step by step (its ``svdvals`` reads the host), no other group without graphs;
- stacked vs alone: every loss of a ``--loss all``-like pass (the groups a GPU trains) against
  each loss trained alone, on CUDA: the same selections and mAP within :data:`TOL_STACKED_MAP`
  (on the CPU they are equal bit for bit: ``tests/test_linear_stacked.py``);
- capture failure and device: a group whose capture fails (a step that reads the device while
  it is captured) says so once and trains step by step, with the numbers of a run without
  graphs; the thread is back on its stream, and the next group on the same device captures
  its graphs; every stream of the groups is on the run's device (the last GPU: ``cuda:N`` with
  N > 0 where there are several);
- CPU after CUDA: stage two on the CPU with worker processes in a process that trained on
  CUDA (forking there broke autograd; workers are not forked there any more);
- the timing rows: ``benchmarks.linear`` on CUDA, the default ``an`` search in the process
  (and without graphs, and one group at a time), the whole command, and ``--loss all``
  (targets: 1 s, 4 s and 20 s on one H100/H200).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from benchmarks._common import environment

#: stage two, graphs vs eager and stacked vs alone on CUDA: largest difference of an epoch's
#: validation or test mAP, in points (float rounding only)
TOL_STACKED_MAP = 1e-3
#: the losses of the equality checks: hand-written gradients and autograd, per-example state
#: trained beside the heads (role) and changed once an epoch (ll-cp, em-apl), a schedule (gr,
#: ll-cp), a step that cannot be captured (opml-sp)
LOSSES = ("an", "an-ls", "role", "ll-cp", "em-apl", "gr", "asl", "opml", "opml-sp")
#: epochs of the equality checks' searches
EPOCHS = 5
#: the timing targets on one H100/H200 (seconds): the default search, the whole command,
#: --loss all
TARGETS = {"search": 1.0, "command": 4.0, "all_losses": 20.0}


def _data(check, device: str):
    from featcache.linear.data import load_linear_data

    root = check.cache / "shapes"
    return load_linear_data(root / "labels.h5", root / f"features-{check.sizes.features_tag}.h5",
                            device=device)


def _specs(data, losses: Sequence[str]):
    from featcache.linear.engine.search import SearchSpec
    from featcache.losses import loss_class

    usable = [n for n in losses if loss_class(n).unmet_need(data.facts) is None]
    return [SearchSpec(loss=n, learning_rates=(1e-2, 1e-3), batch_sizes=(8, 16), epochs=EPOCHS)
            for n in usable]


def _selection_score(head, epoch: int) -> float:
    """What the selection compared for ``head`` at ``epoch``: its validation mAP (the clean
    one where the checks' data has it, as the searches' ``val_variant`` is "clean")."""
    record = head.epochs[epoch] if epoch < len(head.epochs) else None
    if record is None:
        return float("nan")
    return record.val_map if record.val_map is not None else record.val_map_observed


def compare_searches(ours, theirs) -> dict:
    """Two runs of the same searches, side by side: the largest difference of an epoch's
    validation or test mAP, per loss and over all; and every selection that differs, with the
    validation margin between the two choices in each run and whether it is a near-tie (in
    both runs the two choices are within :data:`TOL_STACKED_MAP` of each other, and no epoch's
    mAP differs by more: float rounding chose) or wrong numbers."""
    worst, per_loss, differing = 0.0, {}, []
    for a, b in zip(ours, theirs, strict=True):
        loss_worst = 0.0
        for seed_a, seed_b in zip(a.seeds, b.seeds, strict=True):
            for head_a, head_b in zip(seed_a.heads, seed_b.heads, strict=True):
                for ra, rb in zip(head_a.epochs, head_b.epochs, strict=True):
                    for key in ("val_map", "val_map_observed", "test_map"):
                        x, y = getattr(ra, key), getattr(rb, key)
                        if x is not None and y is not None:
                            loss_worst = max(loss_worst, abs(x - y))
            chosen_a, chosen_b = seed_a.selected, seed_b.selected
            if (chosen_a.config, chosen_a.best_epoch) == (chosen_b.config, chosen_b.best_epoch):
                continue
            index = {h.config: i for i, h in enumerate(seed_a.heads)}
            # each run's margin: its choice's score less the other run's choice's score in it
            in_a = seed_a.heads[index[chosen_b.config]]
            in_b = seed_b.heads[index[chosen_a.config]]
            margin_a = chosen_a.best_val - _selection_score(in_a, chosen_b.best_epoch)
            margin_b = chosen_b.best_val - _selection_score(in_b, chosen_a.best_epoch)
            differing.append({
                "loss": a.spec.loss, "seed": seed_a.seed,
                "ours": {"config": str(chosen_a.config), "epoch": chosen_a.best_epoch,
                         "val": chosen_a.best_val, "test": chosen_a.best.test_map,
                         "margin": margin_a},
                "theirs": {"config": str(chosen_b.config), "epoch": chosen_b.best_epoch,
                           "val": chosen_b.best_val, "test": chosen_b.best.test_map,
                           "margin": margin_b}})
        per_loss[a.spec.loss] = loss_worst
        worst = max(worst, loss_worst)
    for found in differing:
        close = max(found["ours"]["margin"], found["theirs"]["margin"]) <= TOL_STACKED_MAP
        found["kind"] = ("near-tie" if close and per_loss[found["loss"]] <= TOL_STACKED_MAP
                         else "wrong numbers")
    return {"largest_difference": worst, "per_loss": per_loss, "differing": differing,
            "tolerance": TOL_STACKED_MAP}


def _describe_differences(found: dict) -> str:
    """The selections that differ, in words (the detail of a check)."""
    parts = []
    for d in found["differing"]:
        ours, theirs = d["ours"], d["theirs"]
        parts.append(f"{d['loss']} ({d['kind']}): {ours['config']} epoch {ours['epoch']} "
                     f"(val {ours['val']:.4f}, by {ours['margin']:.5f}) and {theirs['config']} "
                     f"epoch {theirs['epoch']} (val {theirs['val']:.4f}, by "
                     f"{theirs['margin']:.5f}); its epochs' mAP within "
                     f"{found['per_loss'][d['loss']]:.5f}")
    return "; ".join(parts)


def _compare(ours, theirs, what: str) -> dict:
    """:func:`compare_searches`, failing the check (CheckFailed, from the caller's module)
    where an epoch's mAP differs by more than the tolerance or a selection differs other than
    by a near-tie; every difference is named."""
    from benchmarks.gpu_check import CheckFailed

    found = compare_searches(ours, theirs)
    wrong = [d for d in found["differing"] if d["kind"] != "near-tie"]
    if wrong or found["largest_difference"] > TOL_STACKED_MAP:
        over = {k: round(v, 6) for k, v in found["per_loss"].items() if v > TOL_STACKED_MAP}
        raise CheckFailed(f"{what}: largest epoch mAP difference "
                          f"{found['largest_difference']:.5f} points (tolerance "
                          f"{TOL_STACKED_MAP}; over it: {over or 'none'}); selections that "
                          f"differ: {_describe_differences(found) or 'none'}")
    return found


def _check_contained(said: list[str]) -> None:
    """Fail where a capture's error reached a group (the search went on, retraining it)."""
    from benchmarks.gpu_check import CheckFailed

    retrained = [line for line in said if RETRAINED in line]
    if retrained:
        raise CheckFailed(f"a capture's error reached {len(retrained)} group(s), trained again "
                          f"without graphs: {retrained[0]}")


@contextlib.contextmanager
def _graph_records() -> Iterator[list]:
    """Every group's graph bookkeeping (``GraphedSteps``) made while it is open."""
    from featcache.linear.engine import trainer

    made: list = []
    original = trainer.GraphedSteps

    class Recorded(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    trainer.GraphedSteps = Recorded
    try:
        yield made
    finally:
        trainer.GraphedSteps = original


@contextlib.contextmanager
def _engine_warnings() -> Iterator[list[str]]:
    """The warnings stage two's engine logs while it is open (a group without graphs, a group
    trained again after a capture's error reached it)."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("featcache.linear.engine")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


#: what the engine says when a capture's error reached a group's training (it trains the group
#: again without graphs: the numbers hold, but the containment of captures failed)
RETRAINED = "trained again from the start without CUDA graphs"


def _group_stats(made: list) -> list[dict]:
    return [{"group": g.describe, **g.stats()} for g in made]


def _check_groups(stats: list[dict], epochs: int) -> None:
    """Every group trained with graphs but those that cannot be captured (opml-sp's), a graph
    captured once for every epoch unless the group follows a schedule."""
    from benchmarks.gpu_check import CheckFailed

    for group in stats:
        uncapturable = "opml-sp" in group["group"]
        if uncapturable != (group["failed"] is not None):
            raise CheckFailed(f"{group['group']}: {group['failed'] or 'trained with graphs'} "
                              f"({'expected without' if uncapturable else 'expected with'} "
                              "graphs)")
        if not uncapturable and group["replays"] == 0:
            raise CheckFailed(f"{group['group']}: no graph was replayed ({group})")
        if group["captures"] > 3 + epochs:
            raise CheckFailed(f"{group['group']}: {group['captures']} captures in {epochs} epochs")


def graphs_vs_eager(check, data=None) -> tuple[str, dict]:
    from featcache.linear.engine.graphs import GRAPHS_ENV
    from featcache.linear.engine.search import run_searches
    from featcache.linear.engine.streams import LEASE
    from featcache.linear.engine.workers import CUDA_GROUPS_ENV

    data = data if data is not None else _data(check, "cuda")
    specs = _specs(data, LOSSES)
    device = data.train.observed.device
    started = time.perf_counter()
    with _graph_records() as made, _engine_warnings() as said, \
            environment(**{GRAPHS_ENV: "1"}):
        graphed = run_searches(data, specs, device, progress=False)
    middle = time.perf_counter()
    # the same groups (on CUDA the stacking keeps apart what cannot be captured, with graphs
    # or without), step by step, one at a time: only the graphs differ
    with environment(**{GRAPHS_ENV: "0", CUDA_GROUPS_ENV: "1"}):
        eager = run_searches(data, specs, device, progress=False)
    ended = time.perf_counter()
    stats = _group_stats(made)
    numbers = {"losses": [s.loss for s in specs], "groups": stats,
               "streams_most_held": LEASE.most_held, "warnings": said,
               "seconds": {"graphs": middle - started, "eager": ended - middle}}
    found = compare_searches(graphed, eager)
    numbers.update(found)
    check_numbers = getattr(check, "keep_numbers", None)
    if check_numbers is not None:  # the measured differences stay in the report on a failure
        check_numbers(numbers)
    _compare(graphed, eager, "graphs vs eager")
    _check_contained(said)
    _check_groups(stats, specs[0].epochs)
    captures = sum(g["captures"] for g in stats)
    ties = _describe_differences(found)
    return (f"{len(specs)} losses in {len(stats)} groups: "
            f"{'the same selections' if not ties else 'near-ties: ' + ties}, epoch mAP within "
            f"{found['largest_difference']:.5f} points; {captures} captures, "
            f"{sum(g['replays'] for g in stats)} replays; at most {LEASE.most_held} streams "
            f"held at once; graphs {middle - started:.1f} s, step by step "
            f"{ended - middle:.1f} s", numbers)


def stacked_vs_alone(check, data=None) -> tuple[str, dict]:
    from featcache.linear.engine.search import run_search, run_searches
    from featcache.losses import loss_names

    data = data if data is not None else _data(check, "cuda")
    device = data.train.observed.device
    specs = _specs(data, loss_names())
    started = time.perf_counter()
    with _engine_warnings() as said:
        together = run_searches(data, specs, device, progress=False)
        middle = time.perf_counter()
        alone = [run_search(data, spec, device, progress=False) for spec in specs]
    ended = time.perf_counter()
    found = compare_searches(together, alone)
    numbers = {"losses": [s.loss for s in specs], **found, "warnings": said,
               "seconds": {"together": middle - started, "alone": ended - middle}}
    check_numbers = getattr(check, "keep_numbers", None)
    if check_numbers is not None:
        check_numbers(numbers)
    _compare(together, alone, "stacked vs alone")
    _check_contained(said)
    ties = _describe_differences(found)
    return (f"{len(specs)} losses in one pass ({middle - started:.1f} s) and alone "
            f"({ended - middle:.1f} s): "
            f"{'the same selections' if not ties else 'near-ties: ' + ties}, epoch mAP within "
            f"{found['largest_difference']:.5f} points", numbers)


@contextlib.contextmanager
def _read_while_captured() -> Iterator[None]:
    """Each step being captured reads a value of the device (what a capture refuses)."""
    import torch

    from featcache.linear.engine.trainer import GroupTrainer

    original = GroupTrainer.device_step

    def step(self, epoch):
        if torch.cuda.is_current_stream_capturing():
            float(self.loss_sum.sum())
        return original(self, epoch)

    GroupTrainer.device_step = step
    try:
        yield
    finally:
        GroupTrainer.device_step = original


def capture_failure_and_device(check, data=None, provoke=_read_while_captured
                               ) -> tuple[str, dict]:
    """A capture that fails, then one that works, on the run's device (the last GPU)."""
    import torch

    from benchmarks.gpu_check import CheckFailed
    from featcache.linear.engine.graphs import GRAPHS_ENV
    from featcache.linear.engine.member import Member
    from featcache.linear.engine.search import SearchSpec
    from featcache.linear.engine.trainer import GroupTrainer

    cuda = data is None
    device = (torch.device("cuda", torch.cuda.device_count() - 1) if cuda
              else data.train.observed.device)
    data = data if data is not None else _data(check, str(device))
    spec = SearchSpec(loss="role", learning_rates=(1e-2, 1e-3), batch_sizes=(8,), epochs=3)
    member = Member("role", tuple(spec.resolved(data.facts).configs(0)))

    def train() -> tuple[GroupTrainer, list]:
        trainer = GroupTrainer(data, [member], spec.epochs, "clean", "none", device)
        return trainer, trainer.run(progress=False, position=0)[0]

    before = torch.cuda.current_device() if cuda else None
    with environment(**{GRAPHS_ENV: "0"}):
        _, eager = train()
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("featcache.linear.engine.graphs")
    logger.addHandler(handler)
    try:
        with provoke():
            failing, failed = train()
    finally:
        logger.removeHandler(handler)
    working, worked = train()
    problems = []
    why = failing.graphs.failed if failing.graphs is not None else "no graphs"
    if not str(why).startswith("its capture failed"):
        problems.append(f"the provoked group: {why}")
    said = [w for w in warnings if "without CUDA graphs" in w]
    if len(said) != 1:
        problems.append(f"{len(said)} warnings about it (one expected): {said}")
    stats = working.graphs.stats() if working.graphs is not None else {}
    if stats.get("failed") is not None or not stats.get("replays"):
        problems.append(f"the next group on the device: {stats}")
    if cuda:
        streams = [working.graphs.backend.stream, *(working.branches.streams or [])]
        wrong = [str(s.device) for s in streams if s.device != device]
        if wrong:
            problems.append(f"streams on {wrong}, the run is on {device}")
        if torch.cuda.current_device() != before:
            problems.append(f"the current device moved from {before} to "
                            f"{torch.cuda.current_device()}")
        if torch.cuda.current_stream(device) != torch.cuda.default_stream(device):
            problems.append("the thread is left on a side stream")
    largest = max(_largest_difference(a, b) for a, b in ((failed, eager), (worked, eager)))
    if largest > TOL_STACKED_MAP:
        problems.append(f"an epoch's mAP differs from a run without graphs by {largest:.5f}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"on {device}: the failed capture said once \"{why}\" and trained step by step; "
            f"the next group captured {stats['captures']} graphs; mAP within {largest:.5f} "
            "points of a run without graphs",
            {"device": str(device), "failed": why, "next_group": stats,
             "largest_difference": largest})


def _largest_difference(ours, theirs) -> float:
    return max(abs(getattr(ra, key) - getattr(rb, key))
               for a, b in zip(ours, theirs, strict=True)
               for ra, rb in zip(a.epochs, b.epochs, strict=True)
               for key in ("val_map", "val_map_observed", "test_map")
               if getattr(ra, key) is not None and getattr(rb, key) is not None)


def cpu_after_cuda(check) -> tuple[str, dict]:
    """Stage two with CPU worker processes in this process, which has trained on CUDA."""
    import torch

    from featcache.linear.engine.search import run_searches
    from featcache.linear.engine.workers import fork_is_safe

    if not torch.cuda.is_initialized():
        run_searches(_data(check, "cuda"), _specs(_data(check, "cuda"), ("an",)), "cuda",
                     progress=False)
    data = _data(check, "cpu")
    results = run_searches(data, _specs(data, ("an", "role")), "cpu", progress=False, jobs=2)
    return (f"trained on the CPU with --jobs 2 after CUDA (workers forked: {fork_is_safe()})",
            {"test_map": [r.selected.best.test_map for r in results]})


#: the timing rows' parts: each a ``benchmarks.linear`` run of its own with a time limit
#: (seconds, the process group stopped at it), its figures so far written as it goes, so that
#: the stage-two call of the gpu-check comes back in about 5 minutes on an H100/H200 whatever
#: happens (on 2026-11-28 the three in one process, graphs off, ran past 300 s and returned
#: nothing)
TIMING_PARTS = {
    "search": (["--no-command"], 50),
    "command": (["--no-search", "--command-repeat", "2"], 50),
    "all_losses": (["--no-search", "--no-command", "--all-losses"], 110),
}
#: seconds the --loss all part leaves after stopping the command (data, imports, writing)
ALL_LOSSES_MARGIN = 20
#: the least time the timing rows start with (their limits shrink to what the budget leaves)
TIMING_LEAST = 90


def part_limits(remaining: float) -> dict[str, float]:
    """Each timing part's limit: :data:`TIMING_PARTS`', shrunk alike to fit in ``remaining``
    seconds (the gpu-check's budget less what it spent) when they would not."""
    wanted = sum(limit for _, limit in TIMING_PARTS.values())
    scale = min(1.0, max(0.0, remaining - 5) / wanted)
    return {part: round(limit * scale) for part, (_, limit) in TIMING_PARTS.items()}


def timing_rows(check) -> tuple[str, dict]:
    """``benchmarks.linear`` on CUDA in three timed parts (:data:`TIMING_PARTS`, their limits
    shrunk to the gpu-check's budget where it is short): the default search in the process
    (and without graphs, and one group at a time), the whole command (median of 2), and
    ``--loss all``; beside their targets. A part that runs out of time is stopped with every
    process it started and reports what it measured before; the check fails only when a
    figure is missing. Where the graphs' check failed, the parts run with graphs and groups at
    once switched off, and say so."""
    from benchmarks.gpu_check import CheckFailed
    from featcache.linear.engine.graphs import GRAPHS_ENV
    from featcache.linear.engine.workers import CUDA_GROUPS_ENV

    env: dict[str, str] = {}
    if not check.passed("stage two: CUDA graphs vs eager"):
        env = {GRAPHS_ENV: "0", CUDA_GROUPS_ENV: "1"}
    parts, documents = {}, {}
    limits = part_limits(check.remaining())
    for part, (options, _) in TIMING_PARTS.items():
        limit = limits[part]
        partial = check.out / f"stage-two-{part}.json"
        partial.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "benchmarks.linear", "--device", "cuda", "--no-baseline",
                "--partial", str(partial), *options]
        if part == "all_losses":
            argv += ["--all-losses-timeout", str(max(10, limit - ALL_LOSSES_MARGIN))]
        if part == "search" and env:
            argv.append("--no-variants")  # without graphs they time the same thing again
        parts[part] = run_part(argv, limit, check.env | env, check.out)
        if partial.is_file():
            documents[part] = json.loads(partial.read_text(encoding="utf-8"))
    figures = _figures(documents)
    for part in parts:
        parts[part]["figure"] = figures.get(part)
    met = {k: v <= TARGETS[k] for k, v in figures.items()}
    detail = "; ".join(f"{k} {v:.2f} s (target {TARGETS[k]:g} s: {'met' if met[k] else 'missed'})"
                       for k, v in figures.items())
    variants = documents.get("search", {}).get("speed", {}).get("cuda_variants", {})
    detail += "".join(f"; search {label} {v['seconds']:.2f} s" for label, v in variants.items())
    everything = documents.get("all_losses", {}).get("all_losses", {})
    this = everything.get("versions", {}).get("this checkout", {})
    slowest = sorted(this.get("per_loss_seconds", {}).items(), key=lambda item: -item[1])[:3]
    if this:
        done = this.get("losses", 0)
        detail += (f"; --loss all {'stopped after' if this.get('timed_out') else 'took'} "
                   f"{this['seconds']:.0f} s with {done} losses finished")
    if slowest:
        detail += "; --loss all's slowest: " + ", ".join(f"{k} {v:.1f} s" for k, v in slowest)
    for part, outcome in parts.items():
        if outcome["status"] != "done":
            detail += f"; {part}: {outcome['status']}"
    if env:
        detail += " (graphs and groups at once switched off: their check failed)"
    numbers = {"seconds": figures, "targets": TARGETS, "met": met, "parts": parts,
               "search_variants": variants, "slowest_losses": slowest, "env": env,
               "all_losses": this}
    missing = [k for k in TARGETS if k not in figures]
    if missing:
        check_numbers = getattr(check, "keep_numbers", None)
        if check_numbers is not None:
            check_numbers(numbers)
        raise CheckFailed(f"no figure for {', '.join(missing)}: {detail}")
    return detail, numbers


def _figures(documents: dict) -> dict[str, float]:
    """The timing figures found in the parts' documents (a part stopped early has fewer)."""
    figures = {}
    speed = documents.get("search", {}).get("speed", {})
    if "ours_seconds" in speed:
        figures["search"] = speed["ours_seconds"]
    command = documents.get("command", {}).get("command", {})
    median = command.get("versions", {}).get("this checkout", {}).get("median")
    if median:
        figures["command"] = median["seconds"]
    everything = documents.get("all_losses", {}).get("all_losses", {})
    if everything.get("all_losses_seconds") is not None:
        figures["all_losses"] = everything["all_losses_seconds"]
    return figures


def run_part(argv: list[str], limit: float, env: dict, cwd) -> dict:
    """``argv`` run to its end or stopped with every process it started after ``limit``
    seconds: how it ended (``done``, ``stopped after N s``, ``failed (exit N)``), its seconds
    and the end of its output."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=limit)
        status = "done" if process.returncode == 0 else f"failed (exit {process.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = f"stopped after {limit:g} s"
    return {"status": status, "seconds": time.perf_counter() - started, "limit": limit,
            "output": (output or "")[-3000:]}
