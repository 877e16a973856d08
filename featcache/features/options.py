"""Stage one's settings (:class:`ExtractOptions`, checked by ``validate``) and what a run did
(:class:`ExtractResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from featcache.backbones import PROTOCOL, backbone_spec
from featcache.backbones.preprocess import PREPROCESS_MODES
from featcache.backbones.weights import WeightsSource
from featcache.errors import OptionError, plural
from featcache.features import text as prompts
from featcache.paths import feature_tag
from featcache.runtime import PRECISIONS

DTYPES = ("float32", "float16")

DEFAULT_CHUNK_ROWS = 1024
#: how a run's summary names its decoder
DECODED = {"pil": ", decoded with PIL", "pil-draft": ", decoded with PIL (--jpeg-draft)",
           "device": ", JPEGs decoded on the device"}


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
    gpu_decode: bool | None = None  # True: JPEGs on the device; False: PIL; None: auto (decoder.py)
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
        self.image_size = self.input_size()
        self.dtype = self.storage_dtype()
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

    def input_size(self) -> int:
        """``image_size``, else the backbone's default."""
        return self.image_size or backbone_spec(self.backbone).default_image_size

    def storage_dtype(self) -> str:
        """``dtype``, else float32 for pooled features and float16 for ``spatial`` maps."""
        return self.dtype or ("float16" if self.spatial else "float32")

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
    decode: str = ""  # pil, pil-draft or device
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
        bad = f", {plural(len(self.bad), 'bad image')} flagged" if self.bad else ""
        return (f"features: {plural(self.images, 'image')} in {self.compute_seconds:.1f} s "
                f"({self.images_per_second:.1f} images/s) on {self.device}, {self.precision}"
                f"{DECODED.get(self.decode, '')}{resumed}{bad}; {self.seconds:.1f} s in all -> {self.path} ({size:.1f} MB)")


def default_chunk_rows(batch_size: int) -> int:
    """About 1024 rows, a whole number of batches."""
    return batch_size * max(1, round(DEFAULT_CHUNK_ROWS / batch_size))
