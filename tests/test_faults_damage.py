"""Silent damage: bytes of a finished file that change on disk (a failing disk, an incomplete
copy) are caught by the checksums written with it (HDF5's Fletcher32 per chunk for
features-*.h5, spatial-*.h5, labels.h5; the zip CRC-32 of best.pt), and refused in one line
naming the file, the rows or part that fail and the command that makes it again, which works
when pasted. Files written before checksums are read as before. A crafted best.pt is refused in
one featcache line. Every case runs the real ``featcache`` command in a subprocess."""

from __future__ import annotations

import json
import shlex
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from dataset_fixtures import invoke
from faults import run
from helpers_images import make_dataset

EXTRACT = ["features", "--dataset", "toy", "--backbone", "resnet18", "--weights", "random",
           "--image-size", "32", "--device", "cpu", "--workers", "0"]
FEATURES = "features-resnet18-random.h5"
LINEAR = ["train-linear", "--dataset", "toy", "--backbone", "resnet18-random", "--loss", "an",
          "--epochs", "2", "--lr", "1e-2", "--bsize", "8", "--quiet", "--no-plots",
          "--device", "cpu"]


def flip_exponent_bits(path: Path, key: str, rows: range) -> None:
    """Flip the lowest exponent bit of every float32 value of ``rows`` of the uncompressed
    dataset ``key`` in place, on the file's bytes (each value is doubled or halved: still
    finite, silently other numbers to a reader without checksums)."""
    with h5py.File(path, "r") as h5:
        dataset = h5[key]
        assert dataset.dtype == np.float32 and dataset.compression is None
        height, width = dataset.chunks
        assert width == dataset.shape[1]  # chunks of whole rows
        starts = {row: dataset.id.get_chunk_info_by_coord((row - row % height, 0)).byte_offset
                  for row in rows}
    with open(path, "r+b") as handle:
        for row in rows:
            base = starts[row] + (row % height) * width * 4
            handle.seek(base)
            values = bytearray(handle.read(width * 4))
            values[2::4] = bytes(b ^ 0x80 for b in values[2::4])  # bit 23: the exponent's lowest
            handle.seek(base)
            handle.write(values)


def without_checksums(source: Path, target: Path) -> Path:
    """A copy of an HDF5 file whose datasets carry no checksum: a file written before them."""
    with h5py.File(source, "r") as old, h5py.File(target, "w") as new:
        new.attrs.update(old.attrs)

        def copy(name, item):
            if isinstance(item, h5py.Group):
                new.require_group(name).attrs.update(item.attrs)
                return
            made = new.create_dataset(name, data=item[()], dtype=item.dtype, chunks=item.chunks,
                                      compression=item.compression,
                                      compression_opts=item.compression_opts, shuffle=item.shuffle)
            made.attrs.update(item.attrs)
            assert not made.fletcher32

        old.visititems(copy)
    return target


def _one_error_line(result, start: str) -> str:
    """The one ``Error:`` line of a refused command, checked to hold ``start``."""
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert start in lines[0], result.stderr  # after "Error: " and the path as the command named it
    assert "unexpected" not in lines[0]
    return lines[0]


def _pasted(line: str) -> list[str]:
    """The command between backquotes at the end of an error line, as argv for ``run``."""
    command = shlex.split(line.rsplit("`", 2)[-2])
    assert command[0] == "featcache"
    return command[1:]


def _test_map(run_dir: Path) -> float:
    return json.loads((run_dir / "results.json").read_text())["selection"]["test_map"]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """Images, labels.h5 (prepared by the library) and their features, made by `featcache
    features` (a subprocess), with checksums."""
    root = tmp_path_factory.mktemp("damage")
    make_dataset(root, num_train=40, num_test=16)
    made = invoke(*EXTRACT, "--cache", root / "cache")  # in-process: setting up, not the fault
    assert made.exit_code == 0, made.output
    return root


@pytest.mark.slow
def test_flipped_exponent_bits_in_a_features_file_are_refused_with_the_rows_and_the_command(
        extracted, tmp_path):
    root = tmp_path / "w"
    shutil.copytree(extracted, root, symlinks=True)
    env = {"FEATCACHE_CACHE": "cache"}
    features = root / "cache" / "toy" / FEATURES
    with h5py.File(features, "r") as h5:
        assert h5["train/features"].fletcher32 and h5["test/features"].fletcher32
        original = h5["train/features"][()]
    clean = invoke(*LINEAR, "--run-id", "clean", "--cache", root / "cache")
    assert clean.exit_code == 0, clean.output

    # the case on a file without checksums (as written before them): read silently,
    # other numbers, exit 0
    old = root / "old" / "toy"
    old.mkdir(parents=True)
    shutil.copy(root / "cache" / "toy" / "labels.h5", old / "labels.h5")
    without_checksums(features, old / FEATURES)
    flip_exponent_bits(old / FEATURES, "train/features", range(5, 25))
    with h5py.File(old / FEATURES, "r") as h5:
        damaged = h5["train/features"][()]
    assert np.isfinite(damaged).all() and not np.array_equal(damaged, original)
    silent = invoke(*LINEAR, "--run-id", "old", "--cache", root / "old")
    assert silent.exit_code == 0 and "damaged" not in silent.output, silent.output
    assert _test_map(root / "old" / "toy" / "runs" / "an" / "old") != _test_map(
        root / "cache" / "toy" / "runs" / "an" / "clean")

    # with checksums: refused, in memory and streamed, naming file, rows and the command
    flip_exponent_bits(features, "train/features", range(5, 25))
    for extra in ([], ["--stream"]):
        refused = run([*LINEAR, "--run-id", "after", *extra], root, env=env)
        line = _one_error_line(refused, f"cache/toy/{FEATURES} is damaged: /train/features rows "
                                        "0-39 fail their checksum")
        assert line.endswith("make it again: `featcache features --dataset toy --backbone "
                             "resnet18 --weights random --image-size 32 --overwrite`"), line
    assert not (root / "cache" / "toy" / "runs" / "an" / "after" / "results.json").exists()

    remade = run(_pasted(line), root, env=env)  # the command as printed
    assert remade.returncode == 0, remade.stderr
    with h5py.File(features, "r") as h5:
        assert np.allclose(h5["train/features"][()], original, rtol=1e-4, atol=1e-5)
    again = run([*LINEAR, "--run-id", "after"], root, env=env)
    assert again.returncode == 0, again.stderr


def test_a_damaged_labels_file_names_its_rows_and_the_prepare_command(tmp_path):
    prepare = ["prepare", "shapes", "--num-train", "20", "--num-test", "10", "--seed", "3"]
    made = run(prepare, tmp_path, env={"FEATCACHE_CACHE": "cache"})
    assert made.returncode == 0, made.stderr
    labels = tmp_path / "cache" / "shapes" / "labels.h5"
    with h5py.File(labels, "r") as h5:
        assert h5["train/observed"].fletcher32 and h5["split/train"].fletcher32
        observed = h5["train/observed"][()]
        offset = h5["train/observed"].id.get_chunk_info(0).byte_offset
    data = bytearray(labels.read_bytes())
    data[offset + 3] ^= 0x10  # inside the gzip-compressed chunk (its checksum fails first)
    labels.write_bytes(bytes(data))

    refused = run(["features", "--dataset", "shapes", "--weights", "random", "--device", "cpu"],
                  tmp_path, env={"FEATCACHE_CACHE": "cache"})
    line = _one_error_line(refused, "cache/shapes/labels.h5 is damaged: /train/observed rows 0-19 "
                                    "fail their checksum")
    assert "make it again: `featcache prepare shapes --num-train 20 --num-test 10 --seed 3" in line
    remade = run(_pasted(line), tmp_path, env={"FEATCACHE_CACHE": "cache"})
    assert remade.returncode == 0, remade.stderr
    with h5py.File(labels, "r") as h5:
        assert np.array_equal(h5["train/observed"][()], observed)


def test_files_without_checksums_are_read_as_before(extracted, tmp_path):
    from featcache.data.featurefile import load_features
    from featcache.data.labelfile import load_labels

    source = extracted / "cache" / "toy"
    labels = without_checksums(source / "labels.h5", tmp_path / "labels.h5")
    features = without_checksums(source / FEATURES, tmp_path / FEATURES)
    assert np.array_equal(load_labels(labels).train.observed,
                          load_labels(source / "labels.h5").train.observed)
    assert np.array_equal(load_features(features).train, load_features(source / FEATURES).train)


# ------------------------------------------------------------------------ best.pt
@pytest.fixture(scope="module")
def linear_run(extracted) -> Path:
    """A finished linear run trained by `featcache train-linear` (so its command is recorded)."""
    made = run([*LINEAR, "--run-id", "r"], extracted, env={"FEATCACHE_CACHE": "cache"})
    assert made.returncode == 0, made.stderr
    return extracted / "cache" / "toy" / "runs" / "an" / "r"


def _own_copy(extracted: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A test's own copy of the damage fixture: (its root, the linear run's folder)."""
    root = tmp_path / "w"
    shutil.copytree(extracted, root, symlinks=True)
    return root, root / "cache" / "toy" / "runs" / "an" / "r"


def _predict(run_dir: Path, root: Path):
    return run(["predict", "--run", str(run_dir), "--features", f"cache/toy/{FEATURES}",
                "--out", "-"], root, env={"FEATCACHE_CACHE": "cache"})


def _predictions(run_dir: Path, root: Path) -> str:
    """``featcache predict`` of the run in-process (checking its output, not a fault)."""
    result = invoke("predict", "--run", run_dir, "--features", root / "cache" / "toy" / FEATURES,
                    "--out", "-")
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.slow
def test_a_damaged_best_pt_is_refused_with_the_command_that_trains_it_again(
        extracted, linear_run, tmp_path):
    root, run_dir = _own_copy(extracted, tmp_path)
    best = run_dir / "best.pt"
    before = _predictions(run_dir, root)
    with zipfile.ZipFile(best) as archive:
        member = max(archive.infolist(), key=lambda m: m.file_size)  # the head's weights
    data = bytearray(best.read_bytes())
    name_size, extra_size = struct.unpack("<HH", data[member.header_offset + 26:][:4])
    data[member.header_offset + 30 + name_size + extra_size + 8] ^= 0x01  # in its bytes
    best.write_bytes(bytes(data))

    refused = _predict(run_dir, root)
    line = _one_error_line(refused, f"{run_dir}/best.pt is damaged: its part {member.filename} "
                                    "fails its checksum")
    assert line.endswith("train the run again: `featcache " + shlex.join(LINEAR) +
                         " --run-id r --overwrite`"), line
    remade = run(_pasted(line), root, env={"FEATCACHE_CACHE": "cache"})
    assert remade.returncode == 0, remade.stderr
    assert _predictions(run_dir, root) == before


CRAFTED = """
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))
torch.save({"format": "featcache-linear-head", "format_version": 2, "weight": Payload()},
           sys.argv[1])
"""


@pytest.mark.slow
def test_a_crafted_best_pt_is_refused_in_one_featcache_line_and_never_runs(
        extracted, linear_run, tmp_path):
    root, run_dir = _own_copy(extracted, tmp_path)
    subprocess.run([sys.executable, "-c", CRAFTED, str(run_dir / "best.pt")], check=True)
    for args in (["predict", "--run", str(run_dir), "--features", f"cache/toy/{FEATURES}"],
                 ["finetune", "--dataset", "toy", "--backbone", "resnet18", "--loss", "an",
                  "--init", "best", "--run-id", "ft", "--epochs", "1", "--device", "cpu"]):
        refused = run(args, root, env={"FEATCACHE_CACHE": "cache"})
        line = _one_error_line(refused, "runs/an/r/best.pt was refused: it holds objects "
                                        "other than tensors and plain values (posix.system), "
                                        "which featcache never unpickles")
        assert line.endswith("--run-id r --overwrite`)")
        assert "pytorch.org" not in refused.stderr and "Weights only" not in refused.stderr
    assert not (root / "pwned").exists()


def test_a_damaged_compressed_spatial_file_names_its_rows_and_the_spatial_command(tmp_path):
    """Spatial files are compressed (gzip, byte shuffle): the checksum is checked before the
    chunk is decompressed, and the command that remakes the file keeps --spatial."""
    from linear_fixtures import synthetic_dataset

    from featcache.data.featurefile import open_features
    from featcache.data.featurewrite import write_features
    from featcache.data.labelfile import load_labels
    from featcache.errors import InputError

    labels_path, pooled = synthetic_dataset(tmp_path, name="toy", dim=16)
    labels = load_labels(labels_path)
    with h5py.File(pooled, "r") as h5:
        rows = {split: h5[f"{split}/features"][()] for split in ("train", "test")}
    spatial = tmp_path / "toy" / "spatial-toy.h5"
    write_features(spatial, labels, rows, {"backbone": "toy", "layout": "spatial",
                                           "spatial_shape": [1, 1, 16]},
                   dtype="float16", compression="gzip", chunk_bytes=40 * 16 * 2)
    with h5py.File(spatial, "r") as h5:
        dataset = h5["train/features"]
        assert dataset.fletcher32 and dataset.compression == "gzip" and dataset.chunks[0] == 40
        offset = dataset.id.get_chunk_info_by_coord((40, 0)).byte_offset
    data = bytearray(spatial.read_bytes())
    data[offset + 5] ^= 0x04
    spatial.write_bytes(bytes(data))
    with open_features(spatial, labels) as file, pytest.raises(InputError) as refused:
        file.read("train")
    assert str(refused.value).startswith(f"{spatial} is damaged: /train/features rows 40-79 "
                                         "fail their checksum")
    assert str(refused.value).endswith("make it again: `featcache features --dataset toy "
                                       f"--backbone toy --cache {tmp_path} --spatial --overwrite`")
    with open_features(spatial, labels) as file:  # the other chunks still read
        assert file.read("train", 0, 40).shape == (40, 16)
