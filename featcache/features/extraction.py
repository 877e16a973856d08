"""The extraction engine: one extraction on one rank, from the weights to the finished file
(see :mod:`featcache.features.extract` for the whole stage). A spatial extraction
(:mod:`featcache.features.spatial`) is a subclass that changes its hooks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision

from featcache.backbones import (
    Trunk,
    Uint8Normalize,
    backbone_spec,
    create_backbone,
    resolve_preprocess,
    transform_description,
)
from featcache.backbones.weights import WeightsSource, locate_weights
from featcache.data.images import image_root
from featcache.data.labelfile import LabelSet
from featcache.errors import FeatcacheError, Interrupted, OptionError, plural
from featcache.features.assembly import Assembly
from featcache.features.decoder import choose_decoder, describe_choice, jpeg_check, recorded_on_disk
from featcache.features.finished import FinishedFile
from featcache.features.loader import ImageBatches
from featcache.features.options import ExtractOptions, ExtractResult, default_chunk_rows
from featcache.features.shards import ChunkStore, Extra
from featcache.interrupt import check_stop
from featcache.paths import feature_file_tag
from featcache.progress import progress
from featcache.runtime import (
    Ranks,
    autocast,
    backend_flags,
    cpu_threads,
    default_batch_size,
    describe_device,
    on_main,
    resolve_precision,
)


class Extraction(FinishedFile, Assembly, ImageBatches):
    """One extraction on one rank. Its :meth:`loader`, :meth:`batches` and :meth:`forward` are
    also what ``benchmarks.extract`` times end to end."""

    def __init__(self, options: ExtractOptions, labels: LabelSet, job: Ranks, final: Path,
                 say: Callable[[str], None]) -> None:
        self.options = options
        self.labels = labels
        self.job = job
        self.final = final
        self.say = say
        self.device = job.device
        self.image_size = options.input_size()
        self.dtype = options.storage_dtype()
        self.precision = resolve_precision(options.precision, self.device)
        # With --crops every image brings G*G tiles: by default a batch holds that many fewer
        # images (what workers keep in shared memory stays the same), and the tiles go through
        # the network in batches of the usual size.
        self.view_batch = options.batch_size or default_batch_size(self.device)
        self.batch_size = options.batch_size or max(1, self.view_batch // max(1, options.crops) ** 2)
        self.chunk_rows = options.chunk_rows or default_chunk_rows(self.batch_size)
        if self.chunk_rows % self.batch_size:
            raise OptionError(f"--chunk-rows ({self.chunk_rows}) must be a multiple of the batch "
                              f"size ({self.batch_size})")
        self.images = np.concatenate([labels.train.images, labels.test.images])
        if options.gpu_decode and options.jpeg_draft:
            raise OptionError("--jpeg-draft is a PIL option; --gpu-decode decodes on the device: "
                              "choose one")
        self.spec = backbone_spec(options.backbone)
        self.preprocess = resolve_preprocess(options.backbone, options.preprocess)

        def transform(decode: str) -> dict:
            return transform_description(self.image_size, options.backbone, decode, self.preprocess)

        # rank 0 decides for all: what is on disk may change once a rank starts writing
        self.decoder = on_main(job, lambda: choose_decoder(
            self.device.type, options.gpu_decode, jpeg_draft=options.jpeg_draft,
            crops=bool(options.crops), recorded=recorded_on_disk(final, options.overwrite, transform),
            has_jpegs=jpeg_check(lambda: image_root(labels, options.images_root), self.images)))
        self.decode = self.decoder.decode
        self.transform = transform(self.decode)
        self.num_train = len(labels.train)
        self.normalize = Uint8Normalize(options.backbone, self.preprocess).to(self.device)
        self.crops = options.crops

    # -- extraction -----------------------------------------------------------------------
    def execute(self, source: WeightsSource) -> ExtractResult:
        started = time.perf_counter()
        root = image_root(self.labels, self.options.images_root)
        # Rank 0 may download the weights; the others only look for them afterwards.
        source = self.job.together(
            lambda: locate_weights(source, self.options.download) if self.job.is_main else source)
        if not self.job.is_main:
            source = locate_weights(source, download=False)
        text = self.text_embeddings(source) if self.options.text and self.job.is_main else None
        said = describe_choice(self.decoder, self.final)
        if said is not None:
            self.say(said)
        model = create_backbone(self.options.backbone, source, seed=self.options.seed,
                                image_size=self.image_size)
        attrs, store = self.chunk_store(model)
        try:
            self.job.together(lambda: store.open(self.say) if self.job.is_main else None)
            mine = [c for c in range(store.num_chunks) if c % self.job.world == self.job.rank]
            todo = store.missing(mine, self.dtype, accept_bad=self.options.skip_bad)
            resumed = len(mine) - len(todo)
            if resumed:
                self.say(f"resuming: {resumed} of {store.num_chunks} chunks already done")
            count, compute_seconds = 0, 0.0

            def compute():
                nonlocal count, compute_seconds
                tick = time.perf_counter()
                count = self.compute(model, store, todo, root)
                compute_seconds = time.perf_counter() - tick

            # together: a refusal on rank 0 stops every rank (none waits in the computation)
            self.job.together(lambda: self.check_space(store, todo) if self.job.is_main else None)
            try:
                self.job.together(compute)
            except Interrupted as exc:
                done = sum(store.path(c).exists() for c in range(store.num_chunks))
                raise exc.adding(f"{done} of {store.num_chunks} chunks of {self.final.name} are "
                                 f"finished and kept in {store.dir}; run the same command again "
                                 "to resume") from None
            _, total = self.job.agree(False, count)
            if not self.job.is_main:
                return ExtractResult(self.final, "shard", images=count)
            bad = self.assemble(store, attrs, text)
            store.remove()
        finally:
            store.close()
        for entry in bad:
            self.say(f"warning: bad image {entry['image']} ({entry['split']} row {entry['row']}): "
                     f"{entry['reason']}; its features are NaN and it is flagged in /{entry['split']}/bad")
        return ExtractResult(
            self.final, "written", images=total, seconds=time.perf_counter() - started,
            compute_seconds=compute_seconds, device=attrs["device"], precision=self.precision,
            decode=self.decode, resumed_chunks=resumed, bad=bad,
        )

    def chunk_store(self, model: Trunk) -> tuple[dict, ChunkStore]:
        """The file's attributes, and the chunk shards keyed by everything their rows depend on."""
        width = self.row_width(model)
        attrs = self.attributes(model)
        identity = dict(attrs, labels_sha256=self.labels.sha256, dtype=self.dtype)
        if self.device.type == "cpu":
            identity["cpu_threads"] = cpu_threads()
        extras: dict[str, Extra] = {}
        if self.crops:
            identity["crops_grid"] = self.crops
            identity["crops_batch_size"] = self.view_batch
            extras["crops"] = (self.num_train, (self.crops * self.crops, self.spec.dim))
        self.store_extras(identity, extras)
        return attrs, ChunkStore(self.final, identity, len(self.images), self.chunk_rows, width,
                                 extras=extras)

    # -- hooks of the spatial extraction (featcache.features.spatial; write_options: Assembly) -
    def row_width(self, model: Trunk) -> int:
        """Values per stored row: the pooled width here (a feature map for ``--spatial``)."""
        return self.spec.dim

    def store_extras(self, identity: dict, extras: dict[str, Extra]) -> None:
        """Add run identity and per-chunk arrays beside the rows (none here)."""

    def attributes(self, model: Trunk) -> dict:
        """Provenance recorded in the features file (and, with the labels sha256, the manifest)."""
        out = {
            "backbone": self.options.backbone,
            "backbone_tag": feature_file_tag(self.final),
            **model.weights_identity,
            "image_size": self.image_size,
            "transform": self.transform,
            "precision": self.precision,
            "device": describe_device(self.device),
            "batch_size": self.batch_size,
            "chunk_rows": self.chunk_rows,
            "torch_version": str(torch.__version__),
            "torchvision_version": str(torchvision.__version__),
            "pillow_version": str(PIL.__version__),
        }
        out.update(self.spec.family.provenance(self.spec, self.options.preprocess))
        return out

    def compute(self, model: Trunk, store: ChunkStore, todo: list[int], root: Path) -> int:
        """Compute and save the chunks ``todo``; returns the number of images processed."""
        if not todo:
            return 0
        rows = [row for chunk in todo for row in store.rows(chunk)]
        self.check_present(root, rows)
        loader = self.loader(root, rows, store, todo)
        # channels_last is the layout cuDNN's and oneDNN's fast convolutions want (ResNet-50 on
        # the CPU: 1.4x); transformers gain nothing from it
        layout = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        model = model.to(self.device).to(memory_format=layout)
        bar = progress(total=len(rows), unit="img", desc=f"features {self.final.stem}",
                       smoothing=0.1, disable=not self.job.is_main)
        filling = 0  # the position in ``todo`` of the chunk the batches fill
        parts: list[torch.Tensor] = []
        oks: list[torch.Tensor] = []
        crops: list[torch.Tensor] = []
        with bar, torch.inference_mode(), backend_flags(self.device, self.precision):
            for images, batch_rows, ok, views in self.batches(loader):
                check_stop()
                images = self.layout(self.normalize(images))
                self.stop_on_bad(batch_rows, ok, root)
                parts.append(self.forward(model, images))
                if views is not None:
                    crops.append(self.forward_views(model, views))
                oks.append(ok)
                bar.skip(int((~ok).sum()))  # --skip-bad: flagged, not extracted
                bar.update(len(batch_rows))
                if sum(len(p) for p in parts) == len(store.rows(todo[filling])):
                    self.save(store, todo[filling], parts, oks, root, crops)
                    filling, parts, oks, crops = filling + 1, [], [], []
        return len(rows)

    def forward(self, model: Trunk, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.precision):
            return model(images).float()

    def forward_views(self, model: Trunk, views: torch.Tensor) -> torch.Tensor:
        """Tile embeddings (n * G * G, D), ``view_batch`` tiles per forward pass."""
        if not len(views):
            return views.new_zeros(0, self.spec.dim)
        return torch.cat([self.forward(model, views[i:i + self.view_batch])
                          for i in range(0, len(views), self.view_batch)])
    def save(self, store: ChunkStore, chunk: int, parts: list[torch.Tensor],
             oks: list[torch.Tensor], root: Path,
             crops: list[torch.Tensor] | tuple[torch.Tensor, ...] = (),
             extras: dict | None = None) -> None:
        features = torch.cat(parts).cpu().numpy().astype(self.dtype)
        ok = torch.cat(oks).numpy().astype(bool)
        rows = store.rows(chunk)
        broken = np.flatnonzero(ok & ~np.isfinite(features).all(axis=1))
        if broken.size:
            first = root / str(self.images[rows.start + broken[0]])
            raise FeatcacheError(
                f"the backbone gave Inf or NaN features for {plural(broken.size, 'image')} of chunk {chunk} "
                f"(first: {first}) at precision {self.precision}, stored as {self.dtype}; "
                "fp16 compute and float16 storage can overflow: use --precision bf16 or fp32 "
                "and --dtype float32"
            )
        features[~ok] = np.nan
        reasons = {rows.start + int(i): self.bad_reason(root, rows.start + int(i))["reason"]
                   for i in np.flatnonzero(~ok)}
        extras = dict(extras or {})
        if self.crops:
            tiles = torch.cat(crops).cpu().numpy().astype(self.dtype)
            tiles = tiles.reshape(store.extra_shape(chunk, "crops"))
            tiles[~ok[:len(tiles)]] = np.nan
            extras["crops"] = tiles
        write_shard(store, chunk, features, ~ok, reasons, extras)


def write_shard(store: ChunkStore, chunk: int, features: np.ndarray, bad: np.ndarray,
                reasons: dict[int, str], extras: dict | None = None) -> None:
    """Save one finished chunk (a seam for tests that interrupt a run after a chunk)."""
    store.write(chunk, features, bad, reasons, extras)
