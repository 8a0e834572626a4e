"""Every tensor-capable torchvision step rides the tensor path: capability read from the library (every
v2 Transform; a v1 nn.Module with a v2 namesake), not a hand list; the guard judges each as before."""

import pytest

from pipebench.explore.chain import TENSOR_PATH, Chain, SampleSource
from pipebench.explore.equivalence import SAME_DISTRIBUTION, check, is_equivalent
from pipebench.explore.variants import explore
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.pipeline.movement import declared_movement, library_tensor_form

V1, V2 = "torchvision.transforms.", "torchvision.transforms.v2."
STEPS = ("ColorJitter", "RandAugment", "TrivialAugmentWide", "AutoAugment", "AugMix", "RandomErasing",
         "RandomAffine", "RandomPerspective", "RandomRotation", "GaussianBlur", "Grayscale")


@pytest.mark.parametrize("namespace", [V1, V2])
@pytest.mark.parametrize("name", STEPS)
def test_the_library_says_which_steps_take_tensors(namespace, name):
    movement = declared_movement({"_target_": namespace + name, "kernel_size": 3, "degrees": 10})
    assert movement is not None and movement.tensor_form == V2 + name


@pytest.mark.parametrize("target", [V1 + "ToTensor", V1 + "PILToTensor", V1 + "Lambda", V2 + "Lambda",
                                    V1 + "RandomApply", V2 + "Compose", "torchvision.transforms.functional.crop"])
def test_conversions_containers_and_plain_classes_get_no_tensor_form_from_the_library(target):
    assert library_tensor_form(target) is None


JITTER = ({"_target_": V2 + "RandomResizedCrop", "size": 48}, {"_target_": V2 + "ColorJitter", "brightness": 0.4,
                                                                 "contrast": 0.4, "saturation": 0.4},
          {"_target_": V2 + "PILToTensor"})


@pytest.fixture
def fetch(tmp_path):
    dataset = SyntheticJpegDataset(length=8, num_images=4, width=120, height=90, cache_dir=tmp_path)
    return lambda n: [dataset[i % len(dataset)][0] for i in range(n)]


@pytest.mark.slow
def test_colorjitter_rides_the_tensor_path_and_the_guard_judges_it(fetch):
    found = explore("jitter", Chain(JITTER), source=SampleSource.of(fetch(1)[0]), region_problem="")
    moved = next(v for v in found.variants if v.moves == (TENSOR_PATH,))
    assert [n["_target_"] for n in moved.chain.per_sample][2] == V2 + "ColorJitter"
    verdict = check(found.base.chain, moved, fetch, seed=0)
    assert is_equivalent(verdict.verdict), verdict.detail
    # Beyond the pixel bound, the random colour step's distribution decides, not a bare "not equivalent".
    strict = check(found.base.chain, moved, fetch, seed=0, max_pixel_diff=0)
    if strict.max_abs_diff:
        assert strict.verdict == SAME_DISTRIBUTION and "distribution decides" in strict.detail, strict.detail
