"""ToTensor's float conversion on its own: a uint8 [..., C, H, W] tensor to float32 in [0, 1].

On a tensor decoded straight from the JPEG (torchvision.io.decode_jpeg) it finishes what ToTensor
does to a PIL image, with the same arithmetic (to float32, then divide by 255), so the values are
identical; on a collated uint8 batch it is the late cast: the batch crosses the worker boundary
as uint8, a quarter of the bytes.
"""

import torch

from pipebench.pipeline.movement import TENSOR_ONLY, Movement

# The largest uint8 value: ToTensor divides by it.
UINT8_MAX = 255


class ToFloat:
    """uint8 -> float32 / 255, per sample or on a batch (its own batch form)."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True, batch_form="pipebench.transforms.cast.ToFloat")

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).div(UINT8_MAX)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NormalizeUint8:
    """The float conversion and Normalize fused: uint8 [..., C, H, W] -> (x / 255 - mean) / std as one
    multiply-add (x * 1/(255·std) - mean/std), reading the uint8 pixels once instead of making
    and re-reading a float copy. Equal to the two steps within float rounding. Per sample or on a
    batch (its own batch form)."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, casts=True,
                        batch_form="pipebench.transforms.cast.NormalizeUint8")

    def __init__(self, mean, std):
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        std_t = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        self.scale = 1.0 / (UINT8_MAX * std_t)
        self.shift = -torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1) / std_t

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift, image, self.scale)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"
