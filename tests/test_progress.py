"""Progress in logs: when stderr is not a terminal, a line at most every interval (30 s by
default) instead of a redrawn bar, never a carriage return; bars on a terminal."""

from __future__ import annotations

import io

import pytest

from featcache import progress as progress_module
from featcache.progress import LogLines, progress, progress_style


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def log(monkeypatch, capsys):
    """(stderr as captured: not a terminal, a fake clock)."""
    monkeypatch.delenv(progress_module.PROGRESS_ENV, raising=False)
    monkeypatch.delenv(progress_module.INTERVAL_ENV, raising=False)
    clock = FakeClock()
    monkeypatch.setattr("tqdm.std.time", clock)  # the clock of tqdm and of its log lines
    return capsys, clock


def test_a_log_gets_a_line_every_30_seconds_not_a_bar_per_step(log):
    capsys, clock = log
    bar = progress(total=1000, desc="features x", unit="img")
    assert isinstance(bar, LogLines)
    for _ in range(1000):  # 1000 steps over 100 s
        clock.now += 0.1
        bar.update(1)
    bar.close()
    text = capsys.readouterr().err
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert 3 <= len(lines) <= 6  # the start, about every 30 s, and the end
    assert lines[0] == "features x: start, 1000 img"
    assert lines[-1] == "features x: done, 1000 img in 01:40 (10.0 img/s)"


def test_every_bar_says_its_end_with_the_rate_and_the_interval_can_change(log, monkeypatch):
    capsys, clock = log
    monkeypatch.setenv(progress_module.INTERVAL_ENV, "5")
    bar = progress(total=97, desc="epoch 1", leave=False)
    for _ in range(97):
        clock.now += 1.0
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert 18 <= len(lines) <= 22  # one every 5 s over 97 s
    assert lines[0] == "epoch 1: start, 97 it"
    assert lines[-1] == "epoch 1: done, 97 it in 01:37 (1.0 it/s)"  # kept or not


def test_a_bar_with_nothing_to_do_prints_nothing_and_a_stopped_one_says_where(log):
    capsys, clock = log
    empty = progress(total=0, desc="hashing source files", unit=" file")
    empty.close()
    unknown = progress(desc="reading", unit=" row")
    clock.now += 4.0
    unknown.update(8)
    unknown.close()
    stopped = progress(total=10, desc="predict val", unit="img")
    clock.now += 2.0
    stopped.update(3)
    stopped.close()
    lines = capsys.readouterr().err.splitlines()
    assert not any("0/0" in line or "hashing" in line for line in lines)
    assert lines == ["reading: start", "reading: done, 8 rows in 00:04 (2.0 row/s)",
                     "predict val: start, 10 img",
                     "predict val: stopped at 3 of 10 img after 00:02 (1.5 img/s)"]


def test_the_style_follows_the_stream_unless_forced(monkeypatch):
    monkeypatch.delenv(progress_module.PROGRESS_ENV, raising=False)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert progress_style(Terminal()) == "bars" and progress_style(io.StringIO()) == "lines"
    monkeypatch.setenv(progress_module.PROGRESS_ENV, "off")
    assert progress_style(Terminal()) == "off"
    assert progress(total=3).disable


def test_stage_two_groups_report_progress_as_lines_in_a_log(log, tmp_path):
    """Stage two's per-group bars go through the same mechanism: no carriage returns in logs."""
    from linear_fixtures import synthetic_dataset

    from featcache.linear.data import load_linear_data
    from featcache.linear.engine.trainer import train_group
    from featcache.protocol.grid import GridPoint

    capsys, _ = log
    data = load_linear_data(*synthetic_dataset(tmp_path))
    train_group(data, "an", [GridPoint(1e-2, 8)], epochs=2, progress=True)
    text = capsys.readouterr().err
    assert "an bs=8 seed=0 x1: start," in text and "an bs=8 seed=0 x1: done," in text
    assert "\r" not in text and "\x1b" not in text


def test_no_status_line_just_before_the_last_step(log):
    """Issue 36, item 15: the features bar of 450 images in batches of 64 said "448/450"
    (its last status line, 30 s after the one before), then "done, 450 img"."""
    capsys, clock = log
    bar = progress(total=450, desc="features x", unit="img")
    for step in [64] * 7 + [2]:
        clock.now += 15.0  # a status line is due after every other batch
        bar.update(step)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert not any("448/450" in line for line in lines), lines
    assert "384/450" in lines[-2]  # the status line before: then the end line
    assert lines[-1] == "features x: done, 450 img in 02:00 (3.8 img/s)"


def test_the_features_command_logs_no_status_line_before_its_last_batch(tmp_path):
    """The same through `featcache features` (10 images, batches of 4: 4, 8, then 10)."""
    from faults import run
    from helpers_images import make_dataset

    make_dataset(tmp_path, num_train=6, num_test=4)
    result = run(["features", "--dataset", "toy", "--cache", str(tmp_path / "cache"),
                  "--backbone", "resnet18", "--weights", "random", "--image-size", "32",
                  "--device", "cpu", "--workers", "0", "--batch-size", "4"], cwd=tmp_path,
                 env={progress_module.PROGRESS_ENV: "lines", progress_module.INTERVAL_ENV: "0"})
    assert result.returncode == 0, result.stderr
    bar = [line for line in result.stderr.splitlines()
           if line.startswith("features features-resnet18-random: ")]
    assert bar[0].endswith("start, 10 img") and bar[-1].startswith(
        "features features-resnet18-random: done, 10 img in ")
    assert not any("8/10" in line for line in bar), bar


def test_skipped_items_are_counted_as_skipped_and_a_grown_total_says_so(log):
    """Issue 46, item 6: `predict --skip-bad` said "done, 5 img" when 2 of 5 were left out;
    a bar whose total grew ("start, 25 epochs" ... "done, 175 epochs") says what it knew."""
    capsys, clock = log
    bar = progress(total=5, desc="predict", unit="img")
    clock.now += 1.0
    bar.skip(2)
    bar.update(5)
    bar.close()
    stopped = progress(total=5, desc="predict again", unit="img")
    clock.now += 1.0
    stopped.skip(1)
    stopped.update(3)
    stopped.close()
    grown = progress(total=0, desc="evaluating", unit="epoch")
    grown.total = 25
    grown.refresh()
    grown.total += 150
    clock.now += 5.0
    grown.update(175)
    grown.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["predict: start, 5 img",
                     "predict: done, 3 img and 2 skipped in 00:01 (5.0 img/s)",
                     "predict again: start, 5 img",
                     "predict again: stopped at 3 of 5 img (1 skipped) after 00:01 (3.0 img/s)",
                     "evaluating: start, 25 epochs",
                     "evaluating: done, 175 epochs (25 known at the start) in 00:05 (35.0 epoch/s)"]


def test_a_bar_on_a_terminal_shows_what_it_skipped(monkeypatch):
    monkeypatch.setenv(progress_module.PROGRESS_ENV, "bars")
    bar = progress(total=4, desc="x", unit="img", disable=True)
    bar.skip(0)
    bar.skip(2)
    assert bar.skipped == 2 and not isinstance(bar, LogLines)
    bar.close()
