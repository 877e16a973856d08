"""Object boxes of one image, as the label-bias samplers read them (:mod:`featcache.data.bias`).

Every reader that has boxes (COCO's ``instances_*.json``, VOC's ``Annotations/<id>.xml``, the
generated ``shapes`` set) turns them into one :class:`ImageObjects` per image, in the order the
source lists them: the class column of each object, its box in COCO's convention (x, y, width,
height in pixels, x and y the top-left corner), its area, and the image's width and height.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ImageObjects:
    """The annotated objects of one image, in source order."""

    width: float
    height: float
    #: class column (protocol order) of each object
    classes: list[int] = field(default_factory=list)
    #: (x, y, w, h) of each object, top-left corner and size in pixels (COCO's ``bbox``)
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)
    #: each object's area in pixels (COCO: the annotation's ``area`` field; VOC: the box's)
    areas: list[float] = field(default_factory=list)

    def add(self, column: int, box: tuple[float, float, float, float], area: float) -> None:
        self.classes.append(int(column))
        x, y, width, height = box
        self.boxes.append((float(x), float(y), float(width), float(height)))
        self.areas.append(float(area))

    def __len__(self) -> int:
        return len(self.classes)

    def only(self, columns: set[int]) -> ImageObjects:
        """The objects whose class is in ``columns`` (e.g. the image's positive classes)."""
        kept = ImageObjects(self.width, self.height)
        for column, box, area in zip(self.classes, self.boxes, self.areas, strict=True):
            if column in columns:
                kept.add(column, box, area)
        return kept

    def to_json(self) -> dict:
        return {"width": self.width, "height": self.height,
                "objects": [{"class": c, "bbox": list(b), "area": a}
                            for c, b, a in zip(self.classes, self.boxes, self.areas, strict=True)]}


def voc_box(xmin: float, ymin: float, xmax: float, ymax: float) -> tuple[float, float, float, float]:
    """A VOC box (1-based, inclusive pixel corners) as COCO's (x, y, w, h): the usual conversion
    ``x = xmin - 1``, ``w = xmax - xmin + 1``."""
    return (xmin - 1.0, ymin - 1.0, xmax - xmin + 1.0, ymax - ymin + 1.0)
