"""Stage one: run the backbone once over every image and cache the pooled features.

Rows follow the labels file, official train then test, in fixed chunks (1024 rows by default,
a multiple of the batch size, so that every batch is the same whatever happened before). Each
finished chunk is saved as a shard (:mod:`featcache.features.shards`); running again computes
only the missing chunks; when all exist they are assembled with
:func:`featcache.data.featurefile.write_features` (atomic) and the shards are removed. The result
does not depend on interruptions, nor on the number of ranks under ``torchrun``.

GPU runs use autocast (bf16, or fp16 where bf16 is missing; ``fp32`` for exact fidelity, with
TF32 off), pinned memory and DataLoader workers that decode and resize with PIL (normalisation
happens on the device, on a quarter of the bytes); convolutional backbones use channels_last,
transformers ``F.scaled_dot_product_attention``. ``gpu_decode`` decodes JPEGs on the device
instead, a batch at a time and one batch ahead of the forward pass (close to, not identical
with, PIL); ``jpeg_draft`` lets PIL decode large JPEGs at a reduced scale (opt-in: the
reference decodes full size).

Vision-language backbones add, on request, the class-prompt text embeddings (``text``,
:mod:`featcache.features.text`) and the embeddings of a G x G grid of tiles of every official
training image (``crops``, AEVLP's local views), saved with each chunk like the features.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
from torch.utils.data import DataLoader

from featcache.backbones import (
    PROTOCOL,
    Uint8Normalize,
    backbone_spec,
    create_backbone,
    inputs,
    resolve_preprocess,
    transform_description,
)
from featcache.backbones.hub import library_version
from featcache.backbones.preprocess import PREPROCESS_MODES
from featcache.backbones.registry import create_text_tower
from featcache.backbones.weights import WeightsSource, describe_weights, locate_weights
from featcache.data.featurefile import (
    add_text_embeddings,
    features_file_bytes,
    read_feature_attrs,
    write_features,
)
from featcache.data.images import image_problem, image_root
from featcache.data.labelfile import LabelSet, load_labels
from featcache.errors import (
    DiskFullError,
    FeatcacheError,
    InputError,
    Interrupted,
    OptionError,
    OutputExistsError,
    plural,
)
from featcache.features import text as prompts
from featcache.features.shards import ChunkStore, stored_blocks
from featcache.fileio import (
    disk_full_message,
    free_bytes,
    human_bytes,
    is_disk_full,
    require_space,
)
from featcache.interrupt import check_stop
from featcache.paths import (
    existing_labels,
    feature_file_tag,
    feature_tag,
    features_path,
    spatial_features_path,
)
from featcache.progress import progress, say
from featcache.protocol.runs import describe_differences
from featcache.runtime import (
    PRECISIONS,
    Ranks,
    autocast,
    backend_flags,
    cpu_threads,
    default_batch_size,
    default_workers,
    describe_device,
    ranks,
    resolve_precision,
)

DTYPES = ("float32", "float16")
DEFAULT_CHUNK_ROWS = 1024


@dataclass
class ExtractOptions:
    """Settings of one extraction; ``None`` means "chosen for the device"."""

    backbone: str = "resnet50"
    weights: str | None = None  # the backbone's default (v1 for ResNets)
    image_size: int | None = None  # the backbone's default (448 for ResNets, the protocol's)
    preprocess: str = "native"
    batch_size: int | None = None
    workers: int | None = None
    precision: str = "auto"
    dtype: str | None = None  # float32 (pooled) or float16 (spatial) when not given
    device: str = "auto"
    gpu_decode: bool = False
    jpeg_draft: bool = False
    skip_bad: bool = False
    overwrite: bool = False
    images_root: str | None = None
    cache: str | None = None
    chunk_rows: int | None = None
    seed: int = 0
    download: bool | None = None
    text: bool = False
    prompts: tuple[str, ...] = ()
    class_names: str | None = None
    text_embeddings: str | None = None
    crops: int = 0
    spatial: bool = False  # store the last feature map (featcache.features.spatial)
    compression: str = "lzf"  # of spatial files: lzf, gzip or none

    def validate(self) -> None:
        """OptionError naming the first option that cannot be used (fills in the image size
        and the dtype: float32 for pooled features, float16 for ``spatial`` maps)."""
        spec = backbone_spec(self.backbone)
        self.image_size = self.image_size or spec.default_image_size
        self.dtype = self.dtype or ("float16" if self.spatial else "float32")
        checks = [
            (not (self.spatial and (self.text or self.crops)),
             "--spatial stores feature maps only; extract --text or --crops in a run without "
             "--spatial"),
            (self.compression in ("lzf", "gzip", "none"),
             f"--compression {self.compression!r}: choose one of lzf, gzip, none"),
            (self.image_size >= 32, f"--image-size must be at least 32, got {self.image_size}"),
            (self.preprocess in PREPROCESS_MODES,
             f"--preprocess {self.preprocess!r}: choose one of {', '.join(PREPROCESS_MODES)}"),
            (self.crops >= 0, f"--crops must be GxG with G >= 1, got {self.crops}"),
            (not (self.crops and (self.gpu_decode or self.jpeg_draft)),
             "--crops decodes and cuts the full-size images with PIL; drop --gpu-decode and "
             "--jpeg-draft"),
            (self.text or (self.class_names is None and self.text_embeddings is None
                           and not self.prompts),
             "--prompt, --class-names and --text-embeddings go with --text"),
            (not self.text or self.text_embeddings is not None or spec.has_text,
             f"--text: {self.backbone} has no text tower; use a vision-language backbone (clip-*, "
             "siglip-*) or give the class embeddings with --text-embeddings FILE.npy"),
            (self.batch_size is None or self.batch_size >= 1,
             f"--batch-size must be at least 1, got {self.batch_size}"),
            (self.workers is None or self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (self.precision in PRECISIONS,
             f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}"),
            (self.dtype in DTYPES, f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}"),
            (self.chunk_rows is None or self.chunk_rows >= 1,
             f"--chunk-rows must be at least 1, got {self.chunk_rows}"),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionError(message)
        spec.check_image_size(self.image_size)
        self.prompts = prompts.check_templates(self.prompts) if self.text else ()

    def file_tag(self, source: WeightsSource) -> str:
        """``<backbone>[-<weights>][-protocol]``: the features file's tag."""
        spec = backbone_spec(self.backbone)
        return feature_tag(spec.name, source.tag,
                           protocol=self.preprocess == "protocol" and spec.preprocess != PROTOCOL)


@dataclass
class ExtractResult:
    """What a run did: ``status`` is ``written``, ``up-to-date`` or ``shard`` (ranks > 0)."""

    path: Path
    status: str
    images: int = 0
    seconds: float = 0.0
    compute_seconds: float = 0.0
    device: str = ""
    precision: str = ""
    resumed_chunks: int = 0
    bad: list[dict] = field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return self.images / self.compute_seconds if self.compute_seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for the end of a run."""
        if self.status == "text-added":
            return (f"{self.path}: class-prompt embeddings added ({plural(self.images, 'class', 'classes')}); the "
                    "image features were up to date")
        if self.status == "up-to-date":
            return (f"{self.path} is up to date (built from the same labels file and settings); "
                    "nothing to do (pass --overwrite to re-extract)")
        size = self.path.stat().st_size / 1e6 if self.path.exists() else 0.0
        resumed = f", {self.resumed_chunks} chunks resumed" if self.resumed_chunks else ""
        bad = f", {len(self.bad)} bad images flagged" if self.bad else ""
        return (f"features: {plural(self.images, 'image')} in {self.compute_seconds:.1f} s "
                f"({self.images_per_second:.1f} images/s) on {self.device}, {self.precision}"
                f"{resumed}{bad}; {self.seconds:.1f} s in all -> {self.path} ({size:.1f} MB)")


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
        from featcache.features.spatial import SpatialExtraction as kind
        final = spatial_features_path(dataset, options.file_tag(source), options.cache)
    else:
        kind, final = Extraction, features_path(dataset, options.file_tag(source), options.cache)
    with ranks(options.device) as job:
        say = say if job.is_main else _quiet
        run = kind(options, labels, job, final, say)
        if final.exists() and not options.overwrite:
            return run.check_finished(source)
        return run.execute(source)


def _quiet(_message: str) -> None:
    pass


class Extraction:
    """One extraction on one rank. Its :meth:`loader`, :meth:`batches` and :meth:`forward` are
    also what ``benchmarks.extract`` times end to end."""

    def __init__(self, options: ExtractOptions, labels: LabelSet, job: Ranks, final: Path, say):
        self.options = options
        self.labels = labels
        self.job = job
        self.final = final
        self.say = say
        self.device = job.device
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
        if options.gpu_decode and options.jpeg_draft:
            raise OptionError("--jpeg-draft is a PIL option; --gpu-decode decodes on the device: "
                              "choose one")
        self.decode = "device" if options.gpu_decode else "pil-draft" if options.jpeg_draft else "pil"
        self.spec = backbone_spec(options.backbone)
        self.preprocess = resolve_preprocess(options.backbone, options.preprocess)
        self.transform = transform_description(options.image_size, options.backbone, self.decode,
                                               self.preprocess)
        self.images = np.concatenate([labels.train.images, labels.test.images])
        self.num_train = len(labels.train)
        self.normalize = Uint8Normalize(options.backbone, self.preprocess).to(self.device)
        self.crops = options.crops

    # -- finished file --------------------------------------------------------------------
    def wanted(self, source: WeightsSource) -> dict:
        """Attributes a finished file must have to count as up to date."""
        out = {
            "labels_sha256": self.labels.sha256, "backbone": self.options.backbone,
            "weights": source.name, "image_size": self.options.image_size,
            "transform": self.transform, "dtype": self.options.dtype,
        }
        if source.kind == "file":
            out["weights_sha256"] = source.sha256
        if source.kind == "random":
            out["weights_seed"] = source.seed
        if self.options.precision != "auto":
            out["precision"] = self.precision
        if self.crops:
            out["crops_grid"] = self.crops
        return out

    def text_attrs(self, source: str, sha256: str = "") -> dict:
        """The ``text`` attribute: how the class embeddings were made."""
        out = {"source": source, "classes_from": self.options.class_names or "labels file"}
        if source == "prompts":
            out["templates"] = list(self.options.prompts)
            out["ensemble"] = "mean of L2-normalised template embeddings, normalised"
        else:
            out["sha256"] = sha256
        return out

    def wanted_text(self) -> dict | None:
        if not self.options.text:
            return None
        if self.options.text_embeddings is not None:
            return {"source": f"file {self.options.text_embeddings}"}
        return {"source": "prompts", "templates": list(self.options.prompts),
                "classes_from": self.options.class_names or "labels file"}

    def check_finished(self, source: WeightsSource) -> ExtractResult:
        try:
            attrs = read_feature_attrs(self.final)
        except InputError as exc:
            raise OutputExistsError(f"{exc}; pass --overwrite to replace it") from None
        wanted = self.wanted(source)
        differ = {k: v for k, v in wanted.items() if attrs.get(k) != v}
        if differ:
            old = {k: attrs.get(k) for k in differ}
            why = ("it was built from another labels file; " if "labels_sha256" in differ else "")
            raise OutputExistsError(
                f"{self.final} exists but does not match this request ({why}"
                f"{describe_differences(old, differ)}); pass --overwrite to replace it"
            )
        wanted_text = self.wanted_text()
        have_text = attrs.get("text") or {}
        if wanted_text is not None and any(have_text.get(k) != v for k, v in wanted_text.items()):
            if not self.job.is_main:
                return ExtractResult(self.final, "shard")
            embeddings, text = self.text_embeddings(source)
            add_text_embeddings(self.final, embeddings, self.prompt_names(), text)
            return ExtractResult(self.final, "text-added", images=len(embeddings), device=str(attrs.get("device", "")),
                                 precision=str(attrs.get("precision", "")))
        return ExtractResult(self.final, "up-to-date", device=str(attrs.get("device", "")),
                             precision=str(attrs.get("precision", "")))

    # -- text -----------------------------------------------------------------------------
    def prompt_names(self) -> list[str]:
        return prompts.prompt_class_names(self.labels.classes, self.options.class_names)

    def text_embeddings(self, source: WeightsSource) -> tuple[np.ndarray, dict]:
        """(L, E) normalised class embeddings and the ``text`` attribute describing them."""
        if self.options.text_embeddings is not None:
            array, digest = prompts.load_given_embeddings(
                self.options.text_embeddings, self.labels.num_classes, self.spec.dim)
            text = self.text_attrs(f"file {self.options.text_embeddings}", digest)
            return array, text
        if source.kind not in ("random",) and source.path is None:
            source = locate_weights(source, self.options.download)
        tower = create_text_tower(self.options.backbone, source, seed=self.options.seed,
                                  image_size=self.options.image_size)
        array = prompts.encode_classes(tower, self.prompt_names(), self.options.prompts, self.device)
        del tower
        return array, self.text_attrs("prompts")

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
        model = create_backbone(self.options.backbone, source, seed=self.options.seed,
                                image_size=self.options.image_size)
        width = self.row_width(model)
        attrs = self.attributes(model)
        identity = dict(attrs, labels_sha256=self.labels.sha256, dtype=self.options.dtype)
        if self.device.type == "cpu":
            identity["cpu_threads"] = cpu_threads()
        extras = {}
        if self.crops:
            identity["crops_grid"] = self.crops
            identity["crops_batch_size"] = self.view_batch
            extras["crops"] = (self.num_train, (self.crops * self.crops, self.spec.dim))
        self.store_extras(identity, extras)
        store = ChunkStore(self.final, identity, len(self.images), self.chunk_rows, width,
                           extras=extras)
        try:
            self.job.together(lambda: store.open(self.say) if self.job.is_main else None)
            mine = [c for c in range(store.num_chunks) if c % self.job.world == self.job.rank]
            todo = store.missing(mine, self.options.dtype, accept_bad=self.options.skip_bad)
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
            resumed_chunks=resumed, bad=bad,
        )

    # -- hooks of the spatial extraction (featcache.features.spatial) -----------------------
    def row_width(self, model: torch.nn.Module) -> int:
        """Values per stored row: the pooled width here (a feature map for ``--spatial``)."""
        return self.spec.dim

    def store_extras(self, identity: dict, extras: dict) -> None:
        """Add run identity and per-chunk arrays beside the rows (none here)."""

    def write_options(self) -> dict:
        """Further arguments of ``write_features`` (none here: pooled files keep their layout)."""
        return {}

    def attributes(self, model: torch.nn.Module) -> dict:
        """Provenance recorded in the features file (and, with the labels sha256, the manifest)."""
        out = {
            "backbone": self.options.backbone,
            "backbone_tag": feature_file_tag(self.final),
            **model.weights_identity,
            "image_size": self.options.image_size,
            "transform": self.transform,
            "precision": self.precision,
            "device": describe_device(self.device),
            "batch_size": self.batch_size,
            "chunk_rows": self.chunk_rows,
            "torch_version": str(torch.__version__),
            "torchvision_version": str(torchvision.__version__),
            "pillow_version": str(PIL.__version__),
        }
        if self.spec.library != "torchvision":
            out.update({
                "library": self.spec.library, "library_model": self.spec.model,
                "library_version": library_version(self.spec.library),
                "preprocess": self.options.preprocess, "pooling": self.spec.pooling,
                "attention": "torch.nn.functional.scaled_dot_product_attention"
                             if self.spec.patch_size else "none (convolutional)",
            })
        return out

    def compute(self, model: torch.nn.Module, store: ChunkStore, todo: list[int], root: Path) -> int:
        """Compute and save the chunks ``todo``; returns the number of images processed."""
        if not todo:
            return 0
        rows = [row for chunk in todo for row in store.rows(chunk)]
        self.check_present(root, rows)
        loader = self.loader(root, rows, store, todo)
        # channels_last is the layout cuDNN's and oneDNN's fast convolutions want (ResNet-50 on
        # the CPU: 1.4x); transformers gain nothing from it
        layout = torch.channels_last if self.spec.channels_last else torch.contiguous_format
        model = model.to(self.device, memory_format=layout)
        bar = progress(total=len(rows), unit="img", desc=f"features {self.final.stem}",
                       smoothing=0.1, disable=not self.job.is_main)
        chunks = iter(todo)
        chunk, parts, oks, crops = next(chunks), [], [], []
        with bar, torch.inference_mode(), backend_flags(self.device, self.precision):
            for images, batch_rows, ok, views in self.batches(loader):
                check_stop()
                images = self.layout(self.normalize(images))
                self.stop_on_bad(batch_rows, ok, root)
                parts.append(self.forward(model, images))
                if views is not None:
                    crops.append(self.forward_views(model, views))
                oks.append(ok)
                bar.update(len(batch_rows))
                if sum(len(p) for p in parts) == len(store.rows(chunk)):
                    self.save(store, chunk, parts, oks, root, crops)
                    chunk, parts, oks, crops = next(chunks, None), [], [], []
        return len(rows)

    def loader(self, root: Path, rows: list[int], store: ChunkStore, todo: list[int]) -> DataLoader:
        """Batches never straddle chunks: each chunk is cut into batches from its first row."""
        batches, position = [], 0
        for chunk in todo:
            size = len(store.rows(chunk))
            batches += [list(range(position + i, position + min(i + self.batch_size, size)))
                        for i in range(0, size, self.batch_size)]
            position += size
        size = self.options.image_size
        workers = self.options.workers
        if workers is None:
            workers = default_workers(self.device, self.job.local_world)
        if self.crops:
            dataset = inputs.CropRows(root, self.images, size, rows, preprocess=self.preprocess,
                                      grid=self.crops, crop_rows=self.num_train)
            collate = inputs.collate_crop_rows
            batch_bytes = inputs.uint8_batch_bytes(self.batch_size, size) * (1 + self.crops ** 2)
        elif self.options.gpu_decode:
            dataset = inputs.JpegBytesRows(root, self.images, size, rows, preprocess=self.preprocess)
            collate = inputs.collate_jpeg_rows
            batch_bytes = inputs.jpeg_batch_bytes((root / str(self.images[r]) for r in rows[:64]),
                                                  self.batch_size, size)
        else:
            dataset = inputs.ImageRows(root, self.images, size, rows, draft=self.options.jpeg_draft,
                                       preprocess=self.preprocess)
            collate, batch_bytes = None, inputs.uint8_batch_bytes(self.batch_size, size)
        # two batches in flight per worker, fewer when /dev/shm is small (an error if none fits)
        prefetch = inputs.loader_prefetch(batch_bytes, workers, 2, self.job.local_world,
                                          what=f"batches of {plural(self.batch_size, 'image')} at {size} px")
        return DataLoader(
            dataset, batch_sampler=batches, num_workers=workers, collate_fn=collate,
            pin_memory=self.device.type == "cuda", worker_init_fn=inputs.worker_init,
            prefetch_factor=prefetch,
        )

    def batches(self, loader: DataLoader):
        """(uint8 images on the device, rows, ok flags, normalised tiles or None) per batch."""
        if self.options.gpu_decode:
            for images, batch_rows, ok in inputs.DeviceDecoder(loader, self.options.image_size,
                                                               self.device, self.preprocess):
                yield images, batch_rows, ok, None
            return
        if self.crops:
            for images, views, batch_rows, ok in loader:
                views = self.layout(self.normalize(views.to(self.device, non_blocking=True)))
                yield images.to(self.device, non_blocking=True), batch_rows, ok, views
            return
        for images, batch_rows, ok in loader:
            yield images.to(self.device, non_blocking=True), batch_rows, ok, None

    def layout(self, images: torch.Tensor) -> torch.Tensor:
        if self.spec.channels_last:
            return images.contiguous(memory_format=torch.channels_last)
        return images

    def forward(self, model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.precision):
            return model(images).float()

    def forward_views(self, model: torch.nn.Module, views: torch.Tensor) -> torch.Tensor:
        """Tile embeddings (n * G * G, D), ``view_batch`` tiles per forward pass."""
        if not len(views):
            return views.new_zeros(0, self.spec.dim)
        return torch.cat([self.forward(model, views[i:i + self.view_batch])
                          for i in range(0, len(views), self.view_batch)])

    def stop_on_bad(self, batch_rows: torch.Tensor, ok: torch.Tensor, root: Path) -> None:
        if self.options.skip_bad or bool(ok.all()):
            return
        row = int(batch_rows[~ok][0])
        raise InputError(f"{self.bad_reason(root, row)['message']}. Fix or replace the file, "
                         "or pass --skip-bad to flag it (NaN features) and carry on")

    def bad_reason(self, root: Path, row: int) -> dict:
        split, index = self.split_row(row)
        path = root / str(self.images[row])
        reason = image_problem(path) or "the device JPEG decoder could not decode it"
        if reason == "file does not exist" and self.labels.provenance.get("labels_only"):
            reason += (f" ({self.labels.path} was prepared with labels_only: its images were never "
                       "checked; point --images-root at the folder that holds them)")
        return {"split": split, "row": index, "image": str(self.images[row]), "reason": reason,
                "message": f"cannot read image {path} ({split} row {index} of {self.labels.path}): {reason}"}

    def save(self, store: ChunkStore, chunk: int, parts, oks, root: Path, crops=(),
             extras: dict | None = None) -> None:
        features = torch.cat(parts).cpu().numpy().astype(self.options.dtype)
        ok = torch.cat(oks).numpy().astype(bool)
        rows = store.rows(chunk)
        broken = np.flatnonzero(ok & ~np.isfinite(features).all(axis=1))
        if broken.size:
            first = root / str(self.images[rows.start + broken[0]])
            raise FeatcacheError(
                f"the backbone gave Inf or NaN features for {plural(broken.size, 'image')} of chunk {chunk} "
                f"(first: {first}) at precision {self.precision}, stored as {self.options.dtype}; "
                "fp16 compute and float16 storage can overflow: use --precision bf16 or fp32 "
                "and --dtype float32"
            )
        features[~ok] = np.nan
        reasons = {rows.start + int(i): self.bad_reason(root, rows.start + int(i))["reason"]
                   for i in np.flatnonzero(~ok)}
        extras = dict(extras or {})
        if self.crops:
            tiles = torch.cat(crops).cpu().numpy().astype(self.options.dtype)
            tiles = tiles.reshape(store.extra_shape(chunk, "crops"))
            tiles[~ok[:len(tiles)]] = np.nan
            extras["crops"] = tiles
        write_shard(store, chunk, features, ~ok, reasons, extras)

    def check_present(self, root: Path, rows: list[int]) -> None:
        """Fail early, before hours of work, when images are missing (unless ``skip_bad``)."""
        if self.options.skip_bad:
            return
        missing = [row for row in rows if not (root / str(self.images[row])).is_file()]
        if missing:
            first = self.bad_reason(root, missing[0])["message"]
            raise InputError(f"{len(missing)} of {plural(len(rows), 'image')} are missing; first: {first}. "
                             "Check --images-root, or pass --skip-bad to flag them and carry on")

    def bad_entries(self, reasons: dict[int, str]) -> list[dict]:
        """The ``bad_images`` entries of a chunk's bad rows (global row -> reason)."""
        out = []
        for row, reason in sorted(reasons.items()):
            split, index = self.split_row(row)
            out.append({"split": split, "row": index, "image": str(self.images[row]),
                        "reason": reason})
        return out

    def split_row(self, row: int) -> tuple[str, int]:
        return ("train", row) if row < self.num_train else ("test", row - self.num_train)

    def crop_bytes(self) -> int:
        """``--crops``' tile embeddings of the training images, in bytes (0 without crops)."""
        itemsize = np.dtype(self.options.dtype).itemsize
        return self.num_train * self.crops * self.crops * self.spec.dim * itemsize if self.crops else 0

    def check_space(self, store: ChunkStore, todo: list[int]) -> None:
        """Say how large the output will be, and refuse now when the disk cannot hold it: the
        chunks still to compute plus the features file, which is assembled beside them."""
        itemsize = np.dtype(self.options.dtype).itemsize
        _, share = self.unsaved(store, todo)
        chunk_bytes = int(share * (len(self.images) * store.dim * itemsize + self.crop_bytes()))
        file_bytes = self.file_bytes(store)
        free = free_bytes(self.final.parent)
        self.say(f"output: about {human_bytes(file_bytes)} for {self.final.name}, plus "
                 f"{human_bytes(chunk_bytes)} of chunks until it is assembled; "
                 f"{human_bytes(free)} free in {self.final.parent}")
        require_space(self.final.parent, chunk_bytes + file_bytes,
                      f"to extract the features of {plural(len(self.images), 'image')}", file_bytes)

    def unsaved(self, store: ChunkStore, todo: list[int]) -> tuple[set[int], float]:
        """The chunks still to compute (or not yet on disk), and their share of the images."""
        chunks = {c for c in range(store.num_chunks) if not store.path(c).exists()} | set(todo)
        return chunks, sum(len(store.rows(c)) for c in chunks) / max(1, len(self.images))

    def file_bytes(self, store: ChunkStore) -> int:
        return features_file_bytes(self.images, store.dim, self.options.dtype) + self.crop_bytes()

    def assemble(self, store: ChunkStore, attrs: dict, text=None) -> list[dict]:
        """Write the features file from all shards (their features read chunk by chunk, never
        all in memory beside the file being built); returns the bad images recorded."""
        n_train, n_test = len(self.labels.train), len(self.labels.test)
        extra = {}
        if self.crops:
            crops = np.empty((n_train, self.crops * self.crops, store.dim), dtype=self.options.dtype)
            extra["train/crops"] = crops
            attrs = dict(attrs, crops_grid=self.crops,
                         crops="tiles of a GxG grid of each training image (AEVLP's local views)")
        if text is not None:
            extra["text/embeddings"], attrs = text[0], dict(attrs, text=text[1])
            extra["text/classes"] = np.asarray(self.prompt_names(), dtype=object)
        flags = np.zeros(n_train + n_test, dtype=bool)
        bad = []
        for chunk in range(store.num_chunks):
            # the features are read (and checked) once more when they are streamed into the file
            shard = store.require(chunk, self.options.dtype, features=False)
            rows = store.rows(chunk)
            flags[rows.start:rows.stop] = shard.bad
            if self.crops:
                part = store.extra_rows(chunk, "crops")
                crops[part.start:part.stop] = shard.extras["crops"]
            bad += self.bad_entries(shard.reasons)
        attrs = dict(attrs, bad_images=bad, num_bad_images=len(bad))
        kept = (f"the previous {self.final.name} (if any) is untouched and the computed chunks "
                f"are kept in {store.dir}")
        try:
            write_features(
                self.final, self.labels,
                {"train": stored_blocks(store, 0, n_train, self.options.dtype),
                 "test": stored_blocks(store, n_train, n_train + n_test, self.options.dtype)}, attrs,
                bad={"train": flags[:n_train], "test": flags[n_train:]},
                overwrite=True, dtype=self.options.dtype, extra=extra, **self.write_options(),
            )
        except OSError as exc:
            if is_disk_full(exc):
                message = str(exc) if isinstance(exc, DiskFullError) else disk_full_message(
                    exc, self.final)
                raise DiskFullError(f"{message} ({kept}: only the assembly is left to do)") from exc
            raise FeatcacheError(f"could not write {self.final}: {exc}. {kept[0].upper()}{kept[1:]}"
                                 "; fix the problem and run the same command again") from exc
        return bad


def write_shard(store: ChunkStore, chunk: int, features, bad, reasons, extras=None) -> None:
    """Save one finished chunk (a seam for tests that interrupt a run after a chunk)."""
    store.write(chunk, features, bad, reasons, extras)


def default_chunk_rows(batch_size: int) -> int:
    """About 1024 rows, a whole number of batches."""
    return batch_size * max(1, round(DEFAULT_CHUNK_ROWS / batch_size))
