"""Small datasets written in the official layouts (VOC, COCO, CUB, NUS-WIDE) for the tests.

The writers reproduce each format's real quirks: VOC's CRLF lines with two spaces before a
positive flag, COCO's JSON with images that have no annotation, CUB's label lines with an
extra field, NUS-WIDE's Windows-style image paths.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

from featcache.data.formats.voc import VOC_CLASSES


def tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_images(root: Path, names) -> None:
    """A small real JPEG at ``root / name`` for every name."""
    data = tiny_jpeg()
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_voc(root: Path, splits: dict[str, dict[str, dict[str, int]]], year: str = "2012",
              with_images: bool = True) -> Path:
    """``<root>/VOCdevkit/VOC<year>``: per split, image id -> {class: flag}; other flags -1."""
    base = root / "VOCdevkit" / f"VOC{year}"
    main = base / "ImageSets" / "Main"
    main.mkdir(parents=True, exist_ok=True)
    for split, images in splits.items():
        for name in VOC_CLASSES:
            lines = []
            for image_id, flags in images.items():
                flag = flags.get(name, -1)
                lines.append(f"{image_id} {flag:2d}\r\n")
            (main / f"{name}_{split}.txt").write_text("".join(lines), newline="")
        (main / f"{split}.txt").write_text("".join(f"{i}\r\n" for i in images), newline="")
        if with_images:
            write_images(base / "JPEGImages", [f"{i}.jpg" for i in images])
    return base


def write_voc_annotations(base: Path, images: dict[str, tuple[int, int, list[tuple]]]) -> None:
    """``<base>/Annotations/<id>.xml``: image id -> (width, height, [(class, xmin, ymin, xmax,
    ymax, difficult), ...]), written like the devkit's files."""
    folder = base / "Annotations"
    folder.mkdir(parents=True, exist_ok=True)
    for image_id, (width, height, objects) in images.items():
        parts = [f"<annotation>\n\t<folder>VOC2012</folder>\n\t<filename>{image_id}.jpg</filename>",
                 f"\t<size>\n\t\t<width>{width}</width>\n\t\t<height>{height}</height>\n"
                 "\t\t<depth>3</depth>\n\t</size>", "\t<segmented>0</segmented>"]
        for name, xmin, ymin, xmax, ymax, difficult in objects:
            parts.append(f"\t<object>\n\t\t<name>{name}</name>\n\t\t<pose>Unspecified</pose>\n"
                         f"\t\t<truncated>0</truncated>\n\t\t<difficult>{difficult}</difficult>\n"
                         f"\t\t<bndbox>\n\t\t\t<xmin>{xmin}</xmin>\n\t\t\t<ymin>{ymin}</ymin>\n"
                         f"\t\t\t<xmax>{xmax}</xmax>\n\t\t\t<ymax>{ymax}</ymax>\n\t\t</bndbox>\n"
                         "\t</object>")
        (folder / f"{image_id}.xml").write_text("\n".join(parts) + "\n</annotation>\n")


#: a VOC2012-like fixture: train has one image with only a difficult (0) flag
VOC_SPLITS = {
    "train": {
        "2008_000008": {"horse": 1, "person": 1},
        "2008_000015": {"bottle": 1},
        "2008_000019": {"dog": 1, "cat": 0},
        "2008_000023": {"bottle": 1, "tvmonitor": 1, "person": 1},
        "2008_000028": {"car": 1},
        "2008_000033": {"aeroplane": 1},
        "2008_000036": {"bicycle": 1, "person": 1},
        "2008_000037": {"boat": 1},
        "2008_000041": {"cow": 0},  # difficult only: no positive, dropped
        "2008_000003": {"train": 1, "person": 1},
    },
    "val": {
        "2008_000002": {"tvmonitor": 1},
        "2008_000009": {"cow": 1, "person": 1},
        "2008_000021": {"sheep": 1},
        "2008_000026": {"sofa": 1, "pottedplant": 1, "person": 1},
        "2008_000032": {"aeroplane": 1, "person": 1},
        "2008_000043": {"diningtable": 1, "chair": 1},
    },
}


def write_coco(root: Path, split: str, categories: list[tuple[int, str]],
               image_ids: list[int], annotations: list[tuple], sizes: dict | None = None) -> Path:
    """``<root>/annotations/instances_<split>2014.json`` with (image id, category id) pairs, or
    (image id, category id, [x, y, w, h], area) for boxes; ``sizes`` maps ids to (w, h)."""
    path = root / "annotations" / f"instances_{split}2014.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {}
    data = {
        "info": {"description": "fixture"},
        "images": [{"id": i, "file_name": f"COCO_{split}2014_{i:012d}.jpg",
                    "width": sizes.get(i, (640, 480))[0], "height": sizes.get(i, (640, 480))[1]}
                   for i in image_ids],
        "annotations": [{"id": n, "image_id": a[0], "category_id": a[1], "iscrowd": 0,
                         "bbox": list(a[2]) if len(a) > 2 else [0, 0, 10, 10],
                         "area": a[3] if len(a) > 2 else 100.0}
                        for n, a in enumerate(annotations, start=1)],
        "categories": [{"id": i, "name": name, "supercategory": "thing"}
                       for i, name in categories],
    }
    path.write_text(json.dumps(data, indent=1))
    return path


COCO_CATEGORIES = [(1, "person"), (2, "bicycle"), (3, "car"), (18, "dog")]


def write_cub(root: Path, attributes: list[str], images: list[tuple[str, int]],
              labels: dict[tuple[int, int], int], extra_field: set[tuple[int, int]] = frozenset(),
              reverse: bool = True) -> Path:
    """The official CUB archive layout; ``images`` are (path, is_train), ids from 1.

    ``labels`` maps (image id, attribute id) to is_present; pairs in ``extra_field`` get the
    extra field some real lines carry. Lines are written in reverse order unless told not to
    (the reader must not rely on line order).
    """
    base = root / "CUB_200_2011"
    (base / "attributes").mkdir(parents=True, exist_ok=True)
    (root / "attributes.txt").write_text(
        "".join(f"{i} {name}\n" for i, name in enumerate(attributes, start=1)))
    (base / "images.txt").write_text(
        "".join(f"{i} {path}\n" for i, (path, _) in enumerate(images, start=1)))
    (base / "train_test_split.txt").write_text(
        "".join(f"{i} {train}\n" for i, (_, train) in enumerate(images, start=1)))
    lines = []
    for (image_id, attribute_id), present in sorted(labels.items()):
        extra = " 0" if (image_id, attribute_id) in extra_field else ""
        lines.append(f"{image_id} {attribute_id} {present} 3{extra} 12.5\n")
    if reverse:
        lines.reverse()
    (base / "attributes" / "image_attribute_labels.txt").write_text("".join(lines))
    return base


def write_nuswide(root: Path, concepts: list[str],
                  splits: dict[str, list[tuple[str, set[str]]]]) -> Path:
    """The official NUS-WIDE lists: per split ('Train'/'Test'), (Windows path, positives)."""
    (root / "ImageList").mkdir(parents=True, exist_ok=True)
    labels_dir = root / "Groundtruth" / "TrainTestLabels"
    labels_dir.mkdir(parents=True, exist_ok=True)
    (root / "Concepts81.txt").write_text("".join(f"{c}\n" for c in concepts))
    for split, rows in splits.items():
        (root / "ImageList" / f"{split}Imagelist.txt").write_text(
            "".join(f"{path}\r\n" for path, _ in rows), newline="")
        for concept in concepts:
            (labels_dir / f"Labels_{concept}_{split}.txt").write_text(
                "".join(f"{int(concept in positives)}\n" for _, positives in rows))
    return root


def invoke(*args: str):
    """Run ``featcache <args>`` in-process; exceptions other than clean errors propagate."""
    from click.testing import CliRunner

    from featcache.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="featcache",
                              catch_exceptions=False)


def fail_when_writing(monkeypatch, dataset: str = "val") -> None:
    """Make h5py raise an injected OSError when an HDF5 dataset named ``dataset`` is created."""
    import h5py

    original = h5py.Group.create_dataset

    def create_dataset(self, name, *args, **kwargs):
        if name == dataset:
            raise OSError("disk full (injected)")
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", create_dataset)
