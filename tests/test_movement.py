"""The movement protocol: what the catalogue and torchvision declare, and how a user's class declares."""

import pytest

from pipebench.base.errors import ConfigError
from pipebench.pipeline.movement import (
    BOTH,
    PIL,
    PIL_ONLY,
    TENSOR,
    TENSOR_ONLY,
    TORCHVISION_MOVEMENT,
    Movement,
    accepted_kinds,
    declared_movement,
)
from pipebench.transforms.color import (
    BatchConvertColor,
    BatchScale,
    ConvertColor,
    Scale,
)
from pipebench.transforms.mask import FastRandomMask, RandomMask

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

MASK = "pipebench.transforms.mask"


def _declared(target, **kwargs):
    return declared_movement({"_target_": target, **kwargs})


def test_catalogue_declares_kinds_crops_randomness_and_forms():
    mask = _declared(f"{MASK}.RandomMask", ratio=0.25)
    assert mask == RandomMask.movement
    assert (mask.accepts, mask.random, mask.pointwise, mask.crop) == (TENSOR_ONLY, True, False, False)
    assert mask.fast_form == f"{MASK}.FastRandomMask" and mask.batch_form == f"{MASK}.BatchRandomMask"
    assert mask.batch_draws_per_sample, "the batch form draws one mask a sample"
    assert FastRandomMask.movement.fast_form == f"{MASK}.TorchRandomMask" and FastRandomMask.movement.random
    assert _declared("torchvision.transforms.PILToTensor").decoder_form == "pipebench.transforms.decode.DecodeJpeg"
    for cls, batch in ((ConvertColor, BatchConvertColor), (Scale, BatchScale)):
        assert cls.movement.pointwise and not cls.movement.random and cls.movement.accepts == TENSOR_ONLY
        assert cls.movement.casts and batch.movement.casts, "late_cast moves them after the copy"
        assert cls.movement.batch_form == f"{batch.__module__}.{batch.__qualname__}"
        assert batch.movement.pointwise
    assert _declared("pipebench.transforms.synthetic.BusyWait", ms=1).accepts == BOTH


def test_torchvision_registry_keyed_by_target():
    to_tensor = _declared("torchvision.transforms.PILToTensor")
    assert (to_tensor.accepts, to_tensor.returns, to_tensor.pointwise) == (PIL_ONLY, TENSOR, True)
    crop = _declared("torchvision.transforms.RandomCrop", size=256)
    assert crop.crop and crop.random and crop.accepts == BOTH
    assert _declared("torchvision.transforms.CenterCrop", size=8).crop
    resize = _declared("torchvision.transforms.Resize", size=8)
    assert not resize.crop and not resize.pointwise, "interpolation reads neighbours: not a crop"
    assert all(t.startswith("torchvision.transforms.") for t in TORCHVISION_MOVEMENT)


@pytest.mark.parametrize("padding", [{"padding": 4}, {"pad_if_needed": True}])
def test_padding_random_crop_is_not_a_pure_crop(padding):
    assert not _declared("torchvision.transforms.RandomCrop", size=8, **padding).crop


def test_user_classes_declare_or_stay_put():
    assert _declared("movable.TensorCrop", size=4) == Movement(accepts=TENSOR_ONLY, crop=True)
    assert _declared("movable.Undeclared") is None
    assert _declared("torchvision.transforms.Lambda") is None
    with pytest.raises(ConfigError, match="must be a pipebench.pipeline.movement.Movement"):
        _declared("movable.NotAMovement")
    with pytest.raises(ConfigError, match="cannot import"):
        _declared("no_such_module.Thing")


def test_movement_validates_and_normalises():
    assert Movement(accepts=PIL).accepts == PIL_ONLY
    assert Movement(accepts=[PIL, TENSOR], fast_form=Scale).fast_form == "pipebench.transforms.color.Scale"
    with pytest.raises(ValueError, match="accepts/returns"):
        Movement(accepts={"ndarray"})
    with pytest.raises(ValueError):
        Movement(accepts=())


def test_kinds_flow_through_a_chain():
    chain = [_declared("torchvision.transforms.PILToTensor"), _declared(f"{MASK}.RandomMask"), None,
             _declared("pipebench.transforms.synthetic.Sleep", ms=0), _declared("pipebench.transforms.color.Scale")]
    # After an undeclared step the kind is unknown until a declared step says what it accepts.
    assert list(accepted_kinds(chain)) == [PIL_ONLY, TENSOR_ONLY, TENSOR_ONLY, BOTH, TENSOR_ONLY]
