"""RandomCrop for a batch: one window a sample, drawn exactly as torchvision's RandomCrop draws it.

Used after a batched decode (the images arrive as a list, possibly of different sizes, on the
device), so the crop runs where the pixels are and the batch is stacked once cropped.
"""

from typing import Sequence, Union

import torch
from torchvision.transforms import RandomCrop

from pipebench.pipeline.movement import TENSOR_ONLY, Movement


class BatchRandomCrop:
    """Crop each [C, H, W] image of a list (or [B, C, H, W] batch) to `size` with its own random
    window (RandomCrop.get_params, the global torch RNG, one draw a sample); returns [B, C, h, w]."""

    movement = Movement(accepts=TENSOR_ONLY, crop=True, random=True)

    def __init__(self, size: Union[int, Sequence[int]]):
        self.size = (int(size), int(size)) if isinstance(size, (int, float)) else tuple(int(s) for s in size)

    def __call__(self, images: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
        height, width = self.size
        crops = []
        for img in images:
            top, left, _, _ = RandomCrop.get_params(img, (height, width))
            crops.append(img[..., top:top + height, left:left + width])
        return torch.stack(crops)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"
