"""A user's own transforms for the explore tests: some declare how they may move, some lie about it,
some declare nothing. Importable as `movable` (the tests folder is on sys.path)."""

import torch

from pipebench.pipeline.movement import BOTH, TENSOR_ONLY, Movement


class TensorCrop:
    """A top-left crop that only handles tensors."""

    movement = Movement(accepts=TENSOR_ONLY, crop=True)

    def __init__(self, size: int):
        self.size = size

    def __call__(self, img):
        return img[..., :self.size, :self.size]


class Undeclared:
    """Adds one; declares nothing, so it never moves and nothing moves past it."""

    def __call__(self, img):
        return img + 1


class Double:
    """Pointwise, declared: a crop may move ahead of it."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True)

    def __call__(self, img):
        return img.to(torch.float32) * 2


class AddNoise:
    """Pointwise random: draws one normal value a pixel, so its draw depends on the image size."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, random=True)

    def __call__(self, img):
        img = img.to(torch.float32)
        return img + torch.randn(img.shape)


class LoudNoise:
    """Lies: declared pointwise, but its noise grows with the image size, so a crop moved ahead of it
    changes the distribution."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, random=True)

    def __call__(self, img):
        img = img.to(torch.float32)
        return img + torch.randn(img.shape) * img[0].numel() / 64


class SubtractMean:
    """Lies: declared pointwise, but subtracts the image mean, which a crop changes."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True)

    def __call__(self, img):
        img = img.to(torch.float32)
        return img - img.mean()


class BatchRandomGain:
    """RandomGain for a batch: one draw for the whole batch."""

    def __call__(self, batch):
        return batch.to(torch.float32) * (0.5 + torch.rand(()))


class RandomGain:
    """Multiplies a sample by a random gain in [0.5, 1.5); its batch form draws once per batch."""

    movement = Movement(accepts=TENSOR_ONLY, pointwise=True, random=True, batch_form=BatchRandomGain)

    def __call__(self, img):
        return img.to(torch.float32) * (0.5 + torch.rand(()))


class SelfFast:
    """Declares itself as its own fast form: the 'fast' variant is the same chain and must be dropped."""

    movement = Movement(accepts=BOTH, pointwise=True, fast_form="movable.SelfFast")

    def __call__(self, img):
        return img


class NotAMovement:
    movement = {"crop": True}

    def __call__(self, img):
        return img
