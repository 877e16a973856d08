"""Issue 45, item 7: a new user's day. Each case runs the real command in a subprocess (cases
grouped per subprocess, :func:`faults.run_many`) and ends in one featcache line; nothing is
lost."""

from __future__ import annotations

import re
import shlex
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from dataset_fixtures import invoke
from faults import run_many
from helpers_finetune import NAME, copy_cache, linear_run
from helpers_images import write_image
from PIL import Image

from featcache.errors import FeatcacheWarning

QUICK = ("--epochs", "1", "--lr", "1e-2", "--bsize", "16", "--quiet", "--no-plots",
         "--device", "cpu")
REPO = Path(__file__).resolve().parents[1]
#: numpy's advice that featcache must never pass on
UNPICKLE_ADVICE = ("allow_pickle", "unsafely", "pickle.load")


def feature_set(path, seed=0, rows=60, test_rows=30, classes=("a", "b", "c")):
    """An .npz feature set, every row with a positive (several in some rows)."""
    rng = np.random.RandomState(seed)

    def labels(n):
        y = (rng.rand(n, len(classes)) < 0.4).astype(np.uint8)
        y[np.arange(n), rng.randint(0, len(classes), n)] = 1
        return y

    np.savez(path, X_train=rng.rand(rows, 8).astype(np.float32),
             X_test=rng.rand(test_rows, 8).astype(np.float32), Y_train=labels(rows),
             Y_test=labels(test_rows), label_names=np.array(classes))
    return path


def one_line_error(case) -> str:
    """The case's error: exactly one line starting 'Error: ' and no traceback."""
    errors = [line for line in case.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in case.stderr, case.output
    assert "this may be a bug" not in case.stderr, case.output
    return errors[0]


def test_a_new_users_day_on_imported_sets(tmp_path, cache_dir):
    """table with a root lacking the run id, --versus typo, predict --threshold, a text file
    named .npz, a CSV class typo, `backbones`, `prepare features` on two small files,
    `report` twice and `pipeline run` from a clone elsewhere."""
    for name, seed in (("sa", 0), ("sb", 1)):
        result = invoke("prepare", "features", "--npz", feature_set(tmp_path / f"{name}.npz", seed),
                        "--name", name)
        assert result.exit_code == 0, result.output
    for name, losses, run_id in (("sa", "an,role", "x"), ("sb", "an", "y")):
        result = invoke("train-linear", "--dataset", name, "--loss", losses, "--run-id", run_id,
                        *QUICK)
        assert result.exit_code == 0, result.output
    text = tmp_path / "notes.npz"
    text.write_text("not an array\n")
    images = tmp_path / "images"
    images.mkdir()
    (tmp_path / "train.csv").write_text("image,label\na.jpg,dog\nb.jpg,cat\n")
    (tmp_path / "test.csv").write_text("image,label\nc.jpg,dgo\n")
    (tmp_path / "full-train.csv").write_text("image,dog,cat\na.jpg,1,0\nb.jpg,0,1\n")
    (tmp_path / "full-test.csv").write_text("image,dgo,cat\nc.jpg,1,0\n")
    clone = tmp_path / "elsewhere" / "featcache"
    (clone / "pipelines").mkdir(parents=True)
    shutil.copy(REPO / "pipelines" / "real-features.toml", clone / "pipelines")
    recipe = clone / "pipelines" / "real-features.toml"
    foreign = tmp_path / "mine.html"
    foreign.write_text("<html>my own notes</html>")
    runs_a, runs_b = cache_dir / "sa" / "runs", cache_dir / "sb" / "runs"
    an_run = runs_a / "an" / "x"
    features = cache_dir / "sa" / "features-imported.h5"
    cases = run_many([
        ["table", runs_a, runs_b, "--run-id", "x"],
        ["table", runs_a, "--run-id", "x", "--versus", "nn"],
        ["predict", "--run", an_run, "--features", features, "--threshold", "0.99"],
        ["predict", "--run", an_run, "--features", text],
        ["prepare", "features", "--npz", text, "--name", "t"],
        ["prepare", "csv", "--train", tmp_path / "train.csv", "--test", tmp_path / "test.csv",
         "--images", images, "--name", "c1", "--labels-only"],
        ["prepare", "csv", "--train", tmp_path / "full-train.csv", "--test",
         tmp_path / "full-test.csv", "--images", images, "--name", "c2", "--labels-only"],
        ["backbones"],
        ["prepare", "features", "--npz", feature_set(tmp_path / "sc.npz", 2), "--name", "sc"],
        ["report", cache_dir / "sa"],
        ["report", cache_dir / "sa"],
        ["report", cache_dir / "sa", "--out", foreign],
        ["pipeline", "run", recipe],
    ], cwd=tmp_path, env={"FEATCACHE_PROGRESS": "lines"})
    (table, versus, threshold, predict_text, prepare_text, csv_single, csv_full, backbones,
     hashing, report, report_again, report_foreign, pipeline) = cases

    assert table.returncode == 1
    assert one_line_error(table) == (f"Error: no run with id 'x' under {runs_b} (run ids there: "
                                     "y); leave the folder out or finish that run")
    assert versus.returncode != 0 and "did you mean 'an'?" in one_line_error(versus)

    assert threshold.returncode == 0, threshold.output
    rows = threshold.stdout.strip().splitlines()[1:]
    empty = sum(1 for row in rows if row.endswith(","))
    note = next(line for line in threshold.stderr.splitlines() if line.startswith("note: "))
    assert empty > 0 and note.startswith(f"note: {empty} rows have (of {len(rows)}) no class "
                                         "with probability at least 0.99"), threshold.output

    for case in (predict_text, prepare_text):
        error = one_line_error(case)
        assert case.returncode == 1 and str(text) in error and "neither a .npy header" in error
        assert not any(advice in case.output for advice in UNPICKLE_ADVICE), case.output
    assert not (cache_dir / "t").exists()

    assert "label 'dgo' is not a class of" in one_line_error(csv_single)
    assert "did you mean 'dog'? If not, pass --classes FILE" in one_line_error(csv_single)
    assert "did you mean 'dog' for 'dgo'?" in one_line_error(csv_full)
    assert not (cache_dir / "c1").exists() and not (cache_dir / "c2").exists()

    assert backbones.returncode == 0 and "; yes; yes" not in backbones.stdout
    assert "text tower (--text)" in backbones.stdout and "no text tower" in backbones.stdout

    assert hashing.returncode == 0, hashing.output
    assert "hashing source files" not in hashing.stderr

    assert report.returncode == 0 and report_again.returncode == 0, report_again.output
    page = (cache_dir / "sa" / "report.html").read_text(encoding="utf-8")
    assert "None weights" not in page and "none weights" not in page  # imported features
    assert "replacing the report written there before" in report_again.stdout
    assert report_foreign.returncode == 1 and "--overwrite" in one_line_error(report_foreign)
    assert foreign.read_text() == "<html>my own notes</html>"

    error = one_line_error(pipeline)
    shared = (clone.parent / "shared" / "data").resolve()
    assert error.count("--set shared=PATH") == 1 and error.count("not exist") == 1, error
    assert f"{{shared}} is {shared})" in error and ".." not in error.split("the first: ")[1]


@pytest.mark.slow  # a whole first day of commands on images
def test_a_new_users_day_on_images(tmp_path):
    """finetune without --loss, the demo's vlpl hint and its CLIP command offline, predict on
    unreadable images (all, or some with --skip-bad) and on an image over PIL's pixel limit
    (decoded in the DataLoader worker the command starts by default)."""
    cache = copy_cache(tmp_path.parent, tmp_path / "cache")
    for made_by_another_test in (cache / NAME).glob("pseudo-labels-*.h5"):
        made_by_another_test.unlink()  # the vlpl hint is for a set without pseudo-labels
    unreadable, mixed = tmp_path / "unreadable", tmp_path / "mixed"
    for index in range(2):
        write_image(unreadable / f"u{index}.jpg", "truncated", seed=index)
    for index in range(3):
        write_image(mixed / f"good{index}.jpg", seed=index)
    for index in range(2):
        write_image(mixed / f"bad{index}.jpg", "truncated", seed=index)
    big = tmp_path / "big.png"
    Image.new("RGB", (120, 100), (200, 40, 40)).save(big)
    predict = ["predict", "--run", linear_run(cache), "--device", "cpu"]
    clip = (f"featcache features --dataset {NAME} --backbone clip-vit-l14-336 --preprocess "
            "protocol --image-size 336 --text")
    env = {"FEATCACHE_CACHE": str(cache), "FEATCACHE_PROGRESS": "lines",
           # a machine without network: the hub's host refuses connections, nothing is cached
           "HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_CACHE": str(tmp_path / "hf")}
    limit = "import PIL.Image\nPIL.Image.MAX_IMAGE_PIXELS = 10_000\n"  # big.png's 12,000 are over
    missing, vlpl, offline, nothing_read, some_read, over_limit = run_many([
        ["finetune", "--dataset", NAME],
        ["train-linear", "--dataset", NAME, "--loss", "vlpl", *QUICK],
        shlex.split(clip)[1:],
        [*predict, "--workers", "0", "--skip-bad", unreadable],
        [*predict, "--workers", "0", "--skip-bad", mixed, "--out", tmp_path / "p.csv"],
        [*predict, "--quiet", big],
    ], cwd=tmp_path, env=env, prelude=limit)

    assert missing.returncode == 2
    error = one_line_error(missing)
    assert "Missing option '--loss'" in error and "role (linear-role)" in error
    (suggestion,) = re.findall(r"`(featcache finetune [^`]+)`", error)
    assert suggestion == f"featcache finetune --dataset {NAME} --loss role"

    hint = one_line_error(vlpl)
    commands = re.findall(r"`(featcache [^`]+)`", hint)
    assert commands[0] == clip and commands[1].startswith("featcache pseudo-label "), hint
    assert "the first run needs the network" in hint
    error = one_line_error(offline)  # the printed command, pasted, on a machine without network
    assert "127.0.0.1 cannot be reached" in error and "Retrying" not in offline.output
    assert offline.seconds < 30, offline.seconds  # the library's retries took about 50 s

    assert nothing_read.returncode == 1
    assert one_line_error(nothing_read) == ("Error: no image could be read: all 2 were left "
                                            "out, each named above; nothing to score")
    assert "(0, 0)" not in nothing_read.output
    assert some_read.returncode == 0, some_read.output
    assert "done, 3 img and 2 skipped in" in some_read.stderr
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 4  # the header and 3 rows

    assert over_limit.returncode == 0, over_limit.output
    assert "DecompressionBomb" not in over_limit.stderr and "warnings.warn" not in over_limit.stderr
    (line,) = [x for x in over_limit.stderr.splitlines() if "PIL's limit" in x]
    assert line == (f"featcache: warning: {big} is 120 x 100 (12,000 pixels), over PIL's limit of "
                    "10,000 for untrusted images; decoding it anyway (36.0 kB as RGB)")


def test_fit_on_a_full_label_matrix_warns_that_it_is_not_single_positive():
    from featcache import SPMLClassifier

    rng = np.random.RandomState(0)
    X = rng.rand(40, 6).astype(np.float32)
    full = (rng.rand(40, 3) < 0.5).astype(int)
    full[np.arange(40), rng.randint(0, 3, 40)] = 1
    clf = SPMLClassifier(loss="an", epochs=1, batch_size=8, progress=False)
    with pytest.warns(FeatcacheWarning, match=r"several positives in \d+ of 40 rows and no "
                                              "observed negative: full labels\\?"):
        clf.fit(X, full)
    single = np.zeros_like(full)
    single[np.arange(40), full.argmax(axis=1)] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatcacheWarning)
        clf.fit(X, single)  # single positives: nothing to say
        clf.fit(X, np.where(full == 1, 1, -1))  # observed negatives: a partial-label matrix


def test_a_long_chart_title_wraps_inside_the_chart():
    """The report's fine-tuning charts (420 px) clipped titles such as 'linear start:
    <loss>/<run id> (each seed's selection)' at their right edge."""
    from featcache.report.svg import TITLE_CHAR_PX, Series, curves_svg

    title = "linear start: runs/ll-ct-abs/real-features-2026-11-28-seed-0 (each seed's selection)"
    series = [Series("a", [1, 2], [50.0, 60.0], [40.0, 45.0], "#000")]
    svg = curves_svg(series, title, width=420, height=260)
    lines = re.findall(r"<tspan[^>]*>([^<]*)</tspan>", svg)
    assert len(lines) == 2 and " ".join(lines).replace("\u2026", "") in title
    assert all(4 + len(line) * TITLE_CHAR_PX <= 420 for line in lines)
    assert f'aria-label="{title}"' in svg.replace("&#x27;", "'")
