"""The gpu-check's stage-two checks, on the CPU: the timing rows come back whatever happens
(each part runs with a time limit shrunk to the budget left, a part out of time is stopped
with every process it started, and the figures measured before it are reported: on
2026-11-28 one process ran past its 300 s and returned nothing); a selection that differs
between two runs is reported with its margins, a near-tie told from wrong numbers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check_linear as checks
from benchmarks.gpu_check import CheckFailed


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" not in status.read_text()
    except FileNotFoundError:
        return False


def test_a_part_out_of_time_is_stopped_with_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild"
    argv = ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo started; sleep 60"]
    started = time.perf_counter()
    outcome = checks.run_part(argv, 1, {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert time.perf_counter() - started < 10
    assert outcome["status"] == "stopped after 1 s" and "started" in outcome["output"]
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert checks.run_part(["sh", "-c", "exit 3"], 5, {}, tmp_path)["status"] == "failed (exit 3)"


def test_the_parts_limits_shrink_to_the_budget_left():
    full = checks.part_limits(10_000)
    assert full == {part: limit for part, (_, limit) in checks.TIMING_PARTS.items()}
    short = checks.part_limits(checks.TIMING_LEAST)
    assert sum(short.values()) <= checks.TIMING_LEAST and all(v > 0 for v in short.values())


class FakeCheck:
    def __init__(self, out: Path, graphs_passed: bool = True, remaining: float = 1e9):
        self.out, self.env, self.kept = out, {}, {}
        self._graphs, self._remaining = graphs_passed, remaining

    def passed(self, name: str) -> bool:
        return self._graphs

    def remaining(self) -> float:
        return self._remaining

    def keep_numbers(self, numbers: dict) -> None:
        self.kept = numbers


def _fake_parts(monkeypatch, finished: dict[str, dict]):
    """``run_part`` writing the partial documents a part would have written by its end (or
    when it was stopped); returns the argv of each part."""
    seen = {}

    def run_part(argv, limit, env, cwd):
        part = Path(argv[argv.index("--partial") + 1]).stem.removeprefix("stage-two-")
        seen[part] = (argv, limit, env)
        document, status = finished[part]
        Path(argv[argv.index("--partial") + 1]).write_text(json.dumps(document))
        return {"status": status, "seconds": 1.0, "limit": limit, "output": ""}

    monkeypatch.setattr(checks, "run_part", run_part)
    return seen


SEARCH = {"speed": {"ours_seconds": 1.5, "cuda_variants": {
    "without CUDA graphs": {"seconds": 12.0}}}}
COMMAND = {"command": {"versions": {"this checkout": {"median": {"seconds": 3.5}}}}}


def _all_losses(seconds: float, timed_out: bool, losses: int) -> dict:
    return {"all_losses": {
        "all_losses_seconds": None if timed_out else seconds,
        "versions": {"this checkout": {"seconds": seconds, "timed_out": timed_out,
                                       "losses": losses,
                                       "per_loss_seconds": {"an": 0.5, "gr": 2.5}}}}}


def test_every_figure_back_is_a_pass_beside_the_targets(tmp_path, monkeypatch):
    seen = _fake_parts(monkeypatch, {"search": (SEARCH, "done"), "command": (COMMAND, "done"),
                                     "all_losses": (_all_losses(18.0, False, 38), "done")})
    detail, numbers = checks.timing_rows(FakeCheck(tmp_path))
    assert numbers["seconds"] == {"search": 1.5, "command": 3.5, "all_losses": 18.0}
    assert numbers["met"] == {"search": False, "command": True, "all_losses": True}
    assert "search without CUDA graphs 12.00 s" in detail and "gr 2.5 s" in detail
    argv, limit, env = seen["all_losses"]
    assert "--all-losses-timeout" in argv and limit == checks.TIMING_PARTS["all_losses"][1]
    assert env == {} and "--no-variants" not in seen["search"][0]


def test_a_part_out_of_time_reports_what_it_measured_and_fails_the_row(tmp_path, monkeypatch):
    seen = _fake_parts(monkeypatch, {
        "search": (SEARCH, "done"), "command": (COMMAND, "done"),
        "all_losses": (_all_losses(91.0, True, 12), "stopped after 110 s")})
    check = FakeCheck(tmp_path, graphs_passed=False, remaining=150)
    with pytest.raises(CheckFailed, match="no figure for all_losses") as failed:
        checks.timing_rows(check)
    assert "stopped after 91 s with 12 losses finished" in str(failed.value)
    assert "graphs and groups at once switched off" in str(failed.value)
    assert check.kept["seconds"] == {"search": 1.5, "command": 3.5}
    assert check.kept["parts"]["all_losses"]["status"] == "stopped after 110 s"
    assert sum(limit for _, limit, _ in seen.values()) <= 150
    assert seen["search"][2]["FEATCACHE_CUDA_GRAPHS"] == "0"
    assert "--no-variants" in seen["search"][0]
    assert sys.executable == seen["search"][0][0]


def _search(loss: str, vals: dict[str, list[float]]):
    """A search result as the comparison reads it: per configuration, its epochs' validation
    mAP (test mAP alike); the selection is the first best, as the protocol's."""
    from types import SimpleNamespace

    heads = []
    for config, epochs in vals.items():
        records = [SimpleNamespace(val_map=v, val_map_observed=v, test_map=v) for v in epochs]
        best = max(range(len(epochs)), key=lambda e: (epochs[e], -e))
        heads.append(SimpleNamespace(config=config, epochs=records, best_epoch=best,
                                     best_val=epochs[best], best=records[best]))
    selected = max(heads, key=lambda h: (h.best_val, -heads.index(h)))
    seed = SimpleNamespace(seed=0, heads=heads, selected=selected)
    return SimpleNamespace(spec=SimpleNamespace(loss=loss), seeds=[seed])


def test_a_selection_that_differs_is_told_a_near_tie_or_wrong_numbers():
    graphed = [_search("ll-cp", {"bs8": [20.0, 30.0004], "bs16": [21.0, 30.0]})]
    eager = [_search("ll-cp", {"bs8": [20.0, 30.0], "bs16": [21.0, 30.0002]})]
    found = checks.compare_searches(graphed, eager)
    assert found["largest_difference"] == pytest.approx(0.0004)
    (tie,) = found["differing"]
    assert tie["kind"] == "near-tie" and tie["ours"]["config"] == "bs8"
    assert tie["ours"]["margin"] == pytest.approx(0.0004)
    assert tie["theirs"]["margin"] == pytest.approx(0.0002)
    assert checks._compare(graphed, eager, "graphs vs eager") == found  # a near-tie passes

    wrong = [_search("ll-cp", {"bs8": [20.0, 30.0], "bs16": [21.0, 30.5]})]
    found = checks.compare_searches(graphed, wrong)
    assert found["differing"][0]["kind"] == "wrong numbers"
    assert found["per_loss"] == {"ll-cp": pytest.approx(0.5)}
    with pytest.raises(CheckFailed, match=r"ll-cp \(wrong numbers\): bs8 epoch 1"):
        checks._compare(graphed, wrong, "graphs vs eager")
