"""The gpu_region_decode move: the crop's box drawn in the worker, only the boxes decoded after the copy.

On the CPU (no CUDA here) the move is generated with device cpu and checked there through
nvImageCodec's CPU backend; the CUDA test runs the GPU backend where there is one."""

import dataclasses
import importlib.util
import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms.functional import pil_to_tensor

from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.explore import variants
from pipebench.explore.chain import DEVICE_MOVES, GPU_REGION_DECODE, Chain, SampleSource
from pipebench.explore.decode_moves import BATCH_REGION_DECODE, gpu_region_decode
from pipebench.explore.equivalence import IDENTICAL, check
from pipebench.explore.variants import explore
from pipebench.measure.setup import seed_everything
from pipebench.pipeline.build import build_transforms
from pipebench.transforms.decode import DecodeJpeg
from pipebench.transforms.region import RegionRandomResizedCrop
from pipebench.transforms.region_batch import BatchRegionDecode, ReadRegionCenterCrop, ReadRegionRandomResizedCrop
from pipebench.transforms.region_codec import (
    GPU_PIXEL_BOUND,
    RegionCodec,
    RegionDecodeFailed,
    region_decode_problem,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nvidia.nvimgcodec") is None,
                                reason="nvImageCodec is not installed (the decode extra)")
TV = "torchvision.transforms"
HW = (120, 160)
JPEG = SampleSource("JPEG", (HW[1], HW[0]))


def _jpeg(seed=1):
    rng = np.random.default_rng(seed)
    smooth = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(HW[::-1], Image.BICUBIC)
    noisy = np.clip(np.asarray(smooth, np.int16) + rng.normal(0, 8, (*HW, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noisy).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _opened(data):
    return Image.open(io.BytesIO(data))


def _targets(nodes):
    return [n["_target_"].rsplit(".", 1)[1] for n in nodes]


def _yuv_mask():
    """The seed chain (conf/transform/yuv_mask.yaml)."""
    return Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 64},
                  {"_target_": "pipebench.transforms.mask.RandomMask", "ratio": 0.25},
                  {"_target_": "pipebench.transforms.color.ConvertColor"},
                  {"_target_": "pipebench.transforms.color.Scale"}))


def _imagenet(flip=False):
    """The ImageNet recipe (conf/transform/imagenet.yaml), its flip only when asked."""
    flips = ({"_target_": f"{TV}.RandomHorizontalFlip"},) if flip else ()
    return Chain(({"_target_": f"{TV}.RandomResizedCrop", "size": 48}, *flips, {"_target_": f"{TV}.ToTensor"},
                  {"_target_": f"{TV}.Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}))


def test_the_seed_chain_reads_bytes_and_boxes_in_the_worker_and_decodes_on_the_device():
    moved = gpu_region_decode(_yuv_mask(), JPEG, device="cpu")
    assert moved.changes, moved.reason
    assert _targets(moved.chain.per_sample) == ["ReadRegionRandomCrop"] and not moved.chain.per_batch
    assert moved.chain.on_device[0] == {"_target_": BATCH_REGION_DECODE, "device": "cpu"}
    assert _targets(moved.chain.on_device[1:]) == ["BatchRandomMask", "BatchConvertColor", "BatchScale"]
    found = explore("seed", _yuv_mask(), source=JPEG, region_problem="")
    variant = next(v for v in found.variants if v.moves == (GPU_REGION_DECODE,))
    assert variant.needs_device and GPU_REGION_DECODE in DEVICE_MOVES


def test_a_random_resized_crop_recipe_resizes_its_regions_on_the_device():
    moved = gpu_region_decode(_imagenet(), JPEG, device="cuda:0")
    assert moved.changes, moved.reason
    assert _targets(moved.chain.per_sample) == ["ReadRegionRandomResizedCrop"]
    decode = moved.chain.on_device[0]
    assert decode["device"] == "cuda:0" and decode["size"] == 48 and "pil_resize" not in moved.chain.per_sample[0]
    assert any("GPU backend" in c for c in moved.changes)
    assert len(moved.chain.on_device) > 1  # ToTensor's float scaling and Normalize follow on the device
    # The flip has no batch form that keeps one draw a sample: it cannot follow the decode there.
    refused = gpu_region_decode(_imagenet(flip=True), JPEG, device="cuda:0")
    assert not refused.changes and "RandomHorizontalFlip" in refused.reason


def test_a_chain_without_a_crop_first_is_refused_with_the_reason():
    chain = Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": "pipebench.transforms.color.Scale"},
                   {"_target_": f"{TV}.RandomCrop", "size": 64}))
    moved = gpu_region_decode(chain, JPEG, device="cpu")
    assert not moved.changes and moved.reason.startswith(f"{GPU_REGION_DECODE}: no crop with a region form")
    unavailable = gpu_region_decode(_yuv_mask(), JPEG, unavailable="nvImageCodec is not installed (pip ...)")
    assert unavailable.reason == f"{GPU_REGION_DECODE}: nvImageCodec is not installed (pip ...)"
    assert "the dataset gives PNG" in gpu_region_decode(_yuv_mask(), SampleSource("PNG", (64, 64))).reason


@pytest.mark.parametrize("padding", [{"pad_if_needed": True}, {"padding": 4}])
def test_a_crop_that_may_pad_is_refused_at_plan_time(padding):
    """Never a worker error at run time: a padded sample has no box in its file."""
    first, crop, *rest = _yuv_mask().per_sample
    moved = gpu_region_decode(Chain((first, {**crop, **padding}, *rest)), JPEG, device="cpu")
    assert not moved.changes and "may pad (padding / pad_if_needed)" in moved.reason, moved.reason


def _batch(per_sample, on_device, files, seed):
    seed_everything(seed)
    samples = [per_sample(_opened(data)) for data in files]
    batch = default_collate(samples)
    for step in on_device:
        batch = step(batch)
    return batch


def _center_crops(device):
    """(the move's CenterCrop(64) batch of four files on `device`, PIL's decode then the crop, the worker step)."""
    files = [_jpeg(s) for s in range(4)]
    chain = Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.CenterCrop", "size": 64}))
    moved = gpu_region_decode(chain, JPEG, device=device)
    read = build_transforms(moved.chain.per_sample, "transform.per_sample")[0]
    got = _batch(read, build_transforms(moved.chain.on_device, "transform.on_device"), files, 0)
    top, left = (HW[0] - 64) // 2, (HW[1] - 64) // 2
    want = torch.stack([pil_to_tensor(_opened(d))[:, top:top + 64, left:left + 64] for d in files])
    return got, want, read


def test_center_crop_regions_equal_decode_then_crop_on_the_cpu_path():
    got, want, read = _center_crops("cpu")
    assert got.dtype == torch.uint8 and torch.equal(got, want)
    assert isinstance(read, ReadRegionCenterCrop)


def test_random_boxes_come_from_the_crops_own_sampler_under_the_same_seed():
    data = _jpeg()
    seed_everything(3)
    want = RegionRandomResizedCrop(48, pil_resize=False)(_opened(data))
    seed_everything(3)
    sample = ReadRegionRandomResizedCrop(48)(_opened(data))
    got = BatchRegionDecode("cpu", size=48)(default_collate([sample]))[0]
    assert torch.equal(got, want)
    seed_everything(3)
    box = RegionRandomResizedCrop(48).get_params(_opened(data), (0.08, 1.0), (3 / 4, 4 / 3))
    assert tuple(sample["box"].tolist()) == tuple(box)


def test_the_verdict_on_the_catalogue_jpegs_and_pickling(tmp_path):
    dataset = SyntheticJpegDataset(length=8, num_images=4, width=HW[1], height=HW[0], cache_dir=tmp_path)
    fetch = lambda n: [dataset[i % len(dataset)][0] for i in range(n)]  # noqa: E731
    chain = Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 64},
                   {"_target_": "pipebench.transforms.color.Scale"}))
    found = explore("seed", chain, source=SampleSource.of(fetch(1)[0]), region_problem="")
    variant = next(v for v in found.variants if v.moves == (GPU_REGION_DECODE,))
    verdict = check(found.base.chain, variant, fetch, seed=0)
    assert verdict.verdict == IDENTICAL, verdict.detail
    decode = BatchRegionDecode("cpu")
    assert pickle.loads(pickle.dumps(decode)).device == "cpu"


def _no_fallback(self, data, box):
    raise AssertionError("a region was decoded whole: the codec did not decode it")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU backend needs CUDA")
def test_the_cuda_path_decodes_the_batch_of_regions_on_the_gpu(monkeypatch):
    problem = region_decode_problem("cuda")
    if problem:  # nvJPEG is a wheel of its own: explore says so and leaves the move out
        pytest.skip(problem)
    monkeypatch.setattr(BatchRegionDecode, "_whole_then_crop", _no_fallback)
    got, want, _ = _center_crops("cuda")
    assert got.is_cuda and got.shape == (4, 3, 64, 64)
    # nvJPEG's IDCT may differ from libjpeg-turbo's by a grey level or two (the guard's bound).
    assert int((got.cpu().to(torch.int16) - want.to(torch.int16)).abs().max()) <= GPU_PIXEL_BOUND


def test_explore_leaves_the_gpu_region_decode_out_where_the_gpu_backend_cannot_run(monkeypatch):
    """nvJPEG missing (a wheel of its own): the move is not applied, with the install line, instead of
    measuring decode_jpeg's whole-image fallback under the region decode's name."""
    chain = Chain(({"_target_": f"{TV}.PILToTensor"}, {"_target_": f"{TV}.RandomCrop", "size": 64}))
    asked = []

    def problem(device="cpu"):
        asked.append(device)
        return "" if device == "cpu" else "nvImageCodec's GPU backend (nvJPEG) does not decode a JPEG region here"
    monkeypatch.setattr(variants, "region_decode_problem", problem)
    found = explore("seed", chain, source=JPEG, device="cuda")
    assert asked == ["cpu", "cuda"]
    assert not [v for v in found.variants if GPU_REGION_DECODE in v.moves]
    assert any(r.startswith(f"{GPU_REGION_DECODE}: nvImageCodec's GPU backend") for r in found.not_applied)
    assert [v for v in found.variants if v.moves == ("region_decode",)]  # the CPU move still applies


def test_a_batch_whose_regions_all_come_back_empty_fails_instead_of_measuring_the_fallback():
    """The H100 host without nvJPEG: the GPU backend returned nothing for every region it took."""
    samples = [ReadRegionCenterCrop(64)(_opened(_jpeg(s))) for s in range(2)]
    decode = BatchRegionDecode("cpu")
    # This thread's decoder, as the codec made it, with a decode that returns nothing for every region.
    made = decode._codec._ready()
    broken = type("Broken", (), {"decode": lambda self, streams, **kw: [None] * len(streams)})()
    decode._codec._threads.decoder = dataclasses.replace(made, decoder=broken)
    with pytest.raises(RegionDecodeFailed, match=r"nvImageCodec on cpu decoded none of the batch's 2 JPEG regions"):
        decode(default_collate(samples))


def test_a_region_the_codec_does_not_take_is_decoded_whole_and_cropped():
    """A CMYK JPEG (left to the chain's own decoder by the region codec) in a batch of RGB ones."""
    buffer = io.BytesIO()
    _opened(_jpeg(5)).convert("CMYK").save(buffer, "JPEG", quality=90)
    files = [_jpeg(4), buffer.getvalue()]
    samples = [ReadRegionCenterCrop(64)(_opened(d)) for d in files]
    got = BatchRegionDecode("cpu")(default_collate(samples))
    top, left = (HW[0] - 64) // 2, (HW[1] - 64) // 2
    assert RegionCodec().decode(files[1], top, left, 64, 64) is None  # so the fallback decoded it
    want = DecodeJpeg()(_opened(files[1]))[:, top:top + 64, left:left + 64]
    assert got.shape == (2, 3, 64, 64) and torch.equal(got[1], want)
