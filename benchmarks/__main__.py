"""``python -m benchmarks`` (``make bench``): run every benchmark with its default, CPU-sized settings."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("linear", "linear_kernels", "linear_floor", "extract", "finetune", "jpeg_draft",
              "spatial", "checksums", "intervals")


def main(argv: list[str]) -> None:
    names = argv or list(BENCHMARKS)
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"\n=== benchmarks.{name} ===", flush=True)
        module.main([])


if __name__ == "__main__":
    main(sys.argv[1:])
