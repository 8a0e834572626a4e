"""Reduced-size decode: the resizing step decodes the lazily opened JPEG itself, at 1/2, 1/4 or
1/8 scale (libjpeg's DCT scaling, through PIL's `Image.draft`) when the region it keeps still has
at least the output's pixels, then crops and resizes as the step it replaces does.

Each class subclasses the torchvision step it stands for and draws its random parameters with
that step's own code, so under one seed it picks the same crop; only the pixels differ a little
(a DCT-scaled decode is not a box filter). `pipebench explore` calls the verdict `close` and
reports the largest difference. A step that would have to go below its output size decodes in
full, so it never upsamples what the original downsampled.
"""

import math
from typing import Sequence, Tuple

import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision.transforms.functional import _compute_resized_output_size

from pipebench.pipeline.timed_chain import undecoded
from pipebench.transforms.region import params_box, pil_resample

# libjpeg's DCT scaling factors that PIL's draft picks from (it also has 1/1: no reduction).
DCT_REDUCTIONS = (8, 4, 2)


def reduction_for(region: Tuple[int, int], output: Tuple[int, int]) -> int:
    """The largest DCT reduction that keeps a (width, height) region at least (width, height) output."""
    return next((r for r in DCT_REDUCTIONS if region[0] // r >= output[0] and region[1] // r >= output[1]), 1)


def _draft(img: Image.Image, reduction: int) -> Tuple[float, float]:
    """Decode at 1/reduction when `img` is an undecoded JPEG; the (x, y) scale of what was decoded."""
    width, height = img.size
    if reduction > 1 and undecoded(img) and img.format == "JPEG":
        img.draft("RGB", (width // reduction, height // reduction))
    return img.size[0] / width, img.size[1] / height


def draft_resized_crop(img, top: int, left: int, height: int, width: int, size: Sequence[int],
                       interpolation) -> Image.Image:
    """torchvision's resized_crop of a PIL image (crop, then resize to `size` = (h, w)), decoding at
    reduced size where the crop allows. Tensors and decoded images take torchvision's own path."""
    out_h, out_w = size
    if not isinstance(img, Image.Image):
        return v2.functional.resized_crop(img, top, left, height, width, list(size), interpolation)
    sx, sy = _draft(img, reduction_for((width, height), (out_w, out_h)))
    if (sx, sy) == (1.0, 1.0):
        return img.crop((left, top, left + width, top + height)).resize((out_w, out_h), pil_resample(interpolation))
    box = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
    # Crop the whole pixels that hold the box, then resize the box's exact part of them, so the
    # filter reads no pixel outside the crop (as crop-then-resize does).
    outer = (math.floor(box[0]), math.floor(box[1]), min(img.size[0], math.ceil(box[2])),
             min(img.size[1], math.ceil(box[3])))
    inner = (box[0] - outer[0], box[1] - outer[1], box[2] - outer[0], box[3] - outer[1])
    return img.crop(outer).resize((out_w, out_h), pil_resample(interpolation), box=inner)


def draft_resize(img, size, interpolation) -> Image.Image:
    """Resize of a PIL image to `size`, decoding at reduced size where the output allows."""
    height, width = _compute_resized_output_size(img.size[::-1], [size] if isinstance(size, int) else list(size))
    out = (width, height)
    _draft(img, reduction_for(img.size, out))
    return img.resize(out, pil_resample(interpolation))


class DraftRandomResizedCrop(v1.RandomResizedCrop):
    """torchvision.transforms.RandomResizedCrop, decoding the undecoded JPEG at reduced size."""

    decodes_itself = True

    def forward(self, img):
        if not isinstance(img, Image.Image):
            return super().forward(img)
        return draft_resized_crop(img, *self.get_params(img, self.scale, self.ratio), self.size, self.interpolation)


class DraftRandomResizedCropV2(v2.RandomResizedCrop):
    """torchvision.transforms.v2.RandomResizedCrop, decoding the undecoded JPEG at reduced size."""

    decodes_itself = True

    def forward(self, *inputs):
        img = inputs[0] if len(inputs) == 1 else None
        if not isinstance(img, Image.Image):
            return super().forward(*inputs)
        return draft_resized_crop(img, *params_box(self.make_params([img])), self.size, self.interpolation)


class DraftResize(v1.Resize):
    """torchvision.transforms.Resize, decoding the undecoded JPEG at reduced size."""

    decodes_itself = True

    def forward(self, img):
        if not isinstance(img, Image.Image) or self.max_size is not None:
            return super().forward(img)
        return draft_resize(img, self.size, self.interpolation)


class DraftResizeV2(v2.Resize):
    """torchvision.transforms.v2.Resize, decoding the undecoded JPEG at reduced size."""

    decodes_itself = True

    def forward(self, *inputs):
        img = inputs[0] if len(inputs) == 1 else None
        if not isinstance(img, Image.Image) or self.max_size is not None:
            return super().forward(*inputs)
        return draft_resize(img, self.size, self.interpolation)
