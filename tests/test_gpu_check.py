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
