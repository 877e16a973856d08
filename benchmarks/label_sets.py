"""Conformal label sets on the real feature sets: what share of each test image's true
positives the sets hold, and how large they are, at levels 0.8, 0.9 and 0.95, for each
calibration method, against the smallest top-k of the same share.

    python -m benchmarks.label_sets [--shared PATH] [--cache DIR] [--losses a,b] [--write-docs]

Imports scene, yeast and enron (``featcache prepare features --npz``, skipped when done),
trains each loss as stage two does (``train-linear``, run id ``label-sets``: a finished run of
the same settings is reused), and scores the selected head's label sets from the files every
run keeps (``val-scores.h5``, ``test-scores.h5``). ``--write-docs`` puts the tables into
``docs/label-sets.md`` between its markers (``make label-sets``). Deterministic on one machine:
the numbers move only when the runs do.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from featcache.data.labelfile import load_labels
from featcache.fileio import write_json_atomic, write_text_atomic
from featcache.protocol.label_sets import read_val_scores, selected_seed
from featcache.protocol.runs import load_results
from featcache.protocol.test_scores import read_stored_scores
from featcache.stats.label_sets import LEVELS, METHODS, evaluate, shares, single_positives
from featcache.stats.resample import Resampling

REPO = Path(__file__).resolve().parents[1]
DATASETS = ("scene", "yeast", "enron")
LOSSES = ("an", "an-ls", "wan", "epr", "role", "em", "asl", "ll-r", "gr", "hill", "lc-max",
          "lc-dist", "lc-exact")
RUN_ID = "label-sets"
DOCS = REPO / "docs" / "label-sets.md"
BEGIN, END = "<!-- benchmarks.label_sets: begin -->", "<!-- benchmarks.label_sets: end -->"
#: the intervals are not shown here: fewer resamples keep the script quick
PLAN = Resampling(resamples=200)


def featcache(*args) -> None:
    """One featcache command, in this process."""
    from featcache.cli import cli

    cli.main([str(a) for a in args], prog_name="featcache", standalone_mode=False)


def train(shared: Path, cache: Path, losses: Sequence[str]) -> None:
    for dataset in DATASETS:
        if not (cache / dataset / "features-imported.h5").is_file():
            featcache("prepare", "features", "--npz", shared / dataset / f"{dataset}.npz",
                      "--name", dataset, "--cache", cache)
        featcache("train-linear", "--dataset", dataset, "--loss", ",".join(losses), "--run-id",
                  RUN_ID, "--quiet", "--no-plots", "--device", "cpu", "--cache", cache)


def measure(cache: Path, losses: Sequence[str]) -> list[dict]:
    """One row per dataset, loss, method and level."""
    rows = []
    for dataset in DATASETS:
        clean = load_labels(cache / dataset / "labels.h5", image_names=False).train.clean
        for loss in losses:
            run_dir = cache / dataset / "runs" / loss / RUN_ID
            document = load_results(run_dir)
            calibration = read_val_scores(run_dir, document)
            stored = read_stored_scores(run_dir, document)
            scores = stored.of_seeds([selected_seed(document)])[0]
            rows_with, positives = single_positives(calibration.observed)
            for method in METHODS:
                for level in LEVELS:
                    rule = calibration.rule(level, method)
                    found = evaluate(rule, scores, stored.targets, PLAN)
                    on_val = rule.sets(calibration.scores)
                    size, top_k = found["mean_size"]["estimate"], found["smallest_top_k"]
                    rows.append({"dataset": dataset, "loss": loss, "method": method,
                                 "level": level, "test_map": document["selection"]["test_map"],
                                 "calibration_rows": rule.rows,
                                 "share": found["share"]["estimate"], "mean_size": size,
                                 "smallest_top_k": top_k, "ratio": size / top_k,
                                 "val_positive_held": float(
                                     on_val[rows_with, positives].mean()),
                                 "val_share": float(shares(on_val, clean[calibration.rows])
                                                    .mean()),
                                 "classes": len(calibration.classes)})
    return rows


def summary_table(rows: list[dict]) -> str:
    """Per dataset, level and method: the share and size over the losses, and the ratio of the
    size to the smallest top-k of the same share."""
    lines = ["| dataset | level | method | share: mean (min) | mean set size | size / top-k: "
             "mean (max) | losses with share >= level - 0.05 |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for dataset in DATASETS:
        for level in LEVELS:
            for method in METHODS:
                mine = [r for r in rows if (r["dataset"], r["level"], r["method"]) ==
                        (dataset, level, method)]
                shares = [r["share"] for r in mine]
                ratios = [r["ratio"] for r in mine]
                near = sum(s >= level - 0.05 for s in shares)
                lines.append(f"| {dataset} | {level:g} | {method} | "
                             f"{statistics.fmean(shares):.3f} ({min(shares):.3f}) | "
                             f"{statistics.fmean(r['mean_size'] for r in mine):.2f} | "
                             f"{statistics.fmean(ratios):.2f} ({max(ratios):.2f}) | "
                             f"{near} of {len(mine)} |")
    return "\n".join(lines)


def shortfall_table(rows: list[dict], method: str) -> str:
    """Where a share falls short of the level: the rule on the rows it was calibrated on (their
    single positives, then their full labels) and on the test split, mean over the losses."""
    lines = ["| dataset | level | validation: single positive held | validation: share of "
             "the full labels | test: share |", "|---|---:|---:|---:|---:|"]
    for dataset in DATASETS:
        for level in LEVELS:
            mine = [r for r in rows if (r["dataset"], r["level"], r["method"]) ==
                    (dataset, level, method)]
            lines.append(f"| {dataset} | {level:g} | "
                         + " | ".join(f"{statistics.fmean(r[key] for r in mine):.3f}" for key in
                                      ("val_positive_held", "val_share", "share")) + " |")
    return "\n".join(lines)


def per_loss_table(rows: list[dict], method: str) -> str:
    """Every loss at every level with ``method``: share, set size, smallest top-k."""
    head = "| loss | " + " | ".join(f"{d} mAP | {d} share / size / top-k @{level:g}"
                                     for d in DATASETS for level in LEVELS[1:2]) + " |"
    lines = [head, "|---|" + "---:|" * (2 * len(DATASETS))]
    losses = list(dict.fromkeys(r["loss"] for r in rows))
    for loss in losses:
        cells = []
        for dataset in DATASETS:
            found = [r for r in rows if (r["dataset"], r["loss"], r["method"], r["level"]) ==
                     (dataset, loss, method, LEVELS[1])]
            if not found:
                cells += ["", ""]
                continue
            r = found[0]
            cells += [f"{r['test_map']:.2f}",
                      f"{r['share']:.3f} / {r['mean_size']:.2f} / {r['smallest_top_k']}"]
        lines.append(f"| {loss} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block(rows: list[dict], command: str) -> str:
    classes = {r["dataset"]: r["classes"] for r in rows}
    calibration = {r["dataset"]: r["calibration_rows"] for r in rows}
    sets = ", ".join(f"{d}: {classes[d]} classes, {calibration[d]} calibration rows"
                     for d in DATASETS)
    return (f"{BEGIN}\n*Written by `{command}`: stage two's protocol grid, one seed (0), the "
            f"selected head of each loss ({sets}); share = the mean share of each test image's "
            "true positives its set holds, size / top-k = the mean set size over the smallest "
            "k whose top-k sets hold the same share.*\n\n"
            + summary_table(rows) + "\n\nEach loss at level 0.9 with the default method "
            "(`rank`):\n\n" + per_loss_table(rows, "rank") + "\n\nWhere the shares fall "
            "short, `rank` (mean over the losses): the same rules on the validation rows they "
            "were calibrated on, and on the test split:\n\n" + shortfall_table(rows, "rank")
            + f"\n{END}")


def write_docs(text: str) -> None:
    page = DOCS.read_text(encoding="utf-8")
    start, end = page.index(BEGIN), page.index(END) + len(END)
    write_text_atomic(DOCS, page[:start] + text + page[end:], overwrite=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data",
                        help="the real data folder (default: shared/data beside the repository)")
    parser.add_argument("--cache", type=Path, default=Path("cache/bench/label-sets"),
                        help="where the sets are imported and the runs kept")
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write the tables into {DOCS.relative_to(REPO)}")
    args = parser.parse_args(argv)
    losses = [name for name in args.losses.split(",") if name]
    train(args.shared, args.cache, losses)
    rows = measure(args.cache, losses)
    write_json_atomic(args.cache / "label-sets.json", {"rows": rows})
    text = block(rows, "python -m benchmarks.label_sets --write-docs")
    print(text)
    if args.write_docs:
        write_docs(text)
        print(f"written into {DOCS}")
    else:
        print(json.dumps({"rows": len(rows)}))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
