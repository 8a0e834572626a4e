"""Open images the way the seed pipeline does: lazily. The dataset only reads the header; the
timed chain (pipebench.pipeline.timed_chain) forces the decode right after the load and times it
as its own `decode` step, so it is charged neither to the dataset nor to the first transform that
touches pixels (unless that transform decodes by itself, such as a reduced-size decode)."""

from __future__ import annotations

import io
import os
from typing import BinaryIO, Optional

from PIL import Image

from pipebench.storage.file_reads import FileReads

# The extensions torchvision's ImageFolder accepts, so a folder holds the same images
# in both. Compared lower-case.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
)


def open_rgb(path: str | os.PathLike, reads: Optional[FileReads] = None) -> Image.Image:
    """The image at `path` in mode RGB, undecoded when it is RGB already (the chain times the
    decode); any other mode (L, CMYK, P, RGBA...) is decoded and converted here, since the
    transforms expect three channels. With `reads`, the whole file is read through it first, so
    the load step holds all of the file's I/O and the decode none of it."""
    return rgb_from(io.BytesIO(reads.read(str(path))) if reads is not None else path)


def rgb_from(source: str | os.PathLike | BinaryIO) -> Image.Image:
    """The image in `source` (a path, or a file object over an encoded image such as a tar member's or
    a Parquet cell's bytes) in mode RGB, undecoded when it is RGB already (see open_rgb)."""
    img = Image.open(source)
    if img.mode == "RGB":
        return img
    with img:
        return img.convert("RGB")
