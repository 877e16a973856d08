"""SIGTERM (what ``timeout``, ``kill``, a batch scheduler or a container stop sends) in every long
command is a stop like Ctrl-C: one line saying what was kept and what to run again, exit status
143, nothing finished lost, DataLoader workers included (they once died at once with PyTorch's
handler, and ``features`` ended in "unexpected RuntimeError: DataLoader worker ... exited
unexpectedly", exit 1). The signal goes to the command's process alone (``kill PID``, which the
command passes on to its workers) or to its whole process group (``kill -TERM -PGID``,
``timeout``, a terminal's job control), as real subprocesses."""

from __future__ import annotations

import shutil
import signal

import pytest
from faults import LINEAR_AN_ROLE, SLOW_ROLE_STEPS, group_gone, interrupt, run, start, wait_for
from helpers_images import make_dataset
from linear_fixtures import synthetic_dataset

pytestmark = pytest.mark.slow  # stops running commands and checks what they kept (`make test-fast` leaves it out)

EXTRACT = ["features", "--dataset", "toy", "--backbone", "resnet18", "--weights", "random",
           "--image-size", "32", "--batch-size", "4", "--chunk-rows", "4", "--workers", "1",
           "--device", "cpu"]
SLOW_EXTRACTION = "from featcache.features.extract import Extraction\n_slow(Extraction, 'forward', 0.4)"


def terminate(process, target: str) -> tuple[str, str]:
    """SIGTERM to the process (``kill PID``) or to its process group; (stdout, stderr)."""
    _, out, err = interrupt(process, timeout=90, signum=signal.SIGTERM, group=target == "group")
    return out, err


def _stopped(process, err: str) -> str:
    """The last line of a command stopped by SIGTERM (checked: exit 143, no traceback)."""
    assert process.returncode == 143, err
    assert "Traceback" not in err and "unexpected" not in err and "DataLoader worker" not in err, err
    assert "featcache: SIGTERM: stopping at the next safe point" in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("target", ["process", "group"])
def test_sigterm_stops_extraction_with_its_dataloader_workers_and_the_same_command_resumes(
        tmp_path, target):
    make_dataset(tmp_path, num_train=24, num_test=8)
    env = {"FEATCACHE_CACHE": "cache"}
    parts = tmp_path / "cache" / "toy" / ".features-resnet18-random.parts"
    process = start(EXTRACT, tmp_path, SLOW_EXTRACTION, env=env)
    wait_for(lambda: (parts / "chunk-000001.npz").exists(), process)
    out, err = terminate(process, target)
    line = _stopped(process, err)
    assert line.startswith("featcache: interrupted: stopped by SIGTERM; "), err
    assert "chunks of features-resnet18-random.h5 are finished and kept in" in line
    assert line.endswith("run the same command again to resume")
    assert group_gone(process)  # the DataLoader workers ended with the command
    kept = sorted(p.name for p in parts.glob("chunk-*.npz"))
    assert 2 <= len(kept) < 8 and not list(parts.glob(".*tmp*"))

    again = run(EXTRACT, tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {len(kept)} of 8 chunks already done" in again.stderr


def test_sigterm_stops_train_linear_and_its_workers_keeping_finished_losses(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy")
    process = start(LINEAR_AN_ROLE, tmp_path, SLOW_ROLE_STEPS, env={"FEATCACHE_CACHE": str(cache)})
    wait_for(lambda: (cache / "toy" / "runs" / "an" / "r1" / "results.json").exists(), process)
    out, err = terminate(process, "group")
    assert _stopped(process, err) == (
        "featcache: interrupted: stopped by SIGTERM; 1 of 2 losses finished and kept under run "
        "id r1 (an); run the same command again to reuse them and train the rest")
    assert group_gone(process)


def test_sigterm_stops_a_pipeline_at_its_step(tmp_path):
    cache = tmp_path / "cache"
    synthetic_dataset(cache, name="toy")
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[[steps]]\nname = "first"\ncommand = ["train-linear", '
                      '"--dataset", "toy", "--loss", "an", "--epochs", "3", "--run-id", "p", '
                      '"--quiet", "--no-plots", "--device", "cpu"]\n')
    slow = ("from featcache.linear.engine.trainer import GroupTrainer\n"
            "_slow(GroupTrainer, 'train_step', 0.2, mark='step')")
    process = start(["pipeline", "run", str(recipe)], tmp_path, slow,
                    env={"FEATCACHE_CACHE": str(cache)})
    wait_for(lambda: any(tmp_path.glob("step-*")), process)
    out, err = terminate(process, "process")
    line = _stopped(process, err)
    assert line.startswith("featcache: interrupted: stopped by SIGTERM; "), err
    assert f"{recipe} stopped before" in line and "run it again to go on" in line


# ------------------------------------------------------- stage three, predict and cam: images
@pytest.fixture(scope="module")
def image_cache(tmp_path_factory):
    """The session's small image dataset with features and a finished linear run."""
    from helpers_finetune import base_cache

    return base_cache(tmp_path_factory.getbasetemp())


def _own_cache(image_cache, tmp_path):
    return shutil.copytree(image_cache, tmp_path / "cache")


@pytest.mark.slow
def test_sigterm_stops_finetuning_with_its_dataloader_workers(image_cache, tmp_path):
    cache = _own_cache(image_cache, tmp_path)
    args = ["finetune", "--dataset", "toy", "--cache", str(cache), "--loss", "role", "--epochs",
            "3", "--lr", "1e-3", "--bsize", "4", "--workers", "1", "--device", "cpu", "--quiet",
            "--no-plots", "--run-id", "cut"]
    slow = ("from featcache.finetune.loop import ConfigTrainer\n"
            "_slow(ConfigTrainer, 'step', 0.5, mark='step')")
    process = start(args, tmp_path, slow)
    wait_for(lambda: (tmp_path / "step-2").exists(), process)
    out, err = terminate(process, "group")
    assert _stopped(process, err).endswith(
        "epochs are saved; continue with the same command and --resume --run-id cut"), err
    assert group_gone(process)


def test_sigterm_stops_predict_on_images_and_writes_nothing(image_cache, tmp_path):
    images = image_cache.parent / "images"
    out_file = tmp_path / "p.csv"
    args = ["predict", "--run", str(image_cache / "toy" / "runs" / "role" / "linear-role"),
            str(images), "--batch-size", "2", "--workers", "1", "--device", "cpu", "--out",
            str(out_file)]
    slow = ("from featcache.backbones.transforms import Uint8Normalize\n"
            "_slow(Uint8Normalize, 'forward', 0.5, mark='batch')")
    process = start(args, tmp_path, slow)
    wait_for(lambda: (tmp_path / "batch-1").exists(), process)
    out, err = terminate(process, "group")
    assert _stopped(process, err) == ("featcache: interrupted: stopped by SIGTERM; no "
                                      "predictions were written; run the same command again")
    assert not out_file.exists() and not list(tmp_path.glob(".p.csv*"))
    assert group_gone(process)


def test_sigterm_stops_cam_before_its_next_run(image_cache, tmp_path):
    run_dir = str(image_cache / "toy" / "runs" / "role" / "linear-role")
    figure = tmp_path / "c.png"
    args = ["cam", "--run", run_dir, "--run", run_dir,
            str(image_cache.parent / "images" / "test" / "img0020.jpg"), "--out", str(figure),
            "--device", "cpu"]
    slow = "import featcache.api.cam as m\n_slow(m, 'logit_maps', 1.0, mark='maps')"
    process = start(args, tmp_path, slow)
    wait_for(lambda: (tmp_path / "maps-1").exists(), process)
    out, err = terminate(process, "process")
    assert _stopped(process, err) == (f"featcache: interrupted: stopped by SIGTERM; {figure} was "
                                      "not written; run the same command again")
    assert not figure.exists()
