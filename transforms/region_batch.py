"""The region decode split at the host-to-device copy (the `gpu_region_decode` move).

In the worker, a Read* form of a region crop (pipebench.transforms.region) draws the crop's box
from the lazily opened JPEG's header with the crop's own sampler, as the region form does, and
returns the file's bytes with the box, undecoded. default_collate makes of them
{"jpeg": [bytes, ...], "box": int64 [B, 4]}, which the copy leaves as it is. After the copy,
BatchRegionDecode decodes every box of the batch in one call to nvImageCodec's decoder on the
consumer's device (its GPU backends, nvJPEG, on CUDA; its CPU backend on the host CPU, where the
move is checked but not measured), resizes the regions when the crop was a RandomResizedCrop
(torchvision's tensor kernel, on the device) and stacks them into one uint8 [B, 3, h, w] batch.

A region nvImageCodec does not take (CMYK, 12-bit) is decoded whole with decode_jpeg on the
device and cropped to its box. A crop that may pad (RandomCrop's `padding` / `pad_if_needed`) is
refused when explore plans the move; one that pads anyway (a CenterCrop larger than an image) has
no box to decode: the worker raises, naming it, and the bad-sample policy counts it.
"""

from typing import Any, Dict, Optional, Sequence, Union

import torch
import torchvision.transforms.v2 as v2

from pipebench.pipeline.movement import PIL_ONLY, TENSOR, Movement
from pipebench.transforms.decode import decode_rgb, jpeg_bytes
from pipebench.transforms.region import (
    RegionCenterCrop,
    RegionCenterCropV2,
    RegionRandomCrop,
    RegionRandomCropV2,
    RegionRandomResizedCrop,
    RegionRandomResizedCropV2,
)
from pipebench.transforms.region_codec import RegionCodec

# The keys of one sample the worker gives, and of the collated batch BatchRegionDecode takes.
JPEG_KEY = "jpeg"
BOX_KEY = "box"


class _ReadRegion:
    """The worker's half: the JPEG's bytes and the box the crop draws from its header, undecoded."""

    # It draws the crop's box, so it is random as the crop is (CenterCrop's forms override this).
    movement = Movement(accepts=PIL_ONLY, random=True)

    def forward(self, *inputs: Any) -> Dict[str, Any]:
        img = inputs[0]
        box = self.box(img)
        data = jpeg_bytes(img)
        if box is None or data is None:
            why = "the crop would pad this image" if box is None else "the sample is not an undecoded JPEG file"
            raise ValueError(f"{type(self).__name__}: no region to decode after the copy: {why}")
        return {JPEG_KEY: data, BOX_KEY: torch.tensor(box, dtype=torch.int64)}


class ReadRegionRandomCrop(_ReadRegion, RegionRandomCrop):
    """torchvision.transforms.RandomCrop's box and the JPEG's bytes."""


class ReadRegionRandomCropV2(_ReadRegion, RegionRandomCropV2):
    """torchvision.transforms.v2.RandomCrop's box and the JPEG's bytes."""


class ReadRegionCenterCrop(_ReadRegion, RegionCenterCrop):
    """torchvision.transforms.CenterCrop's box and the JPEG's bytes."""

    movement = Movement(accepts=PIL_ONLY)


class ReadRegionCenterCropV2(_ReadRegion, RegionCenterCropV2):
    """torchvision.transforms.v2.CenterCrop's box and the JPEG's bytes."""

    movement = Movement(accepts=PIL_ONLY)


class ReadRegionRandomResizedCrop(_ReadRegion, RegionRandomResizedCrop):
    """torchvision.transforms.RandomResizedCrop's box and the JPEG's bytes (BatchRegionDecode resizes)."""


class ReadRegionRandomResizedCropV2(_ReadRegion, RegionRandomResizedCropV2):
    """torchvision.transforms.v2.RandomResizedCrop's box and the JPEG's bytes (BatchRegionDecode resizes)."""


class BatchRegionDecode:
    """Decode a collated batch of (JPEG bytes, box) in one nvImageCodec call on `device`; with a
    `size`, resize each region to it (RandomResizedCrop's resize); returns uint8 [B, 3, h, w] there."""

    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)

    def __init__(self, device: str = "cuda", size: Optional[Union[int, Sequence[int]]] = None,
                 interpolation: Any = v2.InterpolationMode.BILINEAR, antialias: Optional[bool] = True):
        self.device = device
        self.size = None if size is None else [int(size)] * 2 if isinstance(size, (int, float)) else list(size)
        # A config may name the mode as a string ("bilinear"); the kernel takes the enum.
        self.interpolation = v2.InterpolationMode(interpolation) if isinstance(interpolation, str) else interpolation
        self.antialias = antialias
        self._codec = RegionCodec(device)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_codec": RegionCodec(self.device)}  # each process makes its own decoder

    def __call__(self, batch: Dict[str, Any]) -> torch.Tensor:
        if not isinstance(batch, dict) or JPEG_KEY not in batch or BOX_KEY not in batch:
            raise ValueError(f"{type(self).__name__}: expected the collated Read* region batch "
                             f"({{{JPEG_KEY!r}: [bytes], {BOX_KEY!r}: [B, 4]}}), got {type(batch).__name__}")
        boxes = [tuple(int(v) for v in box) for box in batch[BOX_KEY].tolist()]
        items = list(zip(batch[JPEG_KEY], boxes))
        regions = [region if region is not None else self._whole_then_crop(data, box)
                   for region, (data, box) in zip(self._codec.decode_batch(items), items)]
        if self.size is not None:
            regions = [v2.functional.resize(r, self.size, interpolation=self.interpolation,
                                            antialias=self.antialias) for r in regions]
        return torch.stack(regions)

    def _whole_then_crop(self, data: bytes, box: Sequence[int]) -> torch.Tensor:
        """The fallback for a region the codec does not take: decode_jpeg on the device, then the box."""
        top, left, height, width = box
        whole = decode_rgb(torch.frombuffer(bytearray(data), dtype=torch.uint8), self.device)
        return whole[..., top:top + height, left:left + width]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, size={self.size})"

