"""Equivalence verdicts, measured on real outputs: identical, close, same distribution, not equivalent, fails."""

import dataclasses
import io

import numpy as np
import pytest
import torch
from PIL import Image

from torchvision.transforms.functional import pil_to_tensor

from cuda_marks import NEEDS_CUDA
from pipebench.explore.equivalence import (
    ALPHA,
    FAILS,
    GPU_DECODER_CHROMA,
    IDENTICAL,
    NOT_EQUIVALENT,
    SAME_DISTRIBUTION,
    TEST_NAME,
    check,
    close_within,
    is_equivalent,
)
from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.transforms import decode
from pipebench.transforms.decode import DecodeJpeg
from pipebench.transforms.mask import BatchRandomMask, FastRandomMask, RandomMask, TorchRandomMask
from pipebench.explore.chain import GPU_DECODER, Chain, SampleSource, Variant
from pipebench.explore.variants import explore

TV = "torchvision.transforms"
# Small pictures keep the seed chain's checks fast; the crop still shrinks them.
PICTURE_HW = (48, 40)
CROP = 24


def _pictures(n):
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 256, (*PICTURE_HW, 3), dtype=np.uint8)) for _ in range(n)]


def _tensors(n):
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=generator) for _ in range(n)]


def _verdicts(name, chain, fetch):
    found = explore(name, chain, source=SampleSource.of(fetch(1)[0]))  # as explore reads its dataset
    return {v.name: check(found.base.chain, v, fetch, seed=0) for v in found.variants[1:]}


def _nodes(*items):
    return tuple({"_target_": t, **kwargs} for t, kwargs in items)


@pytest.mark.slow
def test_seed_chain_variants_come_out_identical():
    chain = Chain(_nodes((f"{TV}.PILToTensor", {}), (f"{TV}.RandomCrop", {"size": CROP}),
                         ("pipebench.transforms.mask.RandomMask", {"ratio": 0.25}),
                         ("pipebench.transforms.color.ConvertColor", {}), ("pipebench.transforms.color.Scale", {})))
    verdicts = _verdicts("seed", chain, _pictures)
    assert len(verdicts) == 10
    # Same seed: crop-first draws the same crop, the fast mask the same mask; bmm matches the matmul.
    assert verdicts["seed+crop_first"].verdict == IDENTICAL
    assert verdicts["seed+fast"].verdict == IDENTICAL, "the torch mask draws the same mask and zeroes the same pixels"
    assert verdicts["seed+late_cast"].verdict == IDENTICAL, "colour and scale after the copy give the same bits"
    # The batch mask draws every sample's mask at once: other values, the same distribution.
    for name in ("seed+per_batch", "seed+to_device", "seed+decoder+fast+to_device"):
        assert verdicts[name].verdict == SAME_DISTRIBUTION, (name, verdicts[name].detail)
    assert all(v.equivalent and v.max_abs_diff is not None for v in verdicts.values())


def test_random_pointwise_step_behind_a_moved_crop_gives_the_same_distribution():
    chain = Chain(_nodes(("movable.AddNoise", {}), (f"{TV}.RandomCrop", {"size": 16})))
    verdict = _verdicts("noisy", chain, _tensors)["noisy+crop_first"]
    assert verdict.verdict == SAME_DISTRIBUTION, verdict.detail
    assert verdict.test == TEST_NAME and verdict.p_value >= ALPHA
    assert "outputs differ" in verdict.detail and "Kolmogorov-Smirnov" in verdict.detail


def test_per_batch_random_transform_is_never_passed_off_as_the_same():
    chain = Chain(_nodes(("movable.RandomGain", {}),))
    verdict = _verdicts("gain", chain, _tensors)["gain+per_batch"]
    assert verdict.verdict == NOT_EQUIVALENT and not verdict.equivalent
    assert "RandomGain makes one random draw per batch instead of one per sample" in verdict.detail


def test_false_declarations_are_caught():
    # SubtractMean claims to be pointwise; cropping first changes the mean it subtracts.
    deterministic = _verdicts("mean", Chain(_nodes(("movable.SubtractMean", {}), (f"{TV}.CenterCrop", {"size": 8}))),
                              _tensors)["mean+crop_first"]
    assert deterministic.verdict == NOT_EQUIVALENT and "outputs differ" in deterministic.detail
    # LoudNoise claims to be pointwise; its noise shrinks with the crop, and the KS test sees it.
    loud = _verdicts("loud", Chain(_nodes(("movable.LoudNoise", {}), (f"{TV}.RandomCrop", {"size": 8}))),
                     _tensors)["loud+crop_first"]
    assert loud.verdict == NOT_EQUIVALENT and loud.p_value < ALPHA


def test_a_variant_that_raises_fails():
    base = Chain(_nodes((f"{TV}.PILToTensor", {}), ("movable.TensorCrop", {"size": 8})))
    assert [v.moves for v in explore("tensor_crop", base).variants] == [(), ("decoder",)], \
        "its declaration keeps the tensor-only crop in place"
    forced = Variant("forced", ("crop_first",), (), Chain(base.per_sample[::-1]))  # a PIL image cannot be sliced
    verdict = check(base, forced, _pictures, seed=0)
    assert verdict.verdict == FAILS and not verdict.equivalent
    assert verdict.detail.startswith("TypeError")


def _jpeg_files(folder, n, quality=90):
    """n lazily opened JPEG files, as the catalogue's datasets give them."""
    rng = np.random.default_rng(11)
    paths = []
    for k in range(n):
        path = folder / f"{k}.jpg"
        Image.fromarray(rng.integers(0, 256, (*PICTURE_HW, 3), dtype=np.uint8)).save(path, quality=quality)
        paths.append(path)
    return lambda count: [Image.open(paths[i % n]) for i in range(count)]


def test_decoder_verdict_reports_the_largest_pixel_difference(tmp_path, monkeypatch):
    fetch = _jpeg_files(tmp_path, 4)
    chain = Chain(_nodes((f"{TV}.PILToTensor", {}), (f"{TV}.RandomCrop", {"size": CROP})))
    decoded = next(v for v in explore("j", chain).variants if v.moves == ("decoder",))
    verdict = check(chain, decoded, fetch, seed=0)
    # PIL and torchvision both decode with libjpeg-turbo's default (islow IDCT, fancy upsampling).
    assert verdict.verdict == IDENTICAL and "decoded pixels: max |Δ| = 0" not in verdict.detail
    # A decoder off by two grey levels is `close (max |Δ| = 2)`; by 40, `not equivalent`.
    for offset, expected in ((2, close_within(2)), (40, NOT_EQUIVALENT)):
        monkeypatch.setattr(DecodeJpeg, "__call__", lambda self, img, o=offset: (pil_to_tensor(img).to(torch.int16) - o).clamp(0, 255).to(torch.uint8))
        verdict = check(chain, decoded, fetch, seed=0)
        assert verdict.verdict == expected, verdict.detail
        assert f"max |Δ| = {offset} grey levels" in verdict.detail
    assert is_equivalent(close_within(2)) and not is_equivalent(NOT_EQUIVALENT)


def test_torch_mask_forms_agree_with_the_seed_mask():
    img = torch.randint(0, 256, (3, 20, 24), dtype=torch.uint8)
    outputs = []
    for form in (RandomMask, FastRandomMask, TorchRandomMask):
        torch.manual_seed(5)
        outputs.append(form(0.25)(img))
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])
    torch.manual_seed(5)
    batch = BatchRandomMask(0.25)(img.unsqueeze(0).repeat(2, 1, 1, 1))
    assert batch.dtype == torch.uint8 and not torch.equal(batch[0], batch[1]), "one draw a sample"


SEED_CHAIN = _nodes((f"{TV}.PILToTensor", {}), (f"{TV}.RandomCrop", {"size": CROP}),
                    ("pipebench.transforms.mask.RandomMask", {"ratio": 0.25}),
                    ("pipebench.transforms.color.ConvertColor", {}), ("pipebench.transforms.color.Scale", {}))


@pytest.fixture
def synthetic_jpegs(tmp_path):
    """explore's fetch on the catalogue's synthetic JPEG dataset (small pictures: fast checks)."""
    dataset = SyntheticJpegDataset(length=16, num_images=4, width=PICTURE_HW[1], height=PICTURE_HW[0],
                                   cache_dir=tmp_path)
    return lambda n: [dataset[i % len(dataset)][0] for i in range(n)]


def _gpu_decoded(fetch, device="cpu"):
    found = explore("seed", Chain(SEED_CHAIN), source=SampleSource.of(fetch(1)[0]), device=device)
    return found.base.chain, next(v for v in found.variants if v.moves == (GPU_DECODER,))


@pytest.mark.slow
def test_gpu_decoder_is_the_same_distribution_on_the_synthetic_jpegs(synthetic_jpegs):
    base, variant = _gpu_decoded(synthetic_jpegs)
    verdict = check(base, variant, synthetic_jpegs, seed=0)
    # The crop windows and masks are drawn on the batch: the same distribution from another draw order.
    assert verdict.verdict == SAME_DISTRIBUTION, verdict.detail
    assert verdict.p_value >= ALPHA and "outputs differ" in verdict.detail
    # A device chain that masks twice as much is caught.
    doubled = tuple({**n, "ratio": 0.5} if "ratio" in n else n for n in variant.chain.on_device)
    wrong = dataclasses.replace(variant, chain=dataclasses.replace(variant.chain, on_device=doubled))
    assert check(base, wrong, synthetic_jpegs, seed=0).verdict == NOT_EQUIVALENT


def _off_by(offset, monkeypatch):
    """Make torchvision's decode (single image or batch) `offset` grey levels darker."""
    real = decode.decode_rgb

    def darker(data, device="cpu"):
        out = real(data, device)
        shift = [(t.to(torch.int16) - offset).clamp(0, 255).to(torch.uint8) for t in (out if isinstance(out, list)
                                                                                      else [out])]
        return shift if isinstance(out, list) else shift[0]
    monkeypatch.setattr(decode, "decode_rgb", darker)


def test_decoder_moves_hold_the_decoded_pixels_to_the_bound_on_lazily_read_files(synthetic_jpegs, monkeypatch):
    """The dataset's images are read from bytes that PIL drops once it decodes: each side of the pixel
    check gets its own image, else both sides would be PIL's decode."""
    base, variant = _gpu_decoded(synthetic_jpegs)
    decoded = next(v for v in explore("seed", base).variants if v.moves == ("decoder",))
    _off_by(40, monkeypatch)
    for moved in (decoded, variant):
        verdict = check(base, moved, synthetic_jpegs, seed=0)
        assert verdict.verdict == NOT_EQUIVALENT and "max |Δ| = 40 grey levels" in verdict.detail, verdict.detail
    within = check(base, variant, synthetic_jpegs, seed=0, max_pixel_diff=64)
    assert within.verdict == SAME_DISTRIBUTION and "max |Δ| = 40 grey levels" in within.detail, within.detail


def _re_encoded(fetch, subsampling):
    """`fetch`'s pictures saved again as JPEGs with `subsampling` (0: 4:4:4, 2: 4:2:0), lazily opened."""
    def again(n):
        files = []
        for image in fetch(n):
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, "JPEG", quality=90, subsampling=subsampling)
            files.append(Image.open(io.BytesIO(buffer.getvalue())))
        return files
    return again


def test_a_gpu_decoder_beyond_the_bound_on_cuda_names_nvjpegs_chroma_upsampling(synthetic_jpegs, monkeypatch):
    """The verdict's wording, checked without a GPU: the variant names cuda, the decode runs here."""
    base, variant = _gpu_decoded(synthetic_jpegs, device="cuda")
    real = decode.decode_rgb
    monkeypatch.setattr(decode, "decode_rgb", lambda data, device="cpu": [
        (t.to(torch.int16) - 40).clamp(0, 255).to(torch.uint8) for t in real(data, "cpu")])
    verdict = check(base, variant, synthetic_jpegs, seed=0)
    assert verdict.verdict == NOT_EQUIVALENT and verdict.detail.endswith(GPU_DECODER_CHROMA), verdict.detail
    on_host = check(*_gpu_decoded(synthetic_jpegs), synthetic_jpegs, seed=0)
    assert on_host.verdict == NOT_EQUIVALENT and GPU_DECODER_CHROMA not in on_host.detail, on_host.detail


@NEEDS_CUDA
def test_gpu_decoder_on_cuda_is_close_without_chroma_subsampling_and_says_why_with_it(synthetic_jpegs):
    """nvJPEG through torchvision: 4:4:4 files decode within the bound (the IDCTs' rounding); 4:2:0
    files differ at colour edges (its nearest-neighbour chroma upsampling), and the verdict says so."""
    full_chroma = _re_encoded(synthetic_jpegs, 0)
    base, variant = _gpu_decoded(full_chroma, device="cuda")
    assert variant.chain.on_device[0]["device"] == "cuda"
    verdict = check(base, variant, full_chroma, seed=0)
    assert verdict.equivalent and verdict.verdict != IDENTICAL, verdict.detail
    subsampled = _re_encoded(synthetic_jpegs, 2)
    verdict = check(base, variant, subsampled, seed=0)
    assert verdict.verdict == NOT_EQUIVALENT and GPU_DECODER_CHROMA in verdict.detail, verdict.detail
