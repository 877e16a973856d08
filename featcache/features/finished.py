"""Whether an existing features file already answers the request (same labels file and
settings), and adding class-prompt embeddings to a finished file that lacks them."""

from __future__ import annotations

from pathlib import Path

from featcache.backbones.weights import WeightsSource
from featcache.data.featurefile import read_feature_attrs
from featcache.data.featurewrite import add_text_embeddings
from featcache.errors import InputError, OutputExistsError
from featcache.features.class_text import ClassText
from featcache.features.options import ExtractResult
from featcache.protocol.runs import describe_differences
from featcache.runtime import Ranks


class FinishedFile(ClassText):
    """The up-to-date check of an :class:`~featcache.features.extraction.Extraction`."""

    final: Path
    job: Ranks
    precision: str
    transform: dict
    crops: int
    dtype: str

    def wanted(self, source: WeightsSource) -> dict:
        """Attributes a finished file must have to count as up to date."""
        out = {
            "labels_sha256": self.labels.sha256, "backbone": self.options.backbone,
            "weights": source.name, "image_size": self.image_size,
            "transform": self.transform, "dtype": self.dtype,
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
