"""Does ``--search probe`` change the ranking of the losses? Both searches on the same features.

For each dataset, ``train-linear`` trains the chosen losses with the protocol's search and with
``--search probe`` (:mod:`featcache.linear.search_modes.probe`) under two run ids (finished runs are reused,
so an interrupted study resumes), then writes one Markdown table per dataset: each loss's test
mAP and rank under either search, and Spearman's rank correlation between the two rankings
(ties share their mean rank). Not part of ``make bench``: it is a study, not a speed figure.

    python -m benchmarks.probe_ranking --cache cache --datasets scene,yeast,emotions,enron \\
        --losses an,an-ls,wan,epr,role,em,ll-r,ll-ct,hill,splc
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from benchmarks._common import describe, machine
from featcache.fileio import write_text_atomic
from featcache.linear.run import LinearOptions, run_linear
from featcache.protocol.grid import LEARNING_RATES
from featcache.protocol.search_modes import search_mode
from featcache.protocol.search_modes.probe import PROBE_LEARNING_RATES, PROBE_WEIGHT_DECAYS
from featcache.tables import Table

SEARCHES = {"protocol": "probe-study-protocol", "probe": "probe-study-probe"}


def ranks(values: Sequence[float]) -> list[float]:
    """Rank 1 for the highest value; tied values share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the two rankings (ties at mean ranks)."""
    ra, rb = ranks(a), ranks(b)
    n = len(ra)
    mean = (n + 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb, strict=True))
    var_a = sum((x - mean) ** 2 for x in ra)
    var_b = sum((y - mean) ** 2 for y in rb)
    return cov / (var_a * var_b) ** 0.5 if var_a and var_b else float("nan")


def study(dataset: str, losses: Sequence[str], cache: str | None, jobs: int | None,
          epochs: int) -> tuple[Table, float, dict[str, float]]:
    """Both searches on ``dataset``; its table, Spearman's rho and each search's seconds."""
    documents, seconds = {}, {}
    for search, run_id in SEARCHES.items():
        options = LinearOptions(
            dataset=dataset, losses=list(losses), run_id=run_id, cache=cache, jobs=jobs,
            epochs=epochs, progress=False, plots=False, device="cpu", search=search,
            learning_rates=search_mode(search).learning_rates or LEARNING_RATES)
        began = time.perf_counter()
        outcome = run_linear(options, say=lambda line: print(line, file=sys.stderr))
        seconds[search] = time.perf_counter() - began
        documents[search] = {run.loss: run.document for run in outcome.runs}
    names = [loss for loss in losses if all(loss in docs for docs in documents.values())]
    tests = {search: [documents[search][loss]["summary"]["test_map_mean"] for loss in names]
             for search in SEARCHES}
    rank = {search: ranks(values) for search, values in tests.items()}
    table = Table(["loss", "protocol test mAP", "protocol rank", "probe test mAP", "probe rank",
                   "probe selection (lr, batch, wd, epoch)", "probe - protocol"])
    for i, loss in enumerate(names):
        chosen = documents["probe"][loss]["selection"]
        table.add(loss, tests["protocol"][i], f"{rank['protocol'][i]:g}", tests["probe"][i],
                  f"{rank['probe'][i]:g}",
                  f"{chosen['lr']:g}, {chosen['batch_size']}, {chosen['weight_decay']:g}, "
                  f"{chosen['epoch']}", tests["probe"][i] - tests["protocol"][i])
    return table, spearman(tests["protocol"], tests["probe"]), seconds


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=None)
    parser.add_argument("--datasets", default="scene,yeast,emotions,enron")
    parser.add_argument("--losses", default="an,an-ls,wan,epr,role,em,ll-r,ll-ct,hill,splc")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--out", default=None, help="Markdown file (default: stdout only)")
    args = parser.parse_args(argv)
    losses = [name for name in args.losses.split(",") if name]
    lines = [f"Machine: {describe(machine('cpu'))}; load: {machine('cpu')['load']}",
             f"Probe grid: base lr {', '.join(f'{v:g}' for v in PROBE_LEARNING_RATES)} x batch/256, "
             f"weight decay {', '.join(f'{v:.3g}' for v in PROBE_WEIGHT_DECAYS)}, batch 8, 16; "
             f"{args.epochs} epochs", ""]
    for dataset in args.datasets.split(","):
        table, rho, seconds = study(dataset, losses, args.cache, args.jobs, args.epochs)
        lines += [f"### {dataset} (Spearman's rho {rho:.2f}; protocol {seconds['protocol']:.0f} s, "
                  f"probe {seconds['probe']:.0f} s)", "", table.markdown(), ""]
        print("\n".join(lines[-4:]), flush=True)
        if args.out:
            write_text_atomic(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
