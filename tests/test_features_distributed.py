"""``torchrun --nproc_per_node 2 -m featcache features`` on the CPU (gloo) equals one process."""

from __future__ import annotations

import socket
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers_images import make_dataset

from featcache.features.extract import ExtractOptions, extract_features

pytestmark = pytest.mark.slow  # starts torchrun ranks (`make test-fast` leaves it out)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("spatial", [False, True], ids=["pooled", "spatial"])
def test_two_ranks_write_the_same_file_as_one_process(tmp_path, monkeypatch, spatial):
    # torchrun gives each rank one thread; on the CPU the last bits depend on the thread count
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    make_dataset(tmp_path, num_train=18, num_test=6)
    common = dict(weights="random", image_size=32, batch_size=4, chunk_rows=8, workers=0,
                  device="cpu")
    single = extract_features("toy", ExtractOptions(cache=str(tmp_path / "cache"), spatial=spatial,
                                                    **common))
    distributed_cache = tmp_path / "cache2"
    (distributed_cache / "toy").mkdir(parents=True)
    (distributed_cache / "toy" / "labels.h5").write_bytes(single.path.with_name("labels.h5").read_bytes())
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "-m", "featcache", "features", "--dataset", "toy", "--weights", "random",
        "--image-size", "32", "--batch-size", "4", "--chunk-rows", "8", "--workers", "0",
        "--device", "cpu", "--cache", str(distributed_cache), *(["--spatial"] if spatial else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("features: 24 images") == 1  # one summary, from rank 0
    # --spatial: the spatial file and the pooled file of the same pass
    names = [single.path.name] + (["features-resnet50-random.h5"] if spatial else [])
    for name in names:
        assert_same(single.path.with_name(name), distributed_cache / "toy" / name)


def assert_same(first, second) -> None:
    with h5py.File(first) as a, h5py.File(second) as b:
        for key in ("train/features", "test/features", "train/bad", "test/bad"):
            assert np.array_equal(a[key][()], b[key][()]), key
        attrs_a = {k: v for k, v in a.attrs.items() if k != "created"}
        attrs_b = {k: v for k, v in b.attrs.items() if k != "created"}
        assert attrs_a.keys() == attrs_b.keys()
        for key in attrs_a:
            assert np.array_equal(attrs_a[key], attrs_b[key]), key
