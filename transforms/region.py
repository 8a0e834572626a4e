"""Region decode: a crop that decodes only its own box of the JPEG (the `region_decode` move).

Each class subclasses the torchvision crop it stands for (v1 and v2) and takes its arguments. Given
the lazily opened JPEG (undecoded: only its header is read), it draws the box from the header size
with that crop's own sampler (`get_params` / `make_params`, the global torch RNG), so under one seed
it picks the box the crop would pick; it then decodes only that box with nvImageCodec's CPU backend
(pipebench.transforms.region_codec) and returns a uint8 [3, h, w] tensor, as DecodeJpeg and then the
crop give. RandomResizedCrop resizes the region as the step it replaces did: with PIL when that ran
on the PIL image (`pil_resize`), with torchvision's tensor kernel when it ran on the decoded tensor.

Anything the region decode does not take falls back to the whole decode the move replaced
(DecodeJpeg) and the crop's own code on the tensor, with the box already drawn: a PNG or a decoded
image, a CMYK or 12-bit JPEG, a stream nvImageCodec cannot parse (a corrupt file then fails in
DecodeJpeg, and the bad-sample policy counts it), and a crop that pads (`padding`, or
`pad_if_needed` on a small image), which keeps the transform's own behaviour.
"""

import functools
import math
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision.transforms.functional import (
    InterpolationMode,
    _compute_resized_output_size,
    pil_modes_mapping,
    pil_to_tensor,
)

from pipebench.pipeline.movement import PIL_ONLY, TENSOR, Movement
from pipebench.pipeline.timed_chain import undecoded
from pipebench.transforms.decode import PIL_JPEG_FORMAT, DecodeJpeg, jpeg_bytes
from pipebench.transforms.region_codec import RegionCodec

Box = Tuple[int, int, int, int]
# What every region form declares: it takes the undecoded image and returns the uint8 tensor (as
# DecodeJpeg does); random, as the crop it draws for (CenterCrop's form overrides this).
REGION_MOVEMENT = Movement(accepts=PIL_ONLY, returns=TENSOR, random=True)


class _Region:
    """The decode half every region form shares: a per-process codec and the full-decode fallback."""

    # The timed chain leaves the lazily opened image undecoded for it (pipebench.pipeline.timed_chain).
    decodes_itself = True

    @functools.cached_property
    def _codec(self) -> RegionCodec:
        """This process's codec, made at the first region (kept in the instance's own dict, never set
        through torch.nn.Module's attribute handling)."""
        return RegionCodec()

    def _region(self, img: Any, box: Box) -> Optional[torch.Tensor]:
        """The box (top, left, height, width) of the undecoded JPEG `img`, or None when not taken."""
        if not (isinstance(img, Image.Image) and undecoded(img) and img.format == PIL_JPEG_FORMAT):
            return None
        data = jpeg_bytes(img)
        return None if data is None else self._codec.decode(data, *box)

    def _boxed(self, inputs: Sequence[Any], own_forward: Callable[..., Any]) -> Any:
        """A crop's output: the region of the box it draws for its one input (the whole decode
        cropped where the codec does not take the file); its own forward on the whole decode where
        it would pad, or where v2 passes it several inputs."""
        img = inputs[0] if len(inputs) == 1 else None
        box = None if img is None else self.box(img)
        if box is None:
            return own_forward(*(self._whole(i) for i in inputs))
        return self._boxed_pixels(img, box)

    def _boxed_pixels(self, img: Any, box: Box) -> torch.Tensor:
        """The box of `img`: its region, or the whole decode cropped where the codec does not take it."""
        region = self._region(img, box)
        if region is not None:
            return region
        top, left, height, width = box
        return self._whole(img)[..., top:top + height, left:left + width]

    @staticmethod
    def _whole(img: Any) -> Any:
        """The full decode the move replaced: DecodeJpeg (a tensor passes through)."""
        return img if isinstance(img, torch.Tensor) else DecodeJpeg()(img)


def params_box(params: dict) -> Box:
    """A v2 crop's make_params as a (top, left, height, width) box (torchvision hands a dict)."""
    return params["top"], params["left"], params["height"], params["width"]


def _size_of(img: Any) -> Tuple[int, int]:
    """(height, width) of a PIL image (its header) or a [..., H, W] tensor."""
    return (img.size[1], img.size[0]) if isinstance(img, Image.Image) else tuple(img.shape[-2:])


def _pads(img: Any, size: Sequence[int], padding: Any, pad_if_needed: bool) -> bool:
    """RandomCrop would pad this image: a `padding` (an int or a sequence), or `pad_if_needed` on a small one."""
    height, width = _size_of(img)
    padded = bool(padding) if isinstance(padding, int) else padding is not None and any(padding)
    return padded or (pad_if_needed and (height < size[0] or width < size[1]))


class RegionRandomCrop(_Region, v1.RandomCrop):
    """torchvision.transforms.RandomCrop, decoding only its box of the JPEG."""

    movement = REGION_MOVEMENT

    def box(self, img: Any) -> Optional[Box]:
        """The box this crop draws for `img` (its own sampler), or None when it would pad."""
        if _pads(img, self.size, self.padding, self.pad_if_needed):
            return None
        return self.get_params(img, self.size)

    def forward(self, img):
        return self._boxed((img,), super().forward)  # padding: the transform's own, then its draw


class RegionRandomCropV2(_Region, v2.RandomCrop):
    """torchvision.transforms.v2.RandomCrop, decoding only its box of the JPEG."""

    movement = REGION_MOVEMENT

    def box(self, img: Any) -> Optional[Box]:
        """The box this crop draws for `img` (its own sampler), or None when it would pad."""
        if _pads(img, self.size, self.padding, self.pad_if_needed):
            return None
        return params_box(self.make_params([img]))

    def forward(self, *inputs):
        return self._boxed(inputs, super().forward)


def center_box(image: Tuple[int, int], size: Sequence[int]) -> Optional[Box]:
    """CenterCrop's box of an (h, w) image, torchvision's rounding; None when it would pad."""
    height, width = image
    crop_h, crop_w = size
    if crop_h > height or crop_w > width:
        return None
    return int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w


class _RegionCenter(_Region):
    """CenterCrop's region form (v1 and v2): not random."""

    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)

    def box(self, img: Any) -> Optional[Box]:
        """The centre box of `img`, or None when the crop is larger than the image (it pads)."""
        return center_box(_size_of(img), self.size)

    def forward(self, *inputs):
        return self._boxed(inputs, super().forward)


class RegionCenterCrop(_RegionCenter, v1.CenterCrop):
    """torchvision.transforms.CenterCrop, decoding only its box of the JPEG."""


class RegionCenterCropV2(_RegionCenter, v2.CenterCrop):
    """torchvision.transforms.v2.CenterCrop, decoding only its box of the JPEG."""


def pil_resample(interpolation: Any) -> int:
    """PIL's resampling filter for a torchvision interpolation (the enum or its name)."""
    return pil_modes_mapping[_mode(interpolation)]


def resize_region(region: torch.Tensor, size: Sequence[int], interpolation: Any, antialias: Any,
                  pil_resize: bool) -> torch.Tensor:
    """The region resized to `size` (h, w): with PIL (as a crop of the PIL image would be), or with
    torchvision's tensor kernel; uint8 [3, h, w] either way."""
    if not pil_resize:
        return v2.functional.resize(region, list(size), interpolation=interpolation, antialias=antialias)
    image = Image.fromarray(region.permute(1, 2, 0).numpy())
    resized = image.resize((size[1], size[0]), pil_resample(interpolation))
    return pil_to_tensor(resized)


class _RegionResized(_Region):
    """RandomResizedCrop's region form (v1 and v2): its box decoded, then resized as the step it
    replaced resized it."""

    movement = REGION_MOVEMENT

    def __init__(self, *args: Any, pil_resize: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pil_resize = pil_resize

    def _resized(self, img: Any) -> torch.Tensor:
        region = self._boxed_pixels(img, self.box(img))
        return resize_region(region, self.size, self.interpolation, self.antialias, self.pil_resize)


class RegionRandomResizedCrop(_RegionResized, v1.RandomResizedCrop):
    """torchvision.transforms.RandomResizedCrop, decoding only its box of the JPEG, then resizing it."""

    def box(self, img: Any) -> Box:
        """The box this crop draws for `img` (its own sampler; always inside the image)."""
        return self.get_params(img, self.scale, self.ratio)

    def forward(self, img):
        return self._resized(img)


class RegionRandomResizedCropV2(_RegionResized, v2.RandomResizedCrop):
    """torchvision.transforms.v2.RandomResizedCrop, decoding only its box of the JPEG, then resizing it."""

    def box(self, img: Any) -> Box:
        """The box this crop draws for `img` (its own sampler; always inside the image)."""
        return params_box(self.make_params([img]))

    def forward(self, *inputs):
        if len(inputs) != 1:
            return super().forward(*(self._whole(i) for i in inputs))
        return self._resized(inputs[0])


# How far each PIL resampling filter reads from an output pixel's centre, in source pixels at scale 1
# (PIL's own filter supports, libImaging/Resample.c); a downscale by s widens it s times.
FILTER_SUPPORT = {InterpolationMode.NEAREST: 0.5, InterpolationMode.BOX: 0.5, InterpolationMode.BILINEAR: 1.0,
                  InterpolationMode.HAMMING: 1.0, InterpolationMode.BICUBIC: 2.0, InterpolationMode.LANCZOS: 3.0}
# Source pixels added beyond the filter's reach on each side: PIL rounds a tap's first and last index to
# the nearest pixel, so one more keeps every tap inside the region.
SUPPORT_SLACK = 1


def resize_crop_window(image: Tuple[int, int], size: Any, crop: Sequence[int], max_size: Optional[int]
                       ) -> Optional[Tuple[Tuple[int, int], Box]]:
    """((resized h, w), the centre box of the resized image) that Resize(size) then CenterCrop(crop)
    keep of an (h, w) image, torchvision's sizes and rounding; None when the crop would pad."""
    sizes = [size] if isinstance(size, int) else list(size)
    resized = tuple(_compute_resized_output_size(image, sizes, max_size))
    box = center_box(resized, crop)
    return None if box is None else (resized, box)


def source_region(image: Tuple[int, int], resized: Tuple[int, int], box: Box, interpolation: Any) -> Box:
    """The box of the source image (top, left, height, width) the resize reads for the output `box` of
    the `resized` image: the window mapped back by the scale, widened by the filter's support, clipped."""
    bounds = []
    for axis, (start, length) in enumerate(((box[0], box[2]), (box[1], box[3]))):
        scale = image[axis] / resized[axis]
        reach = FILTER_SUPPORT[_mode(interpolation)] * max(scale, 1.0) + SUPPORT_SLACK
        low = max(0, math.floor(start * scale - reach))
        high = min(image[axis], math.ceil((start + length) * scale + reach))
        bounds.append((low, high - low))
    return bounds[0][0], bounds[1][0], bounds[0][1], bounds[1][1]


def _mode(interpolation: Any) -> InterpolationMode:
    return interpolation if isinstance(interpolation, InterpolationMode) else InterpolationMode(interpolation)


def resize_window(region: torch.Tensor, origin: Tuple[int, int], image: Tuple[int, int],
                  resized: Tuple[int, int], box: Box, interpolation: Any) -> torch.Tensor:
    """The output `box` of `image` resized to `resized`, computed from `region` (the source pixels from
    `origin`, top-left): PIL's resample with the full resize's scale, its window given in the region's
    coordinates, so each output pixel sits where the full resize puts it. uint8 [3, h, w]."""
    top, left, height, width = box
    scale_y, scale_x = image[0] / resized[0], image[1] / resized[1]
    window = (left * scale_x - origin[1], top * scale_y - origin[0],
              (left + width) * scale_x - origin[1], (top + height) * scale_y - origin[0])
    pil = Image.fromarray(region.permute(1, 2, 0).contiguous().numpy())
    return pil_to_tensor(pil.resize((width, height), pil_resample(interpolation), box=window))


class _RegionResizeCenterCrop(_Region):
    """Resize(size) then CenterCrop(crop_size) as one region decode: the kept window's source box,
    widened by the filter's support, is decoded and resized on the full resize's pixel grid."""

    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)

    def __init__(self, size: Any, crop_size: Any, **kwargs: Any):
        super().__init__(size, **kwargs)
        self.crop_size = _setup_size(crop_size)

    def _window(self, img: Any) -> Optional[Tuple[Tuple[int, int], Box]]:
        return resize_crop_window(_size_of(img), self.size, self.crop_size, self.max_size)

    def box(self, img: Any) -> Optional[Box]:
        """The source box decoded for `img`, or None when the centre crop would pad."""
        window = self._window(img)
        return None if window is None else source_region(_size_of(img), *window, self.interpolation)

    def _forward(self, img: Any, pad: Any) -> torch.Tensor:
        window = self._window(img)
        if window is None:  # the crop is larger than the resized image: the transforms' own padding
            return pad(self._whole(img))
        image = _size_of(img)
        source = source_region(image, *window, self.interpolation)
        region = self._region(img, source)
        origin = source[:2]
        if region is None:  # the whole decode, read on the same grid
            region, origin = self._whole(img), (0, 0)
        return resize_window(region, origin, image, *window, self.interpolation)


class RegionResizeCenterCrop(_RegionResizeCenterCrop, v1.Resize):
    """torchvision.transforms.Resize then CenterCrop(crop_size), decoding only the region they keep."""

    def forward(self, img):
        return self._forward(img, lambda t: v1.CenterCrop(self.crop_size)(v1.Resize.forward(self, t)))


class RegionResizeCenterCropV2(_RegionResizeCenterCrop, v2.Resize):
    """torchvision.transforms.v2.Resize then CenterCrop(crop_size), decoding only the region they keep."""

    def forward(self, *inputs):
        img = inputs[0] if len(inputs) == 1 else None
        if img is None:
            return v2.CenterCrop(self.crop_size)(super().forward(*(self._whole(i) for i in inputs)))
        return self._forward(img, lambda t: v2.CenterCrop(self.crop_size)(v2.Resize.forward(self, t)))


def _setup_size(size: Any) -> Tuple[int, int]:
    """CenterCrop's size as (h, w): an int is a square."""
    return (size, size) if isinstance(size, int) else (tuple(size) * 2)[:2] if len(size) == 1 else tuple(size)
