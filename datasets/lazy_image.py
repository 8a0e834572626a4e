"""Open images the way the seed pipeline does: lazily. The dataset only reads the header; the
timed chain (pipebench.pipeline.timed_chain) forces the decode right after the load and times it
as its own `decode` step, so it is charged neither to the dataset nor to the first transform that
touches pixels (unless that transform decodes by itself, such as a reduced-size decode)."""

from __future__ import annotations

import os

from PIL import Image

# The extensions torchvision's ImageFolder accepts, so a folder holds the same images
# in both. Compared lower-case.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
)


def open_rgb(path: str | os.PathLike) -> Image.Image:
    """Return the image at `path` in mode RGB.

    An RGB file is returned undecoded (`PIL.Image.open` only reads the header): in the seed's
    own loop the decode cost lands on the first pixel access, so reordering RandomCrop before
    PILToTensor moved it under RandomCrop; pipebench times it as `decode`. Any other mode
    (L, CMYK, P, RGBA, ...) is decoded and converted here, since the transforms expect
    three channels; reading `mode` does not decode.
    """
    img = Image.open(path)
    if img.mode == "RGB":
        return img
    with img:
        return img.convert("RGB")
