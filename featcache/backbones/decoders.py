"""Stage one's decoders and how a features file's recorded transform names them, without
torch: ``featcache info`` reads them back on a machine that has not imported it."""

from __future__ import annotations

#: stage one's decoders: PIL (the reference's), PIL with JPEG draft scaling (``--jpeg-draft``),
#: and JPEGs decoded on the device (``--gpu-decode``)
DECODERS = ("pil", "pil-draft", "device")
#: the ``decode`` entry of a recorded transform, for the decoders whose text has no size in it
DECODE_TEXT = {"pil": "PIL.Image.open(path).convert('RGB')",
               "device": "torchvision.io.decode_jpeg on the device (PIL for other files)"}
DRAFT_TEXT = "PIL.Image.open(path), draft("


def recorded_decoder(description: dict) -> str | None:
    """Which of :data:`DECODERS` made a recorded transform (None: none of them, or no record)."""
    text = description.get("decode")
    if not isinstance(text, str):
        return None
    if text.startswith(DRAFT_TEXT):
        return "pil-draft"
    return next((name for name, known in DECODE_TEXT.items() if text == known), None)
