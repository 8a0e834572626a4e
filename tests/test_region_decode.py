"""The region_decode move: crops that decode only their box of the JPEG (pipebench.transforms.region).

Fixed crops give the pixels of decode-then-crop; random crops draw their box with the crop's own
sampler under the same seed; JPEGs the region decoder does not take fall back or become bad samples;
a crop larger than the image keeps the transform's own behaviour; without nvImageCodec the move is
listed as not applied with the install command."""

import importlib.util
import io
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.explore.chain import FAST, REGION_DECODE, Chain, SampleSource
from pipebench.explore.equivalence import IDENTICAL, check
from pipebench.explore.variants import explore
from pipebench.measure.setup import seed_everything
from pipebench.pipeline.timed_chain import InstrumentedDataset, SampleFailure
from pipebench.transforms import region as region_module
from pipebench.transforms import region_codec
from pipebench.transforms.decode import DecodeJpeg
from pipebench.transforms.region import (
    RegionCenterCrop,
    RegionCenterCropV2,
    RegionRandomCrop,
    RegionRandomCropV2,
    RegionRandomResizedCrop,
    RegionRandomResizedCropV2,
    RegionResizeCenterCrop,
    RegionResizeCenterCropV2,
)

# Asked without importing it: a plain import would print nvImageCodec's notices (load_nvimgcodec does not).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("nvidia.nvimgcodec") is None,
                                reason="nvImageCodec is not installed (the decode extra)")
TV = "torchvision.transforms"
HW = (120, 160)
JPEG = SampleSource("JPEG", (HW[1], HW[0]))


def _jpeg(mode="RGB", **save):
    rng = np.random.default_rng(1)
    smooth = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(HW[::-1], Image.BICUBIC)
    noisy = np.clip(np.asarray(smooth, np.int16) + rng.normal(0, 8, (*HW, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noisy).convert(mode).save(buffer, "JPEG", **{"quality": 90, **save})
    return buffer.getvalue()


def _opened(data):
    return Image.open(io.BytesIO(data))


def _twelve_bit(data):
    """The JPEG with its frame header claiming 12-bit samples (what a 12-bit file's header says)."""
    at = data.index(b"\xff\xc0")
    return data[:at + 4] + bytes([12]) + data[at + 5:]


CASES = [
    (lambda: v1.CenterCrop(64), lambda: RegionCenterCrop(64), False),
    (lambda: v2.CenterCrop(64), lambda: RegionCenterCropV2(64), False),
    (lambda: v1.RandomCrop(64), lambda: RegionRandomCrop(64), False),
    (lambda: v2.RandomCrop(64), lambda: RegionRandomCropV2(64), False),
    (lambda: v1.RandomResizedCrop(48), lambda: RegionRandomResizedCrop(48), True),
    (lambda: v2.RandomResizedCrop(48), lambda: RegionRandomResizedCropV2(48), True),
]


def _reference(make, pil_first, data, seed):
    """decode-then-crop: the crop on the PIL image (then to a tensor), or on the decoded tensor."""
    seed_everything(seed)
    return pil_to_tensor(make()(_opened(data))) if pil_first else make()(pil_to_tensor(_opened(data).convert("RGB")))


@pytest.mark.parametrize("make, region, pil_first", CASES)
def test_region_equals_decode_then_crop_under_the_same_seed(make, region, pil_first):
    data = _jpeg()
    for seed in range(4):
        seed_everything(seed)
        got = region()(_opened(data))
        assert got.dtype == torch.uint8 and torch.equal(got, _reference(make, pil_first, data, seed))


def test_random_boxes_come_from_the_crops_own_sampler(monkeypatch):
    """The box is the one RandomCrop.get_params draws (same seed, same box); another seed, another box."""
    drawn = []
    real = v1.RandomCrop.get_params

    def spy(img, size):
        drawn.append(real(img, size))
        return drawn[-1]
    monkeypatch.setattr(v1.RandomCrop, "get_params", staticmethod(spy))
    data = _jpeg()
    seed_everything(5)
    first = RegionRandomCrop(64)(_opened(data))
    seed_everything(5)
    again = RegionRandomCrop(64)(_opened(data))
    seed_everything(6)
    RegionRandomCrop(64)(_opened(data))
    assert len(drawn) == 3 and drawn[0] == drawn[1] != drawn[2]
    top, left, h, w = drawn[0]
    assert torch.equal(first, again)
    assert torch.equal(first, pil_to_tensor(_opened(data).convert("RGB"))[:, top:top + h, left:left + w])


def test_the_region_decoder_is_used_and_decodes_less(monkeypatch):
    """Not a silent fallback: the codec is asked for exactly the box."""
    asked = []
    real = region_codec.RegionCodec.decode

    def spy(self, data, *box):
        asked.append(box)
        return real(self, data, *box)
    monkeypatch.setattr(region_codec.RegionCodec, "decode", spy)
    RegionCenterCrop(64)(_opened(_jpeg()))
    assert asked == [(28, 48, 64, 64)]


def _corrupt_scan(data):
    """A valid header over scan data overwritten with noise half way through."""
    half = len(data) // 2
    return data[:half] + bytes(np.random.default_rng(2).integers(0, 255, 200, dtype=np.uint8)) + data[half + 200:]


PLANTED = {"progressive": lambda: _jpeg(progressive=True), "cmyk": lambda: _jpeg("CMYK"),
           "truncated": lambda: _jpeg()[:len(_jpeg()) // 2], "corrupt": lambda: _corrupt_scan(_jpeg())}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_jpegs_it_does_not_take_fall_back_or_become_bad_samples(planted):
    data = PLANTED[planted]()

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return _opened(data), 0
    item = InstrumentedDataset(Files(), [RegionCenterCrop(64)])[0]
    if isinstance(item, SampleFailure):  # counted by the bad-sample policy, in one line
        assert planted in ("truncated", "corrupt") and "\n" not in item.message
        with pytest.raises(Exception):
            DecodeJpeg()(_opened(data))  # the full decode fails on it too
        return
    expected = DecodeJpeg()(_opened(data))[:, 28:92, 48:112]
    assert torch.equal(item[0], expected), "the full decode the move replaced, cropped to the same box"


def test_a_twelve_bit_jpeg_is_left_to_the_full_decode():
    """PIL cannot open one (the dataset's load fails: a bad sample); the region decoder declines it."""
    assert region_codec.RegionCodec().decode(_twelve_bit(_jpeg()), 0, 0, 16, 16) is None


def test_a_crop_larger_than_the_image_keeps_the_transforms_own_padding():
    data = _jpeg()
    for seed in range(3):
        seed_everything(seed)
        want = v1.RandomCrop(200, pad_if_needed=True)(pil_to_tensor(_opened(data)))
        seed_everything(seed)
        assert torch.equal(RegionRandomCrop(200, pad_if_needed=True)(_opened(data)), want)
    with pytest.raises(ValueError):  # no padding asked: RandomCrop's own error, not a decode error
        RegionRandomCrop(200)(_opened(data))
    assert torch.equal(RegionCenterCrop(200)(_opened(data)), v1.CenterCrop(200)(pil_to_tensor(_opened(data))))


def _seed_chain():
    return Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 64},
                  {"_target_": "pipebench.transforms.color.Scale"}))


def test_the_move_and_its_verdict_on_the_catalogue_jpegs(tmp_path):
    dataset = SyntheticJpegDataset(length=8, num_images=4, width=HW[1], height=HW[0], cache_dir=tmp_path)
    fetch = lambda n: [dataset[i % len(dataset)][0] for i in range(n)]  # noqa: E731
    found = explore("seed", _seed_chain(), source=SampleSource.of(fetch(1)[0]), region_problem="")
    moved = next(v for v in found.variants if v.moves == (REGION_DECODE,))
    assert [n["_target_"].rsplit(".", 1)[1] for n in moved.chain.per_sample] == ["RegionRandomCrop", "Scale"]
    verdict = check(found.base.chain, moved, fetch, seed=0)
    assert verdict.verdict == IDENTICAL, verdict.detail
    # A region decoder off by one grey level is caught by the pixel check.
    real = region_codec.RegionCodec.decode

    def brighter(self, *args):
        out = real(self, *args)
        return None if out is None else (out.to(torch.int16) + 9).clamp(0, 255).to(torch.uint8)
    try:
        region_codec.RegionCodec.decode = brighter
        assert not check(found.base.chain, moved, fetch, seed=0).equivalent
    finally:
        region_codec.RegionCodec.decode = real


def test_without_nvimgcodec_the_move_is_not_applied_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, region_codec.MODULE, None)  # import raises ImportError
    problem = region_codec.region_decode_problem()
    install = region_codec.install_command(region_codec.CPU)
    assert "not installed" in problem and install in problem and "[decode]" in install
    found = explore("seed", _seed_chain(), source=JPEG, region_problem=problem)
    assert not any(REGION_DECODE in v.moves for v in found.variants)
    line = next(r for r in found.not_applied if r.startswith(REGION_DECODE))
    assert install in line and "\n" not in line


def test_not_a_jpeg_dataset_skips_the_move():
    found = explore("seed", _seed_chain(), source=SampleSource("PNG", (64, 64)), region_problem="")
    assert any(r.startswith(f"{REGION_DECODE}: the dataset gives PNG") for r in found.not_applied)


@pytest.mark.slow
def test_loading_and_decoding_print_nothing():
    """nvImageCodec's missing-sub-library notices and decode errors never reach the console, with
    4 threads loading it at once; the console is back afterwards."""
    code = ("import os, threading\n"
            "from pipebench.transforms.region_codec import RegionCodec, region_decode_problem\n"
            "codec = RegionCodec()\n"
            "threads = [threading.Thread(target=codec.decode, args=(b'\\xff\\xd8' + b'x' * 99, 0, 0, 4, 4))\n"
            "           for _ in range(4)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "assert region_decode_problem() == ''\n"
            "assert RegionCodec().decode(b'\\xff\\xd8' + b'x' * 99, 0, 0, 4, 4) is None\n"
            "os.write(2, b'console')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "console", (done.stdout, done.stderr)


def test_region_forms_survive_pickling_for_spawned_workers():
    import pickle

    crop = RegionRandomCrop(64)
    crop(_opened(_jpeg()))  # makes its codec
    copy = pickle.loads(pickle.dumps(crop))
    seed_everything(0)
    a = copy(_opened(_jpeg()))
    seed_everything(0)
    assert torch.equal(a, crop(_opened(_jpeg())))
    assert region_module.REGION_MOVEMENT.returns == "tensor"


def _colour_blocks_jpeg():
    """8x8 blocks of flat random colour at 4:2:0: sharp chroma edges, where decoders' chroma upsampling
    differs (nvJPEG's default, nearest-neighbour, read up to 57 grey levels from PIL's on the H100)."""
    rng = np.random.default_rng(2)
    pixels = np.repeat(np.repeat(rng.integers(0, 256, (HW[0] // 8, HW[1] // 8, 3), dtype=np.uint8), 8, 0), 8, 1)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90, subsampling=2)
    return buffer.getvalue()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU backend needs CUDA")
def test_gpu_backend_decodes_the_same_region():
    problem = region_codec.region_decode_problem("cuda")
    if problem:  # nvJPEG is a wheel of its own: explore says so and leaves the move out
        pytest.skip(problem)
    for data in (_jpeg(), _colour_blocks_jpeg()):
        got = region_codec.RegionCodec("cuda").decode(data, 10, 20, 64, 64)
        assert got is not None and got.is_cuda
        worst = (got.cpu().to(torch.int16) - pil_to_tensor(_opened(data))[:, 10:74, 20:84]).abs().max()
        assert int(worst) <= region_codec.GPU_PIXEL_BOUND


def test_the_gpu_install_line_names_the_nvjpeg_wheel_of_torchs_cuda(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert region_codec.gpu_install_command() == "pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg"
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert region_codec.gpu_install_command() == "pip install nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12"


# Measured on the catalogue JPEGs (64 files, 533x800): Resize(256) then CenterCrop(224) as a region
# differs from the full decode, Resize and CenterCrop by at most 1 grey level (PIL's resample on the same
# grid, its taps' float positions rounding differently by the region's offset), v1 and v2, bilinear and bicubic.
RESIZE_CROP_MAX_DIFF = 1
EVAL = [(lambda **k: (v1.Resize(256, **k), v1.CenterCrop(224)), RegionResizeCenterCrop),
        (lambda **k: (v2.Resize(256, **k), v2.CenterCrop(224)), RegionResizeCenterCropV2)]


@pytest.mark.parametrize("make, region", EVAL)
@pytest.mark.parametrize("interpolation", [v1.InterpolationMode.BILINEAR, v1.InterpolationMode.BICUBIC])
def test_resize_center_crop_region_matches_the_full_decode_on_catalogue_jpegs(tmp_path, make, region,
                                                                                interpolation):
    dataset = SyntheticJpegDataset(length=6, num_images=6, cache_dir=tmp_path)
    form = region(256, 224, interpolation=interpolation)
    for index in range(len(dataset)):
        resize, crop = make(interpolation=interpolation)
        want = pil_to_tensor(crop(resize(dataset[index][0])))
        got = form(dataset[index][0])
        assert got.shape == want.shape == (3, 224, 224)
        assert (got.int() - want.int()).abs().max().item() <= RESIZE_CROP_MAX_DIFF
    top, left, height, width = form.box(dataset[0][0])
    assert height * width < 0.6 * 533 * 800, "only the kept window (and the filter's margin) is decoded"


def test_resize_center_crop_region_pads_as_the_transforms_do():
    data = _jpeg()  # 120x160: resized to 120x160, a 200 crop pads
    want = v1.CenterCrop(200)(v1.Resize(120)(pil_to_tensor(_opened(data))))
    assert torch.equal(RegionResizeCenterCrop(120, 200)(_opened(data)), want)


def _eval_chain(ns):
    return Chain(({"_target_": f"{ns}.Resize", "size": 256}, {"_target_": f"{ns}.CenterCrop", "size": 224},
                  {"_target_": f"{ns}.PILToTensor"}))


@pytest.mark.parametrize("ns, form", [(TV, "RegionResizeCenterCrop"), (f"{TV}.v2", "RegionResizeCenterCropV2")])
def test_the_move_takes_the_eval_chain_and_names_its_change(tmp_path, ns, form):
    dataset = SyntheticJpegDataset(length=8, num_images=4, cache_dir=tmp_path)
    fetch = lambda n: [dataset[i % len(dataset)][0] for i in range(n)]  # noqa: E731
    found = explore("eval", _eval_chain(ns), source=SampleSource.of(fetch(1)[0]), region_problem="")
    moved = next(v for v in found.variants if v.moves == (REGION_DECODE,))
    assert moved.chain.per_sample == ({"_target_": f"pipebench.transforms.region.{form}", "size": 256,
                                       "crop_size": 224},)
    assert moved.changes[0].startswith(f"decode only the source box Resize then CenterCrop keep ({form}")
    assert any(r.startswith("gpu_region_decode: Resize then CenterCrop") for r in found.not_applied)
    verdict = check(found.base.chain, moved, fetch, seed=0)
    assert verdict.equivalent and verdict.max_abs_diff is not None, verdict.detail
    assert verdict.verdict in (IDENTICAL, f"close (max |Δ| = {RESIZE_CROP_MAX_DIFF})"), verdict.detail


def test_resize_without_a_center_crop_is_refused_with_the_reason():
    chain = Chain(({"_target_": f"{TV}.Resize", "size": 256}, {"_target_": f"{TV}.RandomCrop", "size": 224},
                   {"_target_": f"{TV}.PILToTensor"}))
    found = explore("r", chain, source=JPEG, region_problem="")
    assert not any(REGION_DECODE in v.moves for v in found.variants)
    assert f"{REGION_DECODE}: Resize comes first and no CenterCrop follows it (RandomCrop follows it), so every " \
           "decoded pixel is kept" in found.not_applied


def test_the_ladder_measures_the_stack_without_the_region_decode_beside_it(tmp_path):
    """On the eval chain the region decode can cost more than a whole decode: the stack without it
    is a variant too, so explore can still find that stack's gain."""
    chain = Chain((*_eval_chain(TV).per_sample, {"_target_": "pipebench.transforms.mask.RandomMask", "ratio": 0.25},
                   {"_target_": "pipebench.transforms.color.Scale"}))
    dataset = SyntheticJpegDataset(length=8, num_images=4, cache_dir=tmp_path)
    found = explore("eval", chain, source=SampleSource.of(dataset[0][0]), region_problem="")
    stacks = [v.moves for v in found.variants if len(v.moves) > 1]
    assert (REGION_DECODE, FAST) in stacks, stacks
    assert any(moves[-1] == FAST and REGION_DECODE not in moves for moves in stacks), stacks
