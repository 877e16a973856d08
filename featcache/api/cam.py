"""Class activation maps (CAM, Zhou et al. CVPR 2016) of a run's linear head, and their figure.

A ResNet's pooled feature is the average over positions of its spatial map F (D x h x w)
(``trunk.feature_map``), and the head is linear, so the logit of class c is exactly the
average over positions of ``W_c . F[:, i, j] + b_c``. That per-position logit is the class's
activation map: nothing is approximated, and its mean is the logit ``featcache predict``
gives. Trunks that pool otherwise (``trunk.pooling``: a ViT's class token, SigLIP's attention
pooling, ConvNeXt's norm after the average) map the head over their patch tokens or
normalised positions instead, MaskCLIP-style: the map shows where the head responds, and the
logit shown is the pooled path's. Maps are upsampled bilinearly to the part of the image the
backbone saw (all of it after a squash resize; the centre crop of a ``center`` preprocessing,
the rest of the image left at the map's minimum), scaled to [0, 1] per map (CAM's usual
display), then multiplied by the class's probability (a class the head rules out shows no
spot), and overlaid on the image in a perceptual colour map (magma) with one colour bar.
Several runs side by side (``featcache cam --run A --run B``) make the figure Kim et al.'s supplement uses to show what large-loss rejection changes. For a
BoostLU run (Kim et al. 2023) the maps are its class activation maps before boosting, and the
logit shown is the boosted one its predictions use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from featcache.backbones import Preprocess, Uint8Normalize, resize_transform
from featcache.data.images import DECODE_ERRORS, image_problem, load_rgb, require_strict_pil
from featcache.errors import InputError, OptionError, unknown_name
from featcache.fileio import atomic_output
from featcache.heads import HeadModule, map_rows
from featcache.runtime import pick_device

#: the PNG "Software" text of a CAM figure (how `featcache report` tells it from other PNGs)
CAM_SOFTWARE = "featcache cam"
#: the PNG text that lists the runs of a CAM figure, one row each (JSON: ``runs/an/demo``, ...)
CAM_RUNS = "featcache runs"


@dataclass
class ClassMap:
    """One class's activation map on one image: logits per pixel of the original image."""

    name: str
    probability: float
    logit: float
    logits: np.ndarray  # (H, W), upsampled per-position logits

    def normalised(self) -> np.ndarray:
        """The map scaled to [0, 1] (min to max), CAM's usual display of its shape."""
        low, high = float(self.logits.min()), float(self.logits.max())
        return (self.logits - low) / (high - low) if high > low else np.zeros_like(self.logits)

    def shown(self) -> np.ndarray:
        """What the figure draws: the normalised map times the class's probability, so the
        brightest spot of a class at p = 0.9 is 0.9 and a class at p = 0.00 shows nothing."""
        return (self.normalised() * np.float32(self.probability)).astype(np.float32)


@dataclass
class RunMaps:
    """A run's maps on one image."""

    label: str
    image: np.ndarray  # (H, W, 3) uint8, the image as decoded
    probabilities: dict[str, float]
    maps: list[ClassMap]
    #: the run's folder under its dataset's: ``runs/an/demo``, ``finetune/role/demo``
    run: str = ""


def read_image(path: str | Path):
    """The image decoded as the reference does; a bad file is named with the reason."""
    require_strict_pil()
    try:
        return load_rgb(path)
    except DECODE_ERRORS:
        raise InputError(f"cannot read image {path}: {image_problem(path)}") from None


def logit_maps(run, image, device: torch.device) -> tuple[torch.Tensor, np.ndarray]:
    """(per-position logits (L, h, w) on the CPU, logits (L,) of the pooled path) for a PIL
    image through ``run``'s trunk and head."""
    trunk = run.trunk()
    if not hasattr(trunk, "feature_map"):
        raise OptionError(f"the {run.backbone} backbone exposes no spatial feature map "
                          "(feature_map), so it has no class activation maps")
    trunk = trunk.to(device)
    preprocess = run.preprocess
    batch = resize_transform(run.image_size, preprocess)(image).unsqueeze(0).to(device)
    batch = Uint8Normalize(run.backbone, preprocess).to(device)(batch)
    weight, bias = run.head
    head = HeadModule.create(run.head_kind, weight.shape[1], weight.shape[0], run.head_params,
                             weight=weight, bias=bias)
    with torch.inference_mode():
        spatial = trunk.feature_map(batch).float()[:1].cpu()  # (1, D, h, w)
        maps = head.cam_and_logits(spatial)[0][0]
        if run.head_kind.spatial:  # BoostLU: the logit is the boosted mean of these maps
            return maps, run.logits(map_rows(spatial)[0].numpy())[0]
        if getattr(trunk, "pooling", "avg") == "avg":
            pooled = spatial[0].mean(dim=(1, 2), keepdim=False)[None].numpy()
        else:
            pooled = trunk(batch).float().cpu().numpy()
    return maps, run.logits(pooled)[0]


def seen_box(size: tuple[int, int], image_size: int, preprocess: Preprocess) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the part of an image of ``size`` (H, W) the backbone saw:
    all of it after a squash resize, the centre crop otherwise (torchvision's Resize to the
    shorter side, then CenterCrop's rounding)."""
    height, width = size
    if preprocess.resize == "squash":
        return 0, 0, height, width
    short = preprocess.scale_size(image_size)
    if height <= width:
        new_h, new_w = short, int(short * width / height)
    else:
        new_h, new_w = int(short * height / width), short
    top = int(round((new_h - image_size) / 2.0))
    left = int(round((new_w - image_size) / 2.0))
    scale_h, scale_w = height / new_h, width / new_w
    return (round(top * scale_h), round(left * scale_w),
            max(1, round(image_size * scale_h)), max(1, round(image_size * scale_w)))


def upsample_maps(maps: torch.Tensor, size: tuple[int, int], image_size: int,
                  preprocess: Preprocess) -> np.ndarray:
    """Maps (k, h, w) -> (k, H, W) over the image: bilinear over the part the backbone saw,
    the map's minimum elsewhere."""
    top, left, height, width = seen_box(size, image_size, preprocess)
    inside = F.interpolate(maps[None], size=(height, width), mode="bilinear",
                           align_corners=False)[0].numpy()
    if (top, left, height, width) == (0, 0, *size):
        return inside
    out = np.empty((maps.shape[0], *size), dtype=inside.dtype)
    out[:] = inside.reshape(len(inside), -1).min(axis=1)[:, None, None]
    bottom, right = min(size[0], top + height), min(size[1], left + width)
    out[:, top:bottom, left:right] = inside[:, :bottom - top, :right - left]
    return out


def class_activation_maps(run, path: str | Path, classes: Sequence[str] | None = None,
                          top: int = 3, device: str = "cpu", label: str | None = None) -> RunMaps:
    """Maps of ``classes`` (names), or of the ``top`` most probable classes, on one image."""
    run.require_images()
    image = read_image(path)
    maps, logits = logit_maps(run, image, pick_device(device))
    probs = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    names = run.classes
    if classes:
        for name in classes:
            if name not in names:
                raise OptionError(unknown_name("class", name, names, plural="classes",
                                               listing=f"the classes of {run.path}"))
        chosen = [names.index(name) for name in classes]
    else:
        if top < 1:
            raise OptionError(f"--top must be at least 1, got {top}")
        chosen = list(np.argsort(-probs, kind="stable")[:top])
    size = (image.height, image.width)
    upsampled = upsample_maps(maps[chosen], size, run.image_size, run.preprocess)
    return RunMaps(
        label=label or (f"{run.loss}, {'fine-tuned' if run.stage == 'finetune' else 'linear'}"
                        f"\n{run.path.name}, test mAP {run.metrics['test_map']:.1f}"),
        image=np.asarray(image),
        probabilities={n: float(p) for n, p in zip(names, probs, strict=True)},
        maps=[ClassMap(names[i], float(probs[i]), float(logits[i]), upsampled[k])
              for k, i in enumerate(chosen)],
        run="/".join(Path(run.path).resolve().parts[-3:]))


#: the default colour map: perceptually uniform, dark (nothing) to bright (a confident class)
CMAP = "magma"


def maps_figure(rows: Sequence[RunMaps], title: str = "", alpha: float = 0.6,
                cmap: str = CMAP):
    """One row per run: the image, then each class's map over it (:meth:`ClassMap.shown`: its
    shape scaled by the class's probability, so an unlikely class shows no spot), each panel
    titled with the class and its probability, and one colour bar for all of them. The map's
    opacity grows with its value, so the image shows through where the map is near 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 1 + max(len(r.maps) for r in rows)
    height, width = rows[0].image.shape[:2]
    panel = 2.6
    fig, axes = plt.subplots(len(rows), columns, squeeze=False, dpi=110,
                             figsize=(panel * columns + 0.8,
                                      panel * len(rows) * height / width + 0.5))
    shown = None
    for r, row in enumerate(rows):
        axes[r][0].imshow(row.image)
        axes[r][0].set_ylabel(row.label, fontsize=8)
        axes[r][0].set_title("input" if r == 0 else "", fontsize=9)
        for c, class_map in enumerate(row.maps, start=1):
            values = class_map.shown()
            axes[r][c].imshow(row.image)
            shown = axes[r][c].imshow(values, cmap=cmap, vmin=0, vmax=1,
                                      alpha=np.clip(alpha * (0.25 + values), 0, 1))
            axes[r][c].set_title(f"{class_map.name}  p = {class_map.probability:.2f}", fontsize=9)
        for c in range(columns):
            axes[r][c].set_xticks([])
            axes[r][c].set_yticks([])
            if c > len(row.maps):
                axes[r][c].axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.92, 1))
    if shown is not None:
        bar = fig.colorbar(matplotlib.cm.ScalarMappable(shown.norm, shown.get_cmap()),
                           cax=fig.add_axes((0.93, 0.15, 0.015, 0.7)))
        bar.ax.set_ylabel("map (0 to 1 within the image) x class probability", fontsize=7)
        bar.ax.tick_params(labelsize=7)
    return fig


def draw_maps(rows: Sequence[RunMaps], out: str | Path, title: str = "", alpha: float = 0.6,
              cmap: str = CMAP, overwrite: bool = False) -> Path:
    """:func:`maps_figure` saved as a PNG, atomically."""
    import matplotlib.pyplot as plt

    fig = maps_figure(rows, title, alpha, cmap)
    out = Path(out)
    # what `featcache report` needs to find the figure and say what it shows
    metadata = {"Software": CAM_SOFTWARE, "Title": title,
                "Description": "; ".join(row.label for row in rows),
                CAM_RUNS: json.dumps([row.run for row in rows])}
    with atomic_output(out, overwrite=overwrite) as tmp:
        fig.savefig(tmp, format="png", metadata=metadata)
    plt.close(fig)
    return out
