"""Stage one: run the backbone once over every image and cache the pooled features.

Rows follow the labels file, official train then test, in fixed chunks (1024 rows by default,
a multiple of the batch size, so that every batch is the same whatever happened before). Each
finished chunk is saved as a shard (:mod:`featcache.features.shards`); running again computes
only the missing chunks; when all exist they are assembled with
:func:`featcache.data.featurewrite.write_features` (atomic) and the shards are removed. The result
does not depend on interruptions, nor on the number of ranks under ``torchrun``.

GPU runs use autocast (bf16, or fp16 where bf16 is missing; ``fp32`` for exact fidelity, with
TF32 off), pinned memory and DataLoader workers that decode and resize with PIL (normalisation
happens on the device, on a quarter of the bytes); convolutional backbones use channels_last,
transformers ``F.scaled_dot_product_attention``. JPEGs may be decoded on the device instead, a
batch at a time and one batch ahead of the forward pass (close to, not identical with, PIL):
``gpu_decode`` True asks for it, False for PIL, None (the default) decodes on the device on
CUDA unless what is on disk records PIL (:mod:`featcache.features.decoder`); ``jpeg_draft``
lets PIL decode large JPEGs at a reduced scale (opt-in: the reference decodes full size).

Vision-language backbones add, on request, the class-prompt text embeddings (``text``,
:mod:`featcache.features.text`) and the embeddings of a G x G grid of tiles of every official
training image (``crops``, AEVLP's local views), saved with each chunk like the features.
"""

from __future__ import annotations

from collections.abc import Callable

from featcache.backbones import backbone_spec
from featcache.backbones.weights import describe_weights
from featcache.data.labelfile import load_labels
from featcache.features.extraction import Extraction
from featcache.features.options import ExtractOptions, ExtractResult
from featcache.features.spatial import SpatialExtraction
from featcache.paths import existing_labels, features_path, spatial_features_path
from featcache.progress import say
from featcache.runtime import ranks


def _stderr(message: str) -> None:
    say(message)


def extract_features(dataset: str, options: ExtractOptions | None = None,
                     say: Callable[[str], None] = _stderr) -> ExtractResult:
    """Extract (or finish extracting) the features of ``dataset`` into its cache.

    ``dataset`` is a name under the cache root or a dataset directory holding ``labels.h5``.
    Returns what was done; progress and warnings go to ``say`` (rank 0 only).
    """
    options = options or ExtractOptions()
    options.validate()
    spec = backbone_spec(options.backbone)
    labels = load_labels(existing_labels(dataset, options.cache))
    source = describe_weights(spec, options.weights, options.seed)
    if options.spatial:
        engine: type[Extraction] = SpatialExtraction
        final = spatial_features_path(dataset, options.file_tag(source), options.cache)
    else:
        engine, final = Extraction, features_path(dataset, options.file_tag(source), options.cache)
    with ranks(options.device) as job:
        say = say if job.is_main else _quiet
        run = engine(options, labels, job, final, say)
        if final.exists() and not options.overwrite:
            return run.check_finished(source)
        return run.execute(source)


def _quiet(_message: str) -> None:
    pass
