"""``featcache estimate-k``: how well M fully labelled images estimate k (Cole et al., supplement B)."""

from __future__ import annotations

import click

from featcache.commands.common import (
    GENERATOR_SEED,
    cache_option,
    chosen_dataset,
    dataset_option,
    parse_number_list,
)
from featcache.commands.repeated import ListOption


@click.command("estimate-k")
@dataset_option()
@click.option("--labeled", "labeled", cls=ListOption, default="5,10,25", show_default=True,
              help="M: how many fully labelled training images k is estimated from "
                   "(comma-separated or repeated; the supplement's Table A2 uses 5, 10 and 25).")
@click.option("--draws", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Random sets of M images drawn (the supplement's 10^5).")
@click.option("--seed", type=GENERATOR_SEED, default=1200, show_default=True, help="Seed of the draws.")
@click.option("--sweep", type=click.IntRange(min=2), default=None,
              help="Also print this many linearly spaced k values in each interval (the "
                   "supplement's Figure A1 uses 10 in I_5).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the intervals (and the sweep) to this JSON file.")
@cache_option
def command(dataset, labeled, draws, seed, sweep, json_path, cache):
    """Estimate k, the expected number of positives per image, from M fully labelled images.

    k* is the mean number of positives per image over the (official) training set, the value
    EPR and ROLE use by default. With only M fully labelled images, k is estimated as their
    mean; drawing --draws random sets of M training images without replacement and taking the
    5th and 95th percentiles of the estimates gives the interval I_M of Cole et al.'s
    supplement B (Table A2). Training with `--param k=estimate:M` uses one such estimate.
    """
    import numpy as np

    from featcache.data.kestimate import k_interval, positive_histogram
    from featcache.data.labelfile import load_labels
    from featcache.errors import InputError
    from featcache.fileio import write_json_atomic
    from featcache.paths import existing_labels
    from featcache.published import published_k_interval
    from featcache.tables import Table

    labels = load_labels(existing_labels(chosen_dataset(dataset, cache), cache))
    if labels.train.clean is None:
        raise InputError(f"{labels.path} holds single positives only (no clean training labels): "
                         "there are no fully labelled images to estimate k from")
    histogram = positive_histogram(labels.train.clean)
    table = Table(["M", "k*", "I_M low", "I_M high", "mean k_M", "std k_M", "published I_M"],
                  title=f"{labels.dataset}: k from M fully labelled training images "
                        f"({draws} draws, seed {seed}, 5th-95th percentiles)")
    records = []
    for m in parse_number_list(labeled, "--labeled", kind=int):
        interval = k_interval(histogram, m, draws=draws, seed=seed)
        reference = published_k_interval(labels.dataset, m)
        table.add(m, interval.k_true, interval.low, interval.high, interval.mean, interval.std,
                  None if reference is None else f"({reference[0]:g}, {reference[1]:g})")
        record = interval.to_json()
        if sweep is not None:
            record["sweep"] = np.linspace(interval.low, interval.high, sweep).tolist()
        records.append(record)
    click.echo(table.markdown())
    for record in records if sweep is not None else ():
        values = ", ".join(f"{k:.4g}" for k in record["sweep"])
        click.echo(f"k sweep in I_{record['labeled']}: {values}")
    if json_path is not None:
        write_json_atomic(json_path, {"dataset": labels.dataset, "labels": str(labels.path),
                                      "labels_sha256": labels.sha256, "intervals": records})
        click.echo(f"written to {json_path}")
