"""The class-prompt text embeddings a vision-language extraction adds (``--text``): from the
backbone's text tower over the prompt templates, or from a given ``.npy`` file."""

from __future__ import annotations

import numpy as np
import torch

from featcache.backbones import BackboneSpec
from featcache.backbones.registry import create_text_tower
from featcache.backbones.weights import WeightsSource, locate_weights
from featcache.data.labelfile import LabelSet
from featcache.features import text as prompts
from featcache.features.options import ExtractOptions


class ClassText:
    """The ``--text`` part of an :class:`~featcache.features.extraction.Extraction`."""

    options: ExtractOptions
    labels: LabelSet
    spec: BackboneSpec
    device: torch.device
    image_size: int

    def text_attrs(self, source: str, sha256: str = "") -> dict:
        """The ``text`` attribute: how the class embeddings were made."""
        out: dict[str, object] = {"source": source,
                                  "classes_from": self.options.class_names or "labels file"}
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
                                  image_size=self.image_size)
        array = prompts.encode_classes(tower, self.prompt_names(), self.options.prompts, self.device)
        del tower
        return array, self.text_attrs("prompts")
