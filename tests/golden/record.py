"""Record stage two's golden numbers on the real ``scene`` set: ``tests/golden/scene-linear.json``.

Run it after bumping :data:`featcache.protocol.numerics.NUMERICS_VERSION` for a change that
moves numbers on purpose (``tests/test_golden_numbers.py`` fails until then)::

    python tests/golden/record.py [--shared-data ../shared/data]

It trains the default search of each recorded loss with ``featcache train-linear --device cpu``
and writes every configuration's per-epoch validation and test mAP, the selection, the numerics
version and the fingerprint of this machine's CPU arithmetic.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOSSES = ("an-ls", "epr", "role", "ll-r", "ll-cp", "em-apl", "iu", "opml-sp")


def featcache(*args: object) -> None:
    subprocess.run([sys.executable, "-c", "from featcache.cli import main; main()",
                    *map(str, args)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared-data", type=Path, default=HERE.parents[2] / "shared" / "data")
    args = parser.parse_args()
    from featcache.protocol.numerics import NUMERICS_VERSION
    from featcache.runtime import cpu_arithmetic

    cache = Path(tempfile.mkdtemp(prefix="golden-")) / "cache"
    featcache("prepare", "features", "--npz", args.shared_data / "scene" / "scene.npz",
              "--name", "scene", "--cache", cache)
    losses = {}
    for loss in LOSSES:
        featcache("train-linear", "--dataset", "scene", "--loss", loss, "--run-id", "golden",
                  "--quiet", "--no-plots", "--device", "cpu", "--cache", cache)
        document = json.loads((cache / "scene" / "runs" / loss / "golden" / "results.json")
                              .read_text())
        selection = {k: document["selection"][k]
                     for k in ("lr", "batch_size", "epoch", "val_map", "test_map", "train_map")}
        configs = [{"lr": c["lr"], "batch_size": c["batch_size"],
                    "val_map": [e["val_map"] for e in c["epochs"]],
                    "test_map": [e["test_map"] for e in c["epochs"]]}
                   for c in document["seeds"][0]["configs"]]
        losses[loss] = {"selection": selection, "configs": configs}
    golden = {"source": "scene.npz imported with `featcache prepare features`, `featcache "
                        "train-linear --dataset scene --loss L --device cpu` (default grid, seed 0)",
              "numerics_version": NUMERICS_VERSION, "cpu_arithmetic": cpu_arithmetic(),
              "losses": losses}
    (HERE / "scene-linear.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {HERE / 'scene-linear.json'} (numerics version {NUMERICS_VERSION})")


if __name__ == "__main__":
    main()
