"""Tests of the transform catalogue against independent computations on small inputs."""

import pickle
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import PILToTensor, RandomCrop

from pipebench.pipeline.movement import target_of
from pipebench.transforms.color import (
    BatchConvertColor,
    BatchScale,
    ConvertColor,
    Scale,
)
from pipebench.transforms.mask import FastRandomMask, RandomMask
from pipebench.transforms.synthetic import BusyWait, Sleep

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone


def reference_dilate(mask: np.ndarray) -> np.ndarray:
    """Cross dilation by explicit loops: a pixel is set if it or an in-bounds 4-neighbour is."""
    height, width = mask.shape
    out = np.zeros_like(mask, dtype=bool)
    for y in range(height):
        for x in range(width):
            for dy, dx in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
                ny, nx = y + dy, x + dx
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx]:
                    out[y, x] = True
    return out


DILATIONS = [RandomMask.dilate, FastRandomMask.dilate]


# --- mask -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dilate", DILATIONS, ids=["convolve2d", "bool_ops"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (2, 2), (5, 8), (13, 9)])
@pytest.mark.parametrize("density", [0.05, 0.3, 0.7])
def test_dilation_matches_reference_on_random_masks(dilate, shape, density):
    rng = np.random.default_rng([*shape, round(density * 100)])
    mask = rng.random(shape) < density
    got = dilate(torch.from_numpy(mask))
    assert got.dtype == torch.bool and got.shape == shape
    np.testing.assert_array_equal(got.numpy(), reference_dilate(mask))


@pytest.mark.parametrize("dilate", DILATIONS, ids=["convolve2d", "bool_ops"])
@pytest.mark.parametrize("pixel", [(0, 0), (0, 4), (3, 0), (3, 4), (0, 2), (1, 0), (3, 2), (1, 4), (1, 2)])
def test_dilation_of_single_pixel_at_corners_edges_and_centre(dilate, pixel):
    mask = np.zeros((4, 5), dtype=bool)
    mask[pixel] = True
    expected = np.zeros_like(mask)
    y, x = pixel
    for ny, nx in ((y, x), (y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
        if 0 <= ny < 4 and 0 <= nx < 5:
            expected[ny, nx] = True
    np.testing.assert_array_equal(dilate(torch.from_numpy(mask)).numpy(), expected)


def test_both_dilations_agree_on_large_random_masks():
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        mask = torch.rand(64, 97, generator=generator) < 0.2
        assert torch.equal(RandomMask.dilate(mask), FastRandomMask.dilate(mask))


@pytest.mark.parametrize("cls", [RandomMask, FastRandomMask])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_mask_zeroes_exactly_the_dilated_pixels_in_all_channels(cls, dtype):
    img = torch.randint(1, 256, (3, 11, 13), dtype=torch.uint8).to(dtype)  # no zeros to start with
    original = img.clone()
    torch.manual_seed(7)
    out = cls(ratio=0.2)(img)
    # Replay the same draw independently and dilate it with the loop reference.
    torch.manual_seed(7)
    masked = reference_dilate((torch.rand(11, 13) < 0.2).numpy())
    assert masked.any() and not masked.all()
    expected = np.where(masked[None], 0, original.numpy())
    assert out.dtype == dtype and out.shape == img.shape
    np.testing.assert_array_equal(out.numpy(), expected)
    assert torch.equal(img, original), "input was modified in place"


@pytest.mark.parametrize("cls", [RandomMask, FastRandomMask])
@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5])
def test_masked_share_matches_cross_dilation_expectation(cls, ratio):
    torch.manual_seed(3)
    img = torch.full((3, 256, 256), 200, dtype=torch.uint8)
    out = cls(ratio=ratio)(img)
    share = (out[0] == 0).double().mean().item()
    # Interior pixels are masked unless all 5 cross cells miss: 1 - (1 - r)^5 (edges slightly less).
    assert share == pytest.approx(1 - (1 - ratio) ** 5, abs=0.02)
    assert torch.equal(out[0] == 0, out[1] == 0) and torch.equal(out[0] == 0, out[2] == 0)


@pytest.mark.parametrize("cls", [RandomMask, FastRandomMask])
def test_mask_ratio_extremes(cls):
    img = torch.randint(1, 256, (3, 9, 9), dtype=torch.uint8)
    assert torch.equal(cls(ratio=0.0)(img), img)
    assert not cls(ratio=1.0)(img).any()


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_same_seed_gives_identical_slow_and_fast_outputs(seed):
    img = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8)
    torch.manual_seed(seed)
    slow = RandomMask(0.25)(img)
    torch.manual_seed(seed)
    fast = FastRandomMask(0.25)(img)
    assert torch.equal(slow, fast)
    # And the seed matters: another seed gives another mask.
    torch.manual_seed(seed + 1)
    assert not torch.equal(FastRandomMask(0.25)(img), fast)


@pytest.mark.parametrize("cls", [RandomMask, FastRandomMask])
@pytest.mark.parametrize("ratio", [-0.1, 1.01, float("nan"), "abc"])
def test_mask_rejects_bad_ratio(cls, ratio):
    with pytest.raises(ValueError):
        cls(ratio=ratio)


@pytest.mark.parametrize("cls", [RandomMask, FastRandomMask])
def test_mask_rejects_non_chw_input(cls):
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        cls()(torch.zeros(8, 8, dtype=torch.uint8))


# --- colour ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rgb, yuv",
    [
        ((255, 255, 255), (255.0, 128.0, 128.0)),
        ((0, 0, 0), (0.0, 128.0, 128.0)),
        # Red: (0.299*255, -0.16874*255 + 128, 0.5*255 + 128)
        ((255, 0, 0), (76.245, 84.9713, 255.5)),
        # Blue: (0.114*255, 0.5*255 + 128, -0.08131*255 + 128)
        ((0, 0, 255), (29.07, 255.5, 107.26595)),
    ],
    ids=["white", "black", "red", "blue"],
)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_convert_color_of_pure_colours(rgb, yuv, dtype):
    img = torch.tensor(rgb, dtype=dtype).view(3, 1, 1).expand(3, 2, 3)
    out = ConvertColor()(img)
    assert out.dtype == torch.float32 and out.shape == (3, 2, 3)
    expected = torch.tensor(yuv, dtype=torch.float32).view(3, 1, 1).expand(3, 2, 3)
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=0)


def test_convert_color_matches_float64_numpy_on_random_image():
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    matrix = np.array([[0.299, 0.587, 0.114], [-0.16874, -0.33126, 0.5], [0.5, -0.41869, -0.08131]])
    expected = np.einsum("ij,jhw->ihw", matrix, img.numpy().astype(np.float64)) + np.array([0, 128, 128])[:, None, None]
    np.testing.assert_allclose(ConvertColor()(img).numpy(), expected, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_batch_convert_color_agrees_with_per_sample(dtype):
    batch = torch.randint(0, 256, (4, 3, 6, 5), dtype=torch.uint8).to(dtype)
    out = BatchConvertColor()(batch)
    per_sample = torch.stack([ConvertColor()(img) for img in batch])
    assert out.dtype == torch.float32 and out.shape == batch.shape
    torch.testing.assert_close(out, per_sample)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_scale_and_batch_scale(dtype):
    batch = torch.randint(0, 256, (4, 3, 6, 5), dtype=torch.uint8).to(dtype)
    original = batch.clone()
    expected = torch.from_numpy(batch.numpy().astype(np.float64) / 255.0).float()
    out = BatchScale()(batch)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.stack([Scale()(img) for img in batch]), out)
    assert torch.equal(batch, original), "input was modified in place"


@pytest.mark.parametrize(
    "transform, shape",
    [
        (ConvertColor(), (1, 4, 4)),
        (ConvertColor(), (2, 3, 4, 4)),
        (BatchConvertColor(), (3, 4, 4)),
        (BatchConvertColor(), (2, 4, 4, 4)),
        (Scale(), (2, 3, 4, 4)),
        (BatchScale(), (3, 4, 4)),
    ],
)
def test_colour_transforms_reject_wrong_layout(transform, shape):
    with pytest.raises(ValueError, match=type(transform).__name__):
        transform(torch.zeros(shape, dtype=torch.uint8))


def test_forms_are_linked_by_their_movement():
    assert ConvertColor.movement.batch_form == target_of(BatchConvertColor)
    assert Scale.movement.batch_form == target_of(BatchScale)
    assert RandomMask.movement.fast_form == target_of(FastRandomMask)


# --- synthetic ------------------------------------------------------------------------------


def test_busy_wait_spends_cpu_time_and_passes_input_through():
    sample = object()
    start = time.process_time()
    out = BusyWait(ms=20)(sample)
    spent = time.process_time() - start
    assert out is sample
    assert 0.020 <= spent < 0.060


def test_sleep_spends_wall_time_not_cpu():
    sample = object()
    wall, cpu = time.perf_counter(), time.process_time()
    out = Sleep(ms=20)(sample)
    assert out is sample
    assert time.perf_counter() - wall >= 0.020
    assert time.process_time() - cpu < 0.005


@pytest.mark.parametrize("cls", [BusyWait, Sleep])
@pytest.mark.parametrize("ms", [-1, float("inf"), float("nan"), "abc"])
def test_delays_reject_bad_ms(cls, ms):
    with pytest.raises(ValueError):
        cls(ms=ms)


# --- every transform crosses a process boundary ---------------------------------------------


@pytest.mark.parametrize(
    "transform",
    [RandomMask(0.3), FastRandomMask(0.3), ConvertColor(), BatchConvertColor(), Scale(), BatchScale(), BusyWait(1.5), Sleep(2)],
    ids=repr,
)
def test_transforms_pickle_round_trip(transform):
    clone = pickle.loads(pickle.dumps(transform))
    assert type(clone) is type(transform) and repr(clone) == repr(transform)
    # A repr names the class and its arguments.
    assert repr(transform).startswith(type(transform).__name__ + "(")


# --- reordering the seed chain --------------------------------------------------------------


@pytest.fixture(params=["in_memory", "lazy_jpeg"])
def pil_image(request, tmp_path):
    """A 300x411 RGB image: as built in memory, or as a JPEG opened lazily (decoded on first access)."""
    pixels = np.random.default_rng(0).integers(0, 256, (300, 411, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    if request.param == "in_memory":
        return image
    path = tmp_path / "sample.jpg"
    image.save(path, quality=90)
    return Image.open(path)


@pytest.mark.parametrize("seed", range(5))
def test_crop_first_equals_crop_after_to_tensor(pil_image, seed):
    crop = RandomCrop(256)
    torch.manual_seed(seed)
    crop_first = PILToTensor()(crop(pil_image))
    torch.manual_seed(seed)
    crop_after = crop(PILToTensor()(pil_image))
    assert crop_first.shape == crop_after.shape == (3, 256, 256)
    assert torch.equal(crop_first, crop_after)
    # Both orders leave torch's RNG in the same state, so the draws after them (RandomMask) match too.
    torch.manual_seed(seed)
    PILToTensor()(crop(pil_image))
    after_first = torch.rand(4)
    torch.manual_seed(seed)
    crop(PILToTensor()(pil_image))
    assert torch.equal(after_first, torch.rand(4))
