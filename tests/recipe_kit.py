"""Recipe factories as training scripts write them: one function returning one Compose. Importable as
`recipe_kit` (the tests folder is on sys.path, and job processes get it through PYTHONPATH)."""

import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def build_v1(size: int = 224):
    """The ImageNet training recipe in torchvision.transforms (v1)."""
    return v1.Compose([v1.RandomResizedCrop(size), v1.RandomHorizontalFlip(), v1.ToTensor(), v1.Normalize(MEAN, STD)])


def build_v1_jitter(size: int = 224):
    """The training recipe timm's and many scripts' factories build, in v1: with ColorJitter(0.4, 0.4, 0.4),
    whose hue v1 keeps as None (the default 0 normalised), a value its constructor refuses back."""
    return v1.Compose([v1.RandomResizedCrop(size), v1.RandomHorizontalFlip(), v1.ColorJitter(0.4, 0.4, 0.4),
                       v1.ToTensor(), v1.Normalize(MEAN, STD)])


def build_v2(size: int = 224):
    """The timm-style recipe in torchvision.transforms.v2, with a ColorJitter."""
    return v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4, 0.4, 0.4),
                       v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


class Opaque:
    """A step whose arguments cannot be read back (it keeps none): stays the recipe's own object."""

    def __init__(self, gain: float):
        self._gain = gain

    def __call__(self, x):
        return x


def build_with_opaque():
    return v1.Compose([v1.CenterCrop(32), Opaque(2.0), v1.PILToTensor()])


def build_opaque_before_to_tensor():
    """An opaque step on the PIL image before ToTensor, the conversion with no decoder of its own."""
    return v1.Compose([v1.RandomResizedCrop(64), Opaque(2.0), v1.ToTensor()])


class NotARecipe:
    """Has a `transforms` attribute that is not a list of steps."""

    transforms = "resize then crop"

    def __call__(self, x):
        return x
