"""``featcache pseudo-label``: pseudo-labels from a features file's vision-language similarities."""

from __future__ import annotations

import click

from featcache.commands.common import (
    FINITE,
    cache_option,
    chosen_dataset,
    dataset_option,
    overwrite_option,
)


@click.command("pseudo-label")
@dataset_option()
@click.option("--rule", type=click.Choice(["vlpl", "aevlp"]), required=True,
              help="vlpl: softmax of the global image-prompt cosines, positive above the "
                   "threshold (Xing et al.). aevlp: global view plus G x G tiles, adaptive "
                   "max/min over the tiles, top-k above the threshold (Tran et al., DAMP); "
                   "needs features made with --crops.")
@click.option("--backbone", default=None, metavar="TAG",
              help="Which features file (features-TAG.h5)  [default: the only one with text "
                   "embeddings].")
@click.option("--threshold", type=FINITE, default=None,
              help="Positive threshold  [default: vlpl 0.3; aevlp 0.5 (NUS-WIDE 0.6, CUB 0.005)].")
@click.option("--temperature", type=FINITE, default=None,
              help="Softmax temperature of the cosines  [default: 0.01; aevlp CUB 0.1].")
@click.option("--negative-ratio", type=FINITE, default=None,
              help="Fraction of classes with the lowest scores: vlpl makes them pseudo-negatives "
                   "(its 'partial', default 0); aevlp clears them (0.2, COCO 0.3).")
@click.option("--eta", type=FINITE, default=None,
              help="aevlp: cap of the adaptive gate  [default: 0.3; VOC 0, CUB 0.005].")
@click.option("--top-k", type=click.IntRange(min=1), default=None,
              help="aevlp: pseudo-positives come from the K best classes  [default: 3; CUB 32].")
@click.option("--mark-negatives", is_flag=True, default=False,
              help="aevlp: make the lowest classes pseudo-negatives (-1) instead of clearing them "
                   "(the reference code clears them, so GPR's negative term is never used).")
@click.option("--name", default=None,
              help="Name of the set: pseudo-labels-NAME.h5 beside labels.h5  [default: the rule].")
@overwrite_option
@cache_option
def command(dataset, rule, backbone, threshold, temperature, negative_ratio, eta, top_k,
            mark_negatives, name, overwrite, cache):
    """Write pseudo-positive/negative labels of every training image from the cached image
    (and tile) embeddings and class-prompt embeddings of a features file
    (`featcache features --backbone clip-... --text [--crops 4x4]`).

    \b
    The set is written beside the labels file (which is never changed):
      <cache>/<dataset>/pseudo-labels-<name>.h5
    with the rule, every parameter, the features file's sha256 and, when the labels file has
    clean training labels, the precision and recall of the pseudo-labels on unobserved
    entries (also printed). The vlpl and gpr losses train on them; defaults follow the
    reference code per dataset (voc, coco, nuswide, cub).
    """
    from featcache.pseudolabels.run import PseudoLabelOptions, run_pseudo_labels

    given = {"threshold": threshold, "temperature": temperature, "negative_ratio": negative_ratio,
             "eta": eta, "top_k": top_k}
    params = {k: v for k, v in given.items() if v is not None}
    if mark_negatives:
        params["mark_negatives"] = True
    dataset = chosen_dataset(dataset, cache)
    options = PseudoLabelOptions(dataset=dataset, rule=rule, backbone=backbone, params=params,
                                 name=name, overwrite=overwrite, cache=cache)
    result = run_pseudo_labels(options, say=lambda line: click.echo(line, err=True))
    click.echo(result.summary())
