"""The seed chain's RandomMask, in its slow (convolve2d), fast (boolean ops) and torch forms.

The per-sample forms draw the same mask from torch's global RNG (float32 ``torch.rand``) and
differ only in how they dilate it and zero the pixels, so under the same ``torch.manual_seed``
they give identical outputs and a benchmark can swap one for the other without changing what
the pipeline computes. The batch form draws one mask a sample for the whole batch at once, on
the batch's device: the same distribution, from another order of draws.
"""

import numpy as np
import torch
from scipy.signal import convolve2d

from pipebench.pipeline.movement import TENSOR_ONLY, Movement

# The 4-neighbour cross that dilates the drawn mask: a pixel is masked when it or one
# of its up/down/left/right neighbours was drawn. Read-only, so it cannot be mutated.
CROSS_KERNEL = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], dtype=np.uint8)
CROSS_KERNEL.setflags(write=False)


class _CrossMask:
    """Shared part of both forms: validate the ratio, draw the mask, zero masked pixels.

    Subclasses supply ``dilate``, mapping a bool [H, W] tensor to its cross dilation.
    """

    def __init__(self, ratio: float = 0.25):
        ratio = float(ratio)
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"{type(self).__name__}: ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """Return a copy of the [C, H, W] image with the dilated mask zeroed in all channels."""
        if img.ndim != 3:
            raise ValueError(f"{type(self).__name__}: expected a [C, H, W] tensor, got shape {tuple(img.shape)}")
        height, width = img.shape[-2:]
        drawn = torch.rand(height, width) < self.ratio
        return img.masked_fill(self.dilate(drawn), 0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ratio={self.ratio})"


def cross_dilate(mask: torch.Tensor) -> torch.Tensor:
    """Cross dilation of a bool [..., H, W] tensor with torch boolean ops (pixels off the edge count as False)."""
    padded = torch.nn.functional.pad(mask, (1, 1, 1, 1))
    return (
        padded[..., 1:-1, 1:-1]  # centre
        | padded[..., :-2, 1:-1]  # up
        | padded[..., 2:, 1:-1]  # down
        | padded[..., 1:-1, :-2]  # left
        | padded[..., 1:-1, 2:]  # right
    )


class BatchRandomMask(_CrossMask):
    """RandomMask for a [B, C, H, W] batch on any device: one float32 ``torch.rand`` mask a sample,
    drawn for the whole batch at once, dilated by boolean ops and applied by multiplying with the
    inverted mask. Same distribution as the per-sample forms; other values under one seed."""

    movement = Movement(accepts=TENSOR_ONLY, random=True)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        if batch.ndim != 4:
            raise ValueError(f"{type(self).__name__}: expected a [B, C, H, W] tensor, got shape {tuple(batch.shape)}")
        size, _, height, width = batch.shape
        drawn = torch.rand(size, 1, height, width, device=batch.device) < self.ratio
        return batch * ~cross_dilate(drawn)


class TorchRandomMask(_CrossMask):
    """RandomMask with the dilation by boolean ops and the zeroing as a multiply by the inverted
    mask (cheaper than masked_fill's broadcast); the same draw, so the same outputs."""

    movement = Movement(accepts=TENSOR_ONLY, random=True, batch_form=BatchRandomMask, batch_draws_per_sample=True)
    dilate = staticmethod(cross_dilate)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if img.ndim != 3:
            raise ValueError(f"{type(self).__name__}: expected a [C, H, W] tensor, got shape {tuple(img.shape)}")
        height, width = img.shape[-2:]
        drawn = torch.rand(height, width) < self.ratio
        return img * ~cross_dilate(drawn)


class FastRandomMask(_CrossMask):
    """RandomMask with the dilation done by OR-ing the five shifted views of a padded mask."""

    # Tensor only; the dilation reads neighbours, so no crop may move ahead of it.
    movement = Movement(accepts=TENSOR_ONLY, random=True, fast_form=TorchRandomMask, batch_form=BatchRandomMask,
                        batch_draws_per_sample=True)
    dilate = staticmethod(cross_dilate)


class RandomMask(_CrossMask):
    """The seed's RandomMask: draw ``rand < ratio``, dilate with ``scipy.signal.convolve2d``, zero.

    Slow on purpose: it is the baseline the fast form is measured against.
    """

    movement = Movement(accepts=TENSOR_ONLY, random=True, fast_form=FastRandomMask, batch_form=BatchRandomMask,
                        batch_draws_per_sample=True)

    @staticmethod
    def dilate(mask: torch.Tensor) -> torch.Tensor:
        """Cross dilation of a bool [H, W] tensor via ``convolve2d(mode='same') > 0``."""
        return torch.from_numpy(convolve2d(mask.numpy(), CROSS_KERNEL, mode="same") > 0)
