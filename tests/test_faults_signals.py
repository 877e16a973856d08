"""Signals in every command, not only the long ones (issue 45, class 2): Ctrl-C or SIGTERM during
``prepare shapes --overwrite``, ``report --overwrite`` or ``table --out ... --overwrite`` stops
the command within 2 s with exit 130 or 143 and one featcache line, and the previous output
is left byte for byte as it was, with no temporary file beside it. Each command runs for real
in its own process group, one of its steps slowed down so that the signal lands inside it (a
slowed step sleeps for 30 s: a command that waited for the step would take that long)."""

from __future__ import annotations

import signal
import time

from dataset_fixtures import invoke
from faults import digests, interrupt, run_many, start, wait_for
from linear_fixtures import synthetic_dataset

#: a command must be gone this long after the signal (the issue's bound)
STOP_SECONDS = 2.0



def test_short_commands_stop_at_once_on_a_signal_and_keep_the_previous_output(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy", classes=4, n_train=40, n_test=20)
    made = invoke("train-linear", "--dataset", "toy", "--cache", cache, "--loss", "an",
                  "--epochs", "1", "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots",
                  "--device", "cpu", "--run-id", "r1")
    assert made.exit_code == 0, made.output
    shapes, report, table = tmp_path / "shapes", tmp_path / "report.html", tmp_path / "table.md"
    env = {"FEATCACHE_CACHE": str(shapes)}
    first = run_many([(["prepare", "shapes", "--num-train", "10", "--num-test", "10"], env),
                      ["report", str(cache / "toy"), "--out", str(report)],
                      ["table", str(cache / "toy" / "runs"), "--out", str(table)]], tmp_path)
    assert [r.returncode for r in first] == [0, 0, 0], [r.stderr for r in first]
    before = {"shapes": digests(shapes), "report": report.read_bytes(),
              "table": table.read_bytes()}

    slow = "_slow({}, {!r}, 30.0, mark={!r})"
    commands = [  # (the command, its slowed step, the signal)
        (["prepare", "shapes", "--num-train", "40", "--num-test", "10", "--overwrite"],
         "import featcache.data.shapes as m\n" + slow.format("m", "draw_image", "draw"),
         signal.SIGINT, env),
        (["report", str(cache / "toy"), "--out", str(report), "--overwrite"],
         "import featcache.report as m\n" + slow.format("m", "render_page", "render"),
         signal.SIGTERM, None),
        (["table", str(cache / "toy" / "runs"), "--out", str(table), "--overwrite"],
         "from featcache.protocol.results_table import ResultsTable as m\n"
         + slow.format("m", "caption", "caption"), signal.SIGINT, None),
    ]
    processes = [start(args, tmp_path, prelude, env=extra)
                 for args, prelude, _, extra in commands]
    for process, (_, prelude, signum, _) in zip(processes, commands, strict=True):
        mark = prelude.rsplit("mark=", 1)[1].strip("')")
        wait_for(lambda mark=mark: (tmp_path / f"{mark}-1").exists(), process)
        time.sleep(0.2)  # inside the 30 s step
        seconds, _, err = interrupt(process, signum=signum, timeout=30)
        assert seconds < STOP_SECONDS, (process.args[-1], seconds, err)
        assert process.returncode == (130 if signum == signal.SIGINT else 143), err
        lines = [line for line in err.splitlines() if line.startswith("featcache")]
        assert lines == [f"featcache: interrupted: stopped by "
                         f"{'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'}; no file was left "
                         "half-written (an output is replaced only once it is complete): run the "
                         "same command again"], err
        assert "Traceback" not in err
    assert digests(shapes) == before["shapes"]
    assert report.read_bytes() == before["report"] and table.read_bytes() == before["table"]
    assert not [p for p in tmp_path.rglob(".*") if "tmp" in p.name or "old" in p.name]
