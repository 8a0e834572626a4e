"""The seed chain's ConvertColor (RGB to YUV) and Scale, per sample and as batch forms.

The batch forms compute the same numbers on a whole [B, 3, H, W] batch at once, so a
chain can move them out of the per-sample transforms and into the collate (the seed's
step 4: one batched matmul per batch instead of one matmul per sample).
"""

import torch

from pipebench.pipeline.movement import TENSOR_ONLY, Movement

# RGB to YUV (BT.601 full range, as in JPEG/JFIF): yuv = RGB_TO_YUV_MATRIX @ rgb + YUV_OFFSET,
# with rgb in [0, 255]. Tuples, so the module holds nothing mutable.
RGB_TO_YUV_MATRIX = (
    (0.299, 0.587, 0.114),
    (-0.16874, -0.33126, 0.5),
    (0.5, -0.41869, -0.08131),
)
YUV_OFFSET = (0.0, 128.0, 128.0)


def _check_shape(transform: object, img: torch.Tensor, ndim: int, rgb: bool) -> None:
    """Raise ValueError unless ``img`` has ``ndim`` dims ([C, H, W] or [B, C, H, W]) and, if
    ``rgb``, three channels: a misplaced per-sample or batch transform fails with a clear line."""
    if img.ndim != ndim or (rgb and img.shape[-3] != 3):
        dims = ["B"] * (ndim - 3) + ["3" if rgb else "C", "H", "W"]
        raise ValueError(f"{type(transform).__name__}: expected a [{', '.join(dims)}] tensor, got shape {tuple(img.shape)}")


class _NoArgs:
    """Base for the argument-free transforms here: gives them a ``Name()`` repr."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _YUVParams(_NoArgs):
    """Holds the colour matrix and offset as float32 tensors, built once per instance."""

    def __init__(self):
        self.matrix = torch.tensor(RGB_TO_YUV_MATRIX, dtype=torch.float32)
        self.offset = torch.tensor(YUV_OFFSET, dtype=torch.float32)


class BatchConvertColor(_YUVParams):
    """RGB to YUV for a [B, 3, H, W] batch as one ``torch.bmm``; returns float32."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        _check_shape(self, batch, ndim=4, rgb=True)
        size, _, height, width = batch.shape
        pixels = batch.reshape(size, 3, height * width).to(torch.float32)
        matrix = self.matrix.to(batch.device).expand(size, 3, 3)
        offset = self.offset.to(batch.device).view(1, 3, 1)
        return (torch.bmm(matrix, pixels) + offset).view(size, 3, height, width)


class ConvertColor(_YUVParams):
    """RGB to YUV for one [3, H, W] image (uint8 or float); returns float32."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, batch_form=BatchConvertColor, casts=True)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        _check_shape(self, img, ndim=3, rgb=True)
        _, height, width = img.shape
        pixels = img.reshape(3, height * width).to(torch.float32)
        return (self.matrix @ pixels + self.offset.view(3, 1)).view(3, height, width)


def _scale(img: torch.Tensor) -> torch.Tensor:
    """Pixel values in [0, 255] to float32 in [0, 1]; never in place."""
    return img.to(torch.float32) / 255.0


class BatchScale(_NoArgs):
    """Divide a [B, C, H, W] batch by 255, giving float32 in [0, 1]."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        _check_shape(self, batch, ndim=4, rgb=False)
        return _scale(batch)


class Scale(_NoArgs):
    """Divide one [C, H, W] image by 255, giving float32 in [0, 1]."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, batch_form=BatchScale, casts=True)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        _check_shape(self, img, ndim=3, rgb=False)
        return _scale(img)

