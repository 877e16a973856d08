"""Full disks, quotas and file-size limits: one clear line naming the file, the space free and
needed; the partial file removed; what was finished kept (the same command resumes); and long
jobs refused before they start when their output cannot fit.

Faults are injected (an ``OSError`` from a patched writer) and real: a tiny tmpfs mounted in a
user namespace (``unshare -rm``, skipped where the sandbox forbids it) and the shell's
file-size limit (``ulimit -f``).
"""

from __future__ import annotations

import errno
import io
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from faults import SLEEP_IN, run
from helpers_images import make_dataset

from featcache import fileio
from featcache.errors import DiskFullError
from featcache.fileio import atomic_output, write_bytes_atomic

EXTRACT = ["features", "--dataset", "toy", "--backbone", "resnet18", "--weights", "random",
           "--image-size", "32", "--batch-size", "4", "--chunk-rows", "4", "--workers", "0",
           "--device", "cpu"]


def _leftovers(folder):
    return [p for p in folder.rglob(".*") if ".tmp-" in p.name]


@pytest.mark.parametrize(("code", "says"), [
    (errno.ENOSPC, "the device holding .* is full"),
    (errno.EDQUOT, "the disk quota is exhausted"),
    (errno.EFBIG, "the file-size limit of this shell"),
])
def test_a_write_that_runs_out_of_room_is_one_clear_error_and_leaves_the_old_file(tmp_path, code,
                                                                                    says):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(DiskFullError) as info, atomic_output(target, overwrite=True) as tmp:
        tmp.write_text("partial")
        raise OSError(code, "injected")
    message = str(info.value)
    assert message.startswith(f"could not write {target}: ")
    assert __import__("re").search(says, message), message
    assert "more than the 7 B written so far is needed" in message
    assert "The partial file was removed and finished work is kept" in message
    assert message.endswith("then run the same command again")
    assert target.read_text() == "old" and not _leftovers(tmp_path)


def test_hdf5_messages_without_an_errno_are_recognised():
    hdf5 = RuntimeError("Can't close dataset (file write failed: ..., errno = 28, error message "
                        "= 'No space left on device')")
    assert fileio.is_disk_full(hdf5) and not fileio.is_disk_full(RuntimeError("other"))


def test_a_full_disk_the_error_names_no_file_for_is_not_blamed_on_the_current_directory(
        monkeypatch):
    """HDF5's errors carry no file name: the command line says a device was full, quoting the
    error, instead of naming '.' and the free space of the current directory."""
    from featcache.cli import cli
    from featcache.commands import losses

    def full(*args, **kwargs):
        raise RuntimeError("Can't close dataset (file write failed: errno = 28, error message "
                           "= 'No space left on device')")

    monkeypatch.setattr(losses.command, "callback", full)
    result = CliRunner().invoke(cli, ["losses"])
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("Error: could not write an output file: a device was full "
                            "(Can't close dataset"), error
    assert "could not write .:" not in error and error.endswith("run the same command again")


def test_files_built_in_memory_are_refused_before_a_byte_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "free_bytes", lambda directory: 1000)
    with pytest.raises(DiskFullError, match=rf"not enough free space in {tmp_path} to write "
                                            r"best.pt: about 5.0 kB needed, 1.0 kB free"):
        write_bytes_atomic(tmp_path / "best.pt", b"x" * 5000)
    assert not list(tmp_path.iterdir())


def _fail_after(monkeypatch, module, budget: int, code: int = errno.ENOSPC, writes_before: int = 0):
    """``open(..., "wb")`` in ``module`` gives files that fail with ``code`` once ``budget``
    bytes are written, from the ``writes_before``-th file opened on."""
    real_open, opened = open, {"n": 0}

    class Failing(io.FileIO):
        written = 0

        def write(self, data):
            self.written += len(data)
            if self.written > budget:
                raise OSError(code, "No space left on device (injected)")
            return super().write(data)

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode:
            opened["n"] += 1
            if opened["n"] > writes_before:
                return Failing(path, "w")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(module, "open", fake_open, raising=False)


@pytest.mark.slow  # fine-tunes a network
def test_a_checkpoint_that_hits_a_full_disk_keeps_the_previous_one_and_resume_continues(
        tmp_path_factory, tmp_path, monkeypatch):
    from helpers_finetune import NAME, copy_cache, finetune

    cache = copy_cache(tmp_path_factory.getbasetemp(), tmp_path / "cache")
    grid = ("--loss", "role", "--epochs", "2", "--lr", "1e-3", "--bsize", "4", "--run-id", "full")
    # files written: best.pt (epoch 1), checkpoint.pt (epoch 1), then epoch 2's fail
    _fail_after(monkeypatch, fileio, budget=1 << 20, writes_before=2)
    failed = finetune(cache, *grid)
    monkeypatch.undo()
    assert failed.exit_code == 1
    error = failed.output.strip().splitlines()[-1]
    config = cache / NAME / "finetune" / "role" / "full" / "configs" / "lr0.001-bs4"
    assert error.startswith("Error: could not write ")
    assert "the device holding" in error and "is full" in error and "needed" in error
    assert "The partial file was removed and finished work is kept" in error
    payload = torch.load(config / "checkpoint.pt", weights_only=True)
    assert payload["epoch"] == 1  # the previous checkpoint is intact
    assert not _leftovers(cache)
    resumed = finetune(cache, *grid, "--resume")
    assert resumed.exit_code == 0, resumed.output


def test_prepare_on_a_full_disk_leaves_no_labels_file(tmp_path, monkeypatch):
    from dataset_fixtures import invoke

    _fail_after(monkeypatch, fileio, budget=100)
    result = invoke("prepare", "shapes", "--num-train", "20", "--num-test", "10", "--cache",
                    tmp_path / "cache")
    assert result.exit_code == 1
    error = result.output.strip().splitlines()[-1]
    assert error.startswith(f"Error: could not write {tmp_path / 'cache' / 'shapes' / 'labels.h5'}: ")
    assert not (tmp_path / "cache" / "shapes" / "labels.h5").exists()
    assert not _leftovers(tmp_path)


# ---------------------------------------------------------------- real limits: ulimit -f, tmpfs
def test_ulimit_f_refuses_an_extraction_early_and_a_real_efbig_is_reported(tmp_path):
    make_dataset(tmp_path, num_train=24, num_test=8)
    limited = run(EXTRACT, tmp_path, env={"FEATCACHE_CACHE": "cache"}, shell_prefix="ulimit -f 64;")
    assert limited.returncode == 1, limited.stderr
    error = limited.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: the file-size limit of this shell (ulimit -f: ")
    assert "to extract the features of 32 images; raise it (ulimit -f unlimited)" in error
    assert not (tmp_path / "cache" / "toy" / "features-resnet18-random.h5").exists()

    write = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as the command line does
        from featcache.fileio import write_text_atomic
        from featcache.errors import DiskFullError
        try:
            write_text_atomic({str(tmp_path / 'big.json')!r}, "x" * 200_000)
        except DiskFullError as exc:
            print(exc)
    """)
    done = subprocess.run(["sh", "-c", 'ulimit -f 64; exec "$0" "$@"', sys.executable, "-c",
                           write], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "the file-size limit of this shell (ulimit -f: " in done.stdout
    assert "raise the limit (ulimit -f unlimited)" in done.stdout
    assert not (tmp_path / "big.json").exists() and not _leftovers(tmp_path)


def _can_mount_tmpfs(tmp_path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                          capture_output=True)
    return done.returncode == 0


def _in_tmpfs(tmp_path, size: str, script: str) -> subprocess.CompletedProcess:
    """``script`` (sh) in a user and mount namespace where ``$MNT`` is a tmpfs of ``size``."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs here (unshare -rm not permitted)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    full = f"set -u; MNT={mnt}; mount -t tmpfs -o size={size} tmpfs $MNT\n{script}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", full], capture_output=True, text=True,
                          timeout=300)


def _featcache(args: str, prelude: str = "") -> str:
    code = f"{SLEEP_IN}\n{prelude}\nimport sys\nfrom featcache.cli import main\nsys.argv = ['featcache'] + sys.argv[1:]\nmain()\n"
    return f"{sys.executable} -c {shlex_quote(code)} {args}"


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_a_real_small_file_system_refuses_an_import_up_front_without_crashing(tmp_path):
    npz = tmp_path / "big.npz"
    rng = np.random.default_rng(0)
    y = (rng.random((1500, 4)) < 0.5).astype(np.uint8)
    y[:, 0] = 1
    np.savez(npz, X_train=rng.standard_normal((1500, 512)).astype(np.float32),
             X_test=rng.standard_normal((500, 512)).astype(np.float32), Y_train=y, Y_test=y[:500],
             label_names=np.array(["a", "b", "c", "d"]))
    done = _in_tmpfs(tmp_path, "1m", f"""
        {_featcache(f"prepare features --npz {npz} --name big --cache $MNT/cache")}
        echo "rc=$?"; ls -a $MNT/cache/big 2>/dev/null
    """)
    assert "rc=1" in done.stdout, done.stdout + done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: not enough free space in ") and "to import big.npz" in error
    assert "about 4.6 MB needed, 1.0 MB free" in error, error
    assert "labels.h5" not in done.stdout  # nothing written


@pytest.mark.slow  # fills a disk, then resumes the extraction
def test_a_disk_that_fills_during_extraction_keeps_the_chunks_and_the_run_resumes(tmp_path):
    make_dataset(tmp_path, num_train=24, num_test=8)
    slow = "from featcache.features.extract import Extraction\n_slow(Extraction, 'forward', 0.3)"
    args = " ".join(EXTRACT) + " --cache $MNT/cache"
    parts = "$MNT/cache/toy/.features-resnet18-random.parts"
    done = _in_tmpfs(tmp_path, "2m", f"""
        mkdir -p $MNT/cache/toy && cp {tmp_path}/cache/toy/labels.h5 $MNT/cache/toy/
        cd {tmp_path}
        {_featcache(args, slow)} 2> {tmp_path}/first.err &
        pid=$!
        while [ ! -f {parts}/chunk-000001.npz ]; do sleep 0.1; done
        head -c 100000000 /dev/zero > $MNT/ballast 2>/dev/null
        wait $pid; echo "first=$?"
        ls {parts} | grep -c '^chunk-' | sed 's/^/chunks=/'
        ls -a {parts} $MNT/cache/toy | grep -c 'tmp-' | sed 's/^/leftovers=/'
        rm $MNT/ballast
        {_featcache(args)} 2> {tmp_path}/second.err; echo "second=$?"
        ls $MNT/cache/toy
    """)
    first = (tmp_path / "first.err").read_text()
    second = (tmp_path / "second.err").read_text()
    assert "first=1" in done.stdout, done.stdout + first
    error = first.strip().splitlines()[-1]
    assert error.startswith("Error: could not write ") and ".npz: the device holding" in error
    assert "is full" in error and "chunks saved so far are kept in" in error
    chunks = int(done.stdout.split("chunks=")[1].split()[0])
    assert chunks >= 2 and "leftovers=0" in done.stdout
    assert "second=0" in done.stdout, second
    assert f"resuming: {chunks} of 8 chunks already done" in second
    assert "features-resnet18-random.h5" in done.stdout


def test_a_features_file_is_refused_before_its_row_blocks_are_read_when_it_cannot_fit(
        tmp_path, monkeypatch):
    """Features files stream row blocks into HDF5 (a file may be larger than memory), so the
    space is checked up front, from the estimated size, before the first block is consumed."""
    from linear_fixtures import synthetic_dataset

    from featcache.data.featurewrite import features_file_bytes, write_features
    from featcache.data.labelfile import load_labels

    labels_path, _ = synthetic_dataset(tmp_path, name="toy", n_train=40, n_test=20, dim=256)
    labels = load_labels(labels_path)
    consumed = []

    def blocks(rows):
        for start in range(0, rows, 8):
            consumed.append(start)
            yield np.zeros((min(8, rows - start), 256), dtype=np.float32)

    images = [*labels.train.images, *labels.test.images]
    needed = features_file_bytes(images, 256)
    assert 60 * 256 * 4 < needed < 60 * 256 * 4 + (80 << 10)  # rows x dim x 4 bytes, plus names
    monkeypatch.setattr(fileio, "free_bytes", lambda directory: needed // 2)
    target = tmp_path / "toy" / "features-big.h5"
    with pytest.raises(DiskFullError, match=r"not enough free space in .* to write "
                                            r"features-big.h5: about .* needed"):
        write_features(target, labels, {"train": blocks(40), "test": blocks(20)},
                       {"backbone": "big"})
    assert consumed == [0, 0]  # only the first block of each split, for the width
    assert not target.exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("size", ["256k", "1m", "1700k"])  # full at the start, middle, end
def test_a_disk_that_fills_while_a_features_file_streams_in_is_one_clear_error(tmp_path, size):
    """The up-front check passed (here: patched, as if another process filled the disk right
    after it): HDF5's failed write becomes one DiskFullError, the temporary file is removed,
    and the process goes on (no crash inside HDF5)."""
    write = tmp_path / "write.py"
    write.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from linear_fixtures import synthetic_dataset
        from featcache import fileio
        from featcache.data.featurewrite import write_features
        from featcache.data.labelfile import load_labels
        from featcache.errors import DiskFullError
        root = sys.argv[1]
        from pathlib import Path
        small = Path({str(tmp_path)!r}) / "small"  # the labels, outside the tiny disk
        labels = load_labels(synthetic_dataset(small, name="toy", n_train=40, n_test=20)[0])
        fileio.free_bytes = lambda directory: 1 << 40  # the check passes; the disk is 1 MB
        def blocks(rows):  # 8 rows of 32 kB at a time: 1.9 MB in all
            for start in range(0, rows, 8):
                yield np.ones((min(8, rows - start), 8192), np.float32)
        blocks = {{"train": blocks(40), "test": blocks(20)}}
        try:
            write_features(root + "/features-big.h5", labels, blocks, {{"backbone": "big"}})
        except DiskFullError as exc:
            print("refused:", exc)
        print("still running")
    """))
    done = _in_tmpfs(tmp_path, size, f"""
        {sys.executable} {write} $MNT; echo "rc=$?"; ls -a $MNT
    """)
    assert "rc=0" in done.stdout and "still running" in done.stdout, done.stdout + done.stderr
    refused = next(line for line in done.stdout.splitlines() if line.startswith("refused:"))
    assert "could not write " in refused and "features-big.h5: the device holding" in refused
    assert "The partial file was removed" in refused
    assert "features-big.h5" not in done.stdout.split("still running")[1]
    assert ".tmp-" not in done.stdout
