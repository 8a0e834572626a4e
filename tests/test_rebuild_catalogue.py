"""Every public torchvision transform class (v1 and v2), built with representative arguments, is rebuilt
from its attributes (export_nodes.object_node, what a recipe's steps and attach's export go through) into
a step that gives the same output for the same seeded input, or is reported as not rebuildable with its
reason; only the classes named below may be the latter."""

import enum
import inspect

import numpy as np
import pytest
import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision import tv_tensors

from pipebench.measure.setup import seed_everything
from pipebench.pipeline.export_nodes import object_node
from pipebench.pipeline.instantiate import instantiate_node

# Small images keep the walk to a second or two; LinearTransformation's matrix is (C*H*W)^2.
HEIGHT, WIDTH = 20, 24
TINY = (3, 4, 4)
BOXES = [[2, 3, 12, 15], [5, 1, 9, 18]]
KEY_POINTS = [[3, 4], [10, 12]]
SEED = 7

# Constructor arguments where the defaults do not build one, or where a non-default value is what a
# recipe writes (ColorJitter(0.4, 0.4, 0.4): hue is left to its default, which v1 stores as None).
ARGUMENTS = {
    "CenterCrop": dict(size=10), "FiveCrop": dict(size=10), "TenCrop": dict(size=10),
    "ColorJitter": dict(brightness=0.4, contrast=0.4, saturation=0.4),
    "ConvertImageDtype": dict(dtype=torch.float32), "ToDtype": dict(dtype=torch.float32, scale=True),
    "GaussianBlur": dict(kernel_size=3), "ElasticTransform": dict(alpha=20.0, sigma=2.0), "Normalize": dict(mean=[0.5, 0.4, 0.3], std=[0.2, 0.3, 0.25]),
    "Lambda": dict(lambd=torch.neg),
    "LinearTransformation": dict(transformation_matrix=torch.eye(int(np.prod(TINY))),
                                 mean_vector=torch.zeros(int(np.prod(TINY)))),
    "Pad": dict(padding=2, fill=3), "RandomAdjustSharpness": dict(sharpness_factor=2.0),
    "RandomAffine": dict(degrees=10, translate=(0.1, 0.1)), "RandomCrop": dict(size=10, padding=1),
    "RandomPosterize": dict(bits=4), "RandomResizedCrop": dict(size=10), "RandomRotation": dict(degrees=10),
    "RandomSolarize": dict(threshold=100.0), "Resize": dict(size=10), "JPEG": dict(quality=50),
    "ConvertBoundingBoxFormat": dict(format="CXCYWH"), "RandomResize": dict(min_size=8, max_size=12),
    "RandomShortestSize": dict(min_size=8), "ScaleJitter": dict(target_size=(16, 16)),
    "SetClampingMode": dict(clamping_mode="hard"), "UniformTemporalSubsample": dict(num_samples=2),
    "CutMix": dict(num_classes=4), "MixUp": dict(num_classes=4),
    "Compose": dict(transforms=[v1.CenterCrop(10)]), "RandomApply": dict(transforms=[v1.CenterCrop(10)]),
    "RandomChoice": dict(transforms=[v1.CenterCrop(10)]), "RandomOrder": dict(transforms=[v1.CenterCrop(10)]),
}
# The classes that stay the recipe's own object, and the words their reason must hold: each holds an
# object a config cannot write as a plain value (steps, a function, tensors).
NOT_REBUILT = {
    "Compose": "`transforms`", "RandomApply": "`transforms`", "RandomChoice": "`transforms`",
    "RandomOrder": "`transforms`", "Lambda": "`lambd`", "LinearTransformation": "`transformation_matrix`",
}
# Not a transform to run: v2's abstract base class.
BASES = ("Transform",)


def _pil() -> Image.Image:
    return Image.fromarray(np.random.default_rng(SEED).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))


def _image() -> tv_tensors.Image:
    return tv_tensors.Image(torch.from_numpy(np.asarray(_pil())).permute(2, 0, 1).contiguous())


def _sample() -> dict:
    """A detection sample: what the box and key-point transforms take."""
    size = (HEIGHT, WIDTH)
    return {"image": _image(), "labels": torch.tensor([1, 2]),
            "boxes": tv_tensors.BoundingBoxes(BOXES, format="XYXY", canvas_size=size),
            "keypoints": tv_tensors.KeyPoints(KEY_POINTS, canvas_size=size)}


def _input(namespace: str, name: str):
    """A small input the class takes: a PIL image for v1 (a tensor where it takes only tensors), a uint8
    tv_tensors.Image for v2, a batch, a video or a detection sample where the class needs one."""
    if name in ("Normalize", "RandomErasing", "GaussianNoise"):
        return _image().float() / 255
    if name == "LinearTransformation":
        return torch.rand(TINY, generator=torch.Generator().manual_seed(SEED))
    if name in ("CutMix", "MixUp"):
        return torch.stack([_image().float() / 255] * 4), torch.tensor([0, 1, 2, 3])
    if name == "UniformTemporalSubsample":
        return tv_tensors.Video(torch.stack([_image()] * 4))
    if "BoundingBox" in name or "KeyPoint" in name or name in ("RandomIoUCrop", "SetClampingMode"):
        return _sample()
    if namespace == "v2" and name not in ("PILToTensor", "ToTensor"):
        return _image()
    return _image() if name in ("ConvertImageDtype", "ToPILImage") else _pil()


def _comparable(value):
    """The value with PIL images as arrays and containers taken apart, for an exact comparison."""
    if isinstance(value, Image.Image):
        return ("PIL", value.mode, np.asarray(value).tolist())
    if isinstance(value, torch.Tensor):
        return (type(value).__name__, value.dtype, value.tolist())
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    return value


def _classes():
    for namespace, module in (("v1", v1), ("v2", v2)):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, enum.Enum) and name not in BASES:
                yield pytest.param(namespace, name, cls, id=f"{namespace}.{name}")


@pytest.mark.filterwarnings("ignore::UserWarning")  # v2.ToTensor and ConvertImageDtype are deprecated
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # and JPEG's encode and decode (torchvision 0.29)
@pytest.mark.parametrize("namespace, name, cls", list(_classes()))
def test_each_torchvision_transform_is_rebuilt_from_its_attributes_or_says_why_not(namespace, name, cls):
    step = cls(**ARGUMENTS.get(name, {}))
    rebuilt = object_node(step)
    if name in NOT_REBUILT:
        assert not rebuilt.ok and NOT_REBUILT[name] in rebuilt.why, rebuilt.why
        return
    assert rebuilt.ok, f"{name} is not rebuilt: {rebuilt.why}"
    again = instantiate_node(rebuilt.node, name)
    seed_everything(SEED)
    ours = again(_input(namespace, name))
    seed_everything(SEED)
    assert _comparable(ours) == _comparable(step(_input(namespace, name)))
