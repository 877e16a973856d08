"""The drawing process (:mod:`featcache.protocol.plot_process`): the same file as drawing in
the command, its errors rise in the command, and a process that is gone is replaced by drawing
in place (issue 27: matplotlib loads while torch does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from featcache.protocol import plot_process
from featcache.protocol.plots import plot_series

CURVES = [("lr=0.001 bs=8", [1, 2, 3], [50.0, 55.0, 54.0], [49.0, 53.5, 53.0]),
          ("lr=0.0001 bs=8", [1, 2, 3], [40.0, 45.0, 47.0], [39.0, 44.0, 46.5])]


@pytest.fixture
def drawing_process():
    assert plot_process.start(force=True)
    yield plot_process._running[0][2]
    plot_process.stop()


def test_the_drawing_process_writes_the_same_png_as_the_command(tmp_path, drawing_process):
    there = plot_series(CURVES, (2, 55.0), tmp_path / "there.png", title="toy / an")
    drawing = plot_process.send(plot_series, CURVES, (2, 55.0), tmp_path / "again.png",
                                "toy / an")
    pid_drew = drawing is not None and drawing.wait()
    plot_process.stop()
    here = plot_series(CURVES, (2, 55.0), tmp_path / "here.png", title="toy / an")
    assert pid_drew and not plot_process._running
    assert there.read_bytes() == here.read_bytes() == (tmp_path / "again.png").read_bytes()
    assert here.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_error_while_drawing_rises_in_the_command(tmp_path, drawing_process):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        plot_series(CURVES, (2, 55.0), blocker / "curves.png")
    # the process still serves the next figure
    assert plot_series(CURVES, (2, 55.0), tmp_path / "next.png").exists()
    assert drawing_process.is_alive()


def test_a_figure_function_the_drawing_process_cannot_import_fails_in_the_command(
        tmp_path, drawing_process):
    """A figure travels as its function's name: one the drawing process cannot import (its
    module only on the command's path, added after the fork) is an error in the command."""
    (tmp_path / "late_figures.py").write_text("def figure(path):\n    path.write_text('x')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import late_figures

        with pytest.raises(ModuleNotFoundError, match="late_figures"):
            drawing = plot_process.send(late_figures.figure, tmp_path / "figure.txt")
            assert drawing is not None
            drawing.wait()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_figures", None)
    assert not (tmp_path / "figure.txt").exists()
    assert plot_series(CURVES, (2, 55.0), tmp_path / "next.png").exists()
    assert drawing_process.is_alive()


def test_a_drawing_process_that_is_gone_is_replaced_by_drawing_in_place(tmp_path,
                                                                         drawing_process):
    os.kill(drawing_process.pid, signal.SIGKILL)
    drawing_process.join(timeout=10)
    path = plot_series(CURVES, (2, 55.0), tmp_path / "curves.png")
    assert path.exists() and not plot_process._running


def test_ctrl_c_does_not_reach_the_drawing_process(tmp_path, drawing_process):
    os.kill(drawing_process.pid, signal.SIGINT)
    assert plot_series(CURVES, (2, 55.0), tmp_path / "curves.png").exists()
    assert drawing_process.is_alive()


def test_it_starts_only_before_torch_is_imported_and_ends_with_the_command():
    code = ("import sys\nfrom featcache.protocol import plot_process\n"
            "first = plot_process.start()\nimport torch\nplot_process.stop()\n"
            "print(first, plot_process.start())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_train_linear_draws_its_curves_in_the_drawing_process(tmp_path):
    from linear_fixtures import synthetic_dataset

    synthetic_dataset(tmp_path)
    code = ("import sys\nfrom featcache.protocol import plot_process\nsent = []\n"
            "real = plot_process.send\n"
            "def send(*args, **kwargs):\n"
            "    sent.append(real(*args, **kwargs))\n    return sent[-1]\n"
            "plot_process.send = send\nfrom featcache.cli import main\n"
            "sys.argv[0] = 'featcache'\n"
            "try:\n    main()\n"
            "finally:\n    print('drawn there:', [d is not None and d.answer == (True, None)\n"
            "                                    for d in sent], flush=True)\n")
    done = subprocess.run(
        [sys.executable, "-c", code, "train-linear", "--dataset", "toy", "--cache",
         str(tmp_path), "--loss", "an", "--lr", "1e-2", "--bsize", "16", "--epochs", "2",
         "--device", "cpu", "--quiet"], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "drawn there: [True]" in done.stdout
    assert next((tmp_path / "toy" / "runs" / "an").glob("*/curves.png")).stat().st_size > 1000


def test_a_figure_started_is_drawn_while_the_command_goes_on(tmp_path, drawing_process):
    """``start_series`` returns before the PNG exists where a drawing process takes it; its
    waiter gives the same file as drawing in place, and figures answered in order."""
    from featcache.protocol.plots import start_series

    first = start_series(CURVES, (2, 55.0), tmp_path / "first.png", title="toy / an")
    second = start_series(CURVES, (3, 54.0), tmp_path / "second.png", title="toy / an")
    assert len(plot_process._unanswered) == 2
    assert second() == tmp_path / "second.png" and first() == tmp_path / "first.png"
    assert not plot_process._unanswered
    plot_process.stop()
    here = plot_series(CURVES, (2, 55.0), tmp_path / "here.png", title="toy / an")
    assert (tmp_path / "first.png").read_bytes() == here.read_bytes()


def test_a_figure_started_before_the_process_died_is_drawn_in_place(tmp_path, drawing_process):
    from featcache.protocol.plots import start_series

    os.kill(drawing_process.pid, signal.SIGKILL)
    drawing_process.join(timeout=10)
    finish = start_series(CURVES, (2, 55.0), tmp_path / "curves.png")
    assert finish().exists() and not plot_process._running and not plot_process._unanswered
