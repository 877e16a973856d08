"""``make gpu-check``'s parts that need no GPU run in CI: the same code a GPU machine runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_ABLE = ("data", "extraction: bf16 vs fp32", "extraction: --gpu-decode vs PIL",
            "extraction: SIGKILL and resume", "linear run for LinearInit",
            "fine-tune: LinearInit first eval", "fine-tune: SIGKILL and resume",
            "test scores kept")


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_parts_and_reports(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu-only", "--out",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[0].startswith("gpu-check: --cpu-only; running only the parts")
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    status = {r["name"]: r["status"] for r in report["results"]}
    assert report["passed"] and not report["cuda"]
    assert all(status[name] == "pass" for name in CPU_ABLE), status
    assert {s for n, s in status.items() if n not in CPU_ABLE} == {"skip"}
    numbers = {r["name"]: r["numbers"] for r in report["results"]}
    assert numbers["extraction: bf16 vs fp32"]["max_relative_error"] <= report["tolerances"]["bf16_vs_fp32"]
    summary = (tmp_path / "gpu-check.md").read_text()
    assert summary.startswith("# gpu-check: PASSED")
    assert re.search(r"\| fine-tune: --compile +\| skip +\|", summary)
    assert not (tmp_path / "cache").exists()  # generated data removed (--keep keeps it)


def rows_224(pil: float, device: float, alone: float = 20_000.0) -> dict[str, float]:
    """The 224 px rows of benchmarks.extract --gpu-decode (forward and PIL: the H200's of
    2026-11-26, batch 64, 100 timed batches)."""
    return {"forward only": 12_003.0, "decode only, PIL": 3_669.0, "end to end, ours (PIL)": pil,
            "device decode alone": alone, "decode only, --gpu-decode": 14_000.0,
            "end to end, ours (--gpu-decode)": device}


def test_the_decoder_choice_follows_its_rule():
    from benchmarks.decoder_choice import decide

    at448 = {"end to end, ours (PIL)": 3_400.0, "end to end, ours (--gpu-decode)": 3_450.0}
    chosen = decide(rows_224(3_296, 9_500), at448, features_ok=True)
    assert chosen["verdict"] == "default" and chosen["target"]["met"]
    assert "224 px: PIL 3,296, --gpu-decode 9,500 img/s end to end (2.88x)" in chosen["line"]
    assert "make --gpu-decode the default on CUDA" in chosen["line"]
    assert chosen["in_step"] and chosen["line"].endswith("default on CUDA is --gpu-decode: in step")
    kept = decide(rows_224(3_296, 9_500), at448, features_ok=False)
    assert kept["verdict"] == "option" and not kept["in_step"]
    slower_448 = dict(at448, **{"end to end, ours (--gpu-decode)": 2_142.0})  # 2026-11-26
    assert decide(rows_224(3_296, 9_500), slower_448, features_ok=True)["verdict"] == "option"
    retired = decide(rows_224(3_296, 3_000), slower_448, features_ok=True)
    assert retired["verdict"] == "retire" and "retire --gpu-decode" in retired["line"]


def test_the_shipped_decoder_default_is_the_recorded_verdict():
    """Auto decodes JPEGs on the device on CUDA because the H200 run of 2026-11-28 said so."""
    from featcache.features.decoder import AUTO_ON_CUDA

    run = REPO / "docs" / "gpu-runs" / "2026-11-28-h200" / "gpu-check" / "gpu-check.json"
    chosen = next(r for r in json.loads(run.read_text())["results"] if r["name"] == "decoder choice")
    assert chosen["status"] == "pass" and chosen["numbers"]["verdict"] == "default"
    assert AUTO_ON_CUDA == "device"


def test_a_missed_target_names_what_limits_it():
    from benchmarks.decoder_choice import decide

    pil_bound = decide(rows_224(3_296, 3_000), None, features_ok=True)["target"]
    assert not pil_bound["met"]
    assert pil_bound["line"] == ("224 px end to end: 3,296 img/s with PIL, target 9,000: not met, "
                                 "limited by decoding (PIL, loader included) (3,669 img/s)")
    serial = decide(rows_224(3_296, 5_000), None, features_ok=True)["target"]
    assert "below each stage alone" in serial["line"] and "do not overlap" in serial["line"]
    assert "one after the other would give 6,462" in serial["line"]  # 1 / (1/12003 + 1/14000)
    decoder_bound = decide(rows_224(3_296, 6_000, alone=7_000), None, features_ok=True)["target"]
    assert decoder_bound["line"].endswith("limited by the device decoder alone (7,000 img/s)")


def test_the_gpu_check_prints_the_decoder_choice_from_its_benchmark_rows(tmp_path):
    """The wiring: the two extraction checks' rows reach the choice, whose line is in the summary."""
    from benchmarks.gpu_check import GpuCheck, Result, markdown

    check = GpuCheck(tmp_path, cuda=False, say=lambda _: None)
    check.cuda = True  # as on a GPU machine, with the benchmarks' results given
    at448 = {"end to end, ours (PIL)": 3_400.0, "end to end, ours (--gpu-decode)": 2_142.0}
    check.results += [
        Result("extraction: --gpu-decode vs PIL", "pass"),
        Result("benchmark: extraction 224 px", "pass",
               numbers={"rows": [[what, rate, None] for what, rate in rows_224(3_296, 9_500).items()]}),
        Result("benchmark: extraction 448 px", "pass",
               numbers={"rows": [[what, rate, None] for what, rate in at448.items()]}),
    ]
    check.run("decoder choice", check.decoder_choice, needs_cuda=True,
              needs=("benchmark: extraction 224 px",))
    chosen = check.results[-1]
    assert chosen.status == "pass" and chosen.numbers["verdict"] == "option"
    assert "448 px: PIL 3,400, --gpu-decode 2,142 img/s end to end (0.63x)" in chosen.detail
    assert "224 px end to end: 9,500 img/s with --gpu-decode, target 9,000: met" in chosen.detail
    summary = markdown(check.report())
    assert "\nDecoder choice: 224 px: PIL 3,296, --gpu-decode 9,500" in summary
